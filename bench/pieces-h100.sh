#!/usr/bin/env bash
# Several conversations' turns in one step (issue 18's multi-turn bar with
# several clients): the pieces kernel (prefill.cu attn_prefill_pieces_*)
# checked, timed per step, and the turns measured over HTTP, in one call
# on the GPU machine. Build here and carry bin/device.tar.xz (with
# gguf/testdata left behind if the carry is tight) and, for the peer,
# .carry/llama-bin.* (bench/llamacpp-cuda.sh):
#
#   make device DEVICE_PKGS="kernels/gpu pipeline/model"
#   tar -C bin -cJf bin/device.tar.xz device
#
#   bench/pieces-h100.sh [tests] [step] [turns] [peer]
#
#   tests: prefill.cu's GPU tests (every kernel against the CPU, piece
#          invariance, the pieces kernel against each piece alone), the
#          paged attention ones, and the batched model's GPU tests
#   step:  TestGPUTurnStepBench on the 8B Q4_K_M file (forge gen): a
#          turn's step alone and after 2000 positions, four turns merged
#   turns: forge -v serve (its step log kept) measured by forge bench serve
#          --turns at 1 and 4 clients (CONVS conversations a client, 8)
#   peer:  the same turns against llama-server (-np 4) in the same call
#   gen:   forge bench gen -p 512 -n 128 -r 3 of each binary of SHORT_BINS
#   short: a resident model's first token for a 10-token prompt (16
#          requests, one client): forge -v serve with its step log (each
#          step's time and its ops' queueing) and a CPU profile (for each
#          binary of bin/device named in SHORT_BINS), then llama-server the
#          same way
#
# The CUDA objects of the sources as they are compile first
# (device-prelude.sh; $OUT/cuda-obj.tar for bench/kernels-gen.sh merge).
set -uo pipefail
. bench/device-prelude.sh bin/device.tar.xz pieces.txt
L8=/tmp/l8.gguf
LS=/tmp/llama/bin/llama-server
model() {
  [ -f $L8 ] || { $B/forge gen --preset llama3-8b --quant q4_k_m --valid-utf8 -o $L8 --progress plain >"$out/gen.txt" 2>&1; cat $L8 >/dev/null; }
}
turns() { # the target's flags
  $B/forge bench serve "$@" --clients 1,4 --turns 4 --history-tokens 2000 --turn-tokens 32 --max-tokens 32 --requests-per-client ${CONVS:-8}
}
for p in ${@:-tests step turns}; do
  s=$(date +%s)
  case $p in
  tests)
    (cd kernels/gpu && ../../$B/gpu.test -test.v -test.timeout 400s \
      -test.run 'TestPrefill|TestConformance/PagedAttention|TestPagedAttention|TestMMQBatchInvariant|TestLayoutStagingRing|TestRoPEAt|TestVendor|TestGEMM') >"$out/tests-gpu.txt" 2>&1
    echo "rc=$?" >>"$out/tests-gpu.txt"
    model
    (cd "$mdir" && "$OLDPWD/$B/model.test" -test.v -test.timeout 400s \
      -test.run 'TestGPUMergedPrompts|TestGPUBatchGraph|TestGPUGraphDecode|TestGPUSplit') >"$out/tests-model.txt" 2>&1
    echo "rc=$?" >>"$out/tests-model.txt" ;;
  step)
    model
    (cd "$mdir" && FORGE_BIG_MODEL=$L8 "$OLDPWD/$B/model.test" -test.v -test.timeout 300s -test.run TestGPUTurnStepBench \
      -test.cpuprofile "$out/step.prof") >"$out/step.txt" 2>&1
    echo "rc=$?" >>"$out/step.txt" ;;
  turns)
    model
    $B/forge -v serve -m l8=$L8 --device gpu --batch-seqs 16 --addr 127.0.0.1:8095 2>"$out/serve-log.txt" &
    spid=$!
    for _ in $(seq 1 240); do curl -sf http://127.0.0.1:8095/v1/models >/dev/null 2>&1 && break; sleep 0.5; done
    turns --url forge=http://127.0.0.1:8095 -m l8 >"$out/turns.txt" 2>&1
    echo "rc=$?" >>"$out/turns.txt"
    kill $spid; wait $spid 2>/dev/null ;;
  short)
    model
    for bin in ${SHORT_BINS:-forge}; do # e.g. SHORT_BINS="forge forge-old forge": builds side by side
      echo "== $bin" >>"$out/short.txt"
      $B/$bin -v --cpu-profile "$out/short-$bin.prof" serve -m l8=$L8 --device gpu --batch-seqs 64 --addr 127.0.0.1:8095 2>>"$out/short-log-$bin.txt" &
      spid=$!
      for _ in $(seq 1 240); do curl -sf http://127.0.0.1:8095/v1/models >/dev/null 2>&1 && break; sleep 0.5; done
      $B/forge bench serve --url forge=http://127.0.0.1:8095 -m l8 --clients 1 --prompt-tokens 10 --max-tokens 16 --requests-per-client 16 >>"$out/short.txt" 2>&1
      echo "rc=$?" >>"$out/short.txt"
      kill $spid; wait $spid 2>/dev/null
    done
    [ -x $LS ] || [ ! -f .carry/llama-bin.00 ] || bash bench/llamacpp-cuda.sh unpack >"$out/llama-unpack.txt" 2>&1
    [ -x $LS ] || { echo "no llama-server carried: forge alone" >>"$out/short.txt"; continue; }
    "$LS" -m $L8 -ngl 99 -fa on -np 16 -c 16384 --host 127.0.0.1 --port 8090 >"$out/llama-server.log" 2>&1 &
    lpid=$!
    for _ in $(seq 1 240); do curl -sf http://127.0.0.1:8090/health >/dev/null 2>&1 && break; sleep 0.5; done
    $B/forge bench serve -m l8=$L8 --device gpu --serve-flag=--batch-seqs=64 --clients 1 --prompt-tokens 10 --max-tokens 16 --requests-per-client 16 \
      --peer-url llama=http://127.0.0.1:8090 --peer-api llama >>"$out/short.txt" 2>&1
    echo "rc=$?" >>"$out/short.txt"
    kill $lpid; wait $lpid 2>/dev/null ;;
  gen) # decode and pp512 of each binary of SHORT_BINS, alternating
    model
    for bin in ${SHORT_BINS:-forge}; do
      echo "== $bin" >>"$out/bench-gen.txt"
      $B/$bin bench gen -m $L8 --device gpu -p 512 -n 128 -r 3 >>"$out/bench-gen.txt" 2>&1
    done ;;
  peer)
    model
    [ -x $LS ] || bash bench/llamacpp-cuda.sh unpack >"$out/llama-unpack.txt" 2>&1
    "$LS" -m $L8 -ngl 99 -fa on -np 4 -c 16384 --host 127.0.0.1 --port 8090 >"$out/llama-server.log" 2>&1 &
    lpid=$!
    for _ in $(seq 1 240); do curl -sf http://127.0.0.1:8090/health >/dev/null 2>&1 && break; sleep 0.5; done
    turns -m l8=$L8 --device gpu --serve-flag=--batch-seqs=16 --peer-url llama=http://127.0.0.1:8090 --peer-api llama >"$out/turns-peer.txt" 2>&1
    echo "rc=$?" >>"$out/turns-peer.txt"
    kill $lpid; wait $lpid 2>/dev/null ;;
  *) echo "unknown phase $p" >&2; exit 2 ;;
  esac
  echo "$p: $(($(date +%s) - s)) s" >>"$log"
done
