#!/usr/bin/env bash
# The serving engine on the GPU machine next to llama-server (issue 18), in
# as few calls as the device allows:
#
#   bench/serve-h100.sh unpack models table single turns swap gen sweep l70
#
# bin/forge is cross-built here (make build) and carried xz'd as
# .carry/forge.xz; llama.cpp's binaries travel packed in .carry/llama-bin.*
# (bench/llamacpp-cuda.sh build makes them once; `build` still rebuilds).
# gguf/testdata can stay behind for this call (nothing here reads it), which
# keeps the tree and the carried binaries under the 64 MiB a call takes.
# Every log lands in $OUT/serve/ and is packed into $OUT/serve.tgz.
set -uo pipefail
o=/tmp/serve-logs/serve # packed into $OUT/serve.tgz after every phase ($OUT returns only a few files)
mkdir -p "$o" "${OUT:-out}"
F=bin/forge
L8=/tmp/l8.gguf
L8B=/tmp/l8b.gguf
LS=/tmp/llama/bin/llama-server
NP=${NP:-16}
CLIENTS=${CLIENTS:-1,4,16,64}

llama_up() { # start llama-server on $L8 with ${1:-$NP} slots of ${2:-1024} positions, wait for its health
  "$LS" -m $L8 -ngl 99 -fa on -np "${1:-$NP}" -c $((${1:-$NP} * ${2:-1024})) --host 127.0.0.1 --port 8090 >"$o/llama-server.log" 2>&1 &
  echo $! >/tmp/llama-server.pid
  for _ in $(seq 1 120); do
    curl -sf http://127.0.0.1:8090/health >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "llama-server did not come up" >&2; tail -20 "$o/llama-server.log" >&2; return 1
}
llama_down() { kill "$(cat /tmp/llama-server.pid)" 2>/dev/null; wait 2>/dev/null; sleep 1; }

for phase in "$@"; do
  s=$(date +%s)
  case $phase in
  build) bash bench/llamacpp-cuda.sh build >"$o/build.txt" 2>&1 || { tail -30 "$o/build.txt"; } ;;
  kobj) # the CUDA objects of the sources as they are (when the shipped ones are stale), used by every forge run below
    if [ -x .carry/kernels-gen ]; then
      mkdir -p /tmp/kobj/obj && .carry/kernels-gen -backend cuda -dir /tmp/kobj/obj >"$o/kobj.txt" 2>&1 &&
        tar -C /tmp/kobj -cf "${OUT:-out}/cuda-obj.tar" obj && export FORGE_KERNEL_OBJECTS=/tmp/kobj/obj
      tail -3 "$o/kobj.txt"
    fi ;;
  unpack)
    bash bench/llamacpp-cuda.sh unpack >"$o/unpack.txt" 2>&1 || tail -5 "$o/unpack.txt"
    if [ -f .carry/forge.xz ]; then mkdir -p bin && xz -dc .carry/forge.xz >$F && chmod +x $F; fi
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$o/device.txt" ;;
  models) # --valid-utf8: llama-server refuses (mid-stream) output that is not valid UTF-8, which random weights produce
    [ -f $L8 ] || $F gen --preset llama3-8b --quant q4_k_m --valid-utf8 -o $L8 --progress plain >"$o/gen.txt" 2>&1
    [ -f $L8B ] || $F gen --preset llama3-8b --quant q4_k_m --valid-utf8 --seed 2 -o $L8B --progress plain >>"$o/gen.txt" 2>&1
    cat $L8 $L8B >/dev/null ;;
  load) # N clients x 128 tokens, forge vs llama-server, one run
    llama_up && {
      $F bench serve -m l8=$L8 --device gpu --clients "$CLIENTS" --prompt-tokens 32 --max-tokens 128 \
        --requests-per-client ${RPC:-2} --peer-url llama=http://127.0.0.1:8090 --peer-api llama --svg "$o/load.svg" --json >"$o/load.json" 2>"$o/load.err"
      echo "rc=$?" >>"$o/load.err"
      # the table from the same JSON is not re-run: print the human table from a second, short pass
      $F bench serve -m l8=$L8 --device gpu --clients 1 --prompt-tokens 10 --max-tokens 16 --requests-per-client 8 \
        --peer-url llama=http://127.0.0.1:8090 --peer-api llama >"$o/short.txt" 2>&1
      llama_down
    } ;;
  table) # the same as load, as a table
    llama_up && {
      $F bench serve -m l8=$L8 --device gpu --serve-flag=--batch-seqs=64 --clients "$CLIENTS" --prompt-tokens 32 --max-tokens 128 \
        --requests-per-client ${RPC:-2} --peer-url llama=http://127.0.0.1:8090 --peer-api llama --svg "$o/load.svg" >"$o/load.txt" 2>&1
      echo "rc=$?" >>"$o/load.txt"
      # a resident model's first token for a 10-token prompt, over HTTP
      $F bench serve -m l8=$L8 --device gpu --serve-flag=--batch-seqs=64 --clients 1 --prompt-tokens 10 --max-tokens 16 \
        --requests-per-client 8 --peer-url llama=http://127.0.0.1:8090 --peer-api llama >"$o/short.txt" 2>&1
      echo "rc=$?" >>"$o/short.txt"
      llama_down
    } ;;
  determ) # the batch-invariant mode next to the default, 16 clients
    $F bench serve -m l8=$L8 --device gpu --serve-flag=--batch-seqs=64 --serve-flag=--deterministic --clients 16 --prompt-tokens 32 --max-tokens 128 \
      --requests-per-client ${RPC:-2} >"$o/determ.txt" 2>&1
    echo "rc=$?" >>"$o/determ.txt" ;;
  single) # one client on a server that runs one sequence at a time (no --batch-seqs)
    $F bench serve -m l8=$L8 --device gpu --clients 1 --prompt-tokens 32 --max-tokens 128 --requests-per-client 3 >"$o/single.txt" 2>&1
    $F bench serve -m l8=$L8 --device gpu --clients 1 --prompt-tokens 10 --max-tokens 16 --requests-per-client 8 >>"$o/single.txt" 2>&1
    echo "rc=$?" >>"$o/single.txt" ;;
  gen) # prompt and decode throughput next to llama-bench
    $F bench gen -m $L8 --device gpu -p 512 -n 128 -r 3 --peer "/tmp/llama/bin/llama-bench -ngl 99 -fa 1" >"$o/gen.txt" 2>&1
    echo "rc=$?" >>"$o/gen.txt" ;;
  sweep) # first token by prompt length, and with an empty kernel cache
    $F bench load -m $L8 --device gpu --runs 2 --cache warm --strategies prefetch --prompt-tokens 1,8,32,128,512 >"$o/sweep.txt" 2>&1
    echo "rc=$?" >>"$o/sweep.txt"
    $F bench load -m $L8 --device gpu --runs 2 --cache warm --strategies prefetch --prompt-tokens 32 --fresh-kernel-cache >>"$o/sweep.txt" 2>&1
    echo "rc=$?" >>"$o/sweep.txt" ;;
  turns) # batching on: a GPU server without --batch-seqs runs one sequence at a time, with no prefix cache
    llama_up 4 4096 && {
      $F bench serve -m l8=$L8 --device gpu --serve-flag=--batch-seqs=16 --clients 1,4 --turns 4 --history-tokens 2000 --turn-tokens 32 --max-tokens 32 --requests-per-client ${TURN_CONVS:-4} \
        --peer-url llama=http://127.0.0.1:8090 --peer-api llama >"$o/turns.txt" 2>&1
      echo "rc=$?" >>"$o/turns.txt"
      llama_down
    } ;;
  swap)
    $F bench serve -m a=$L8 -m b=$L8B --device gpu --swap --budget 8GiB --requests-per-client 6 >"$o/swap.txt" 2>&1
    echo "rc=$?" >>"$o/swap.txt"
    echo "== --batch-seqs 64 (a budget that holds one model and its pool)" >>"$o/swap.txt"
    $F bench serve -m a=$L8 -m b=$L8B --device gpu --swap --budget 20GiB --requests-per-client 6 --serve-flag=--batch-seqs=64 >>"$o/swap.txt" 2>&1
    echo "rc=$?" >>"$o/swap.txt"
    for up in ${SWAP_UPLOAD:-}; do # e.g. SWAP_UPLOAD=st=14,rn=32: more stagers
      echo "== --gpu-upload $up" >>"$o/swap.txt"
      $F bench serve -m a=$L8 -m b=$L8B --device gpu --swap --budget 8GiB --requests-per-client 6 --serve-flag=--gpu-upload=$up >>"$o/swap.txt" 2>&1
    done ;;
  l70) # issue 19: the 70B shape's first token, alternating with llama-completion (fresh processes, page cache warm)
    f=/tmp/l70.gguf
    [ -f $f ] || $F gen --preset llama3-70b --quant q4_k_m --valid-utf8 -o $f --progress plain >"$o/gen70.txt" 2>&1
    cat $f >/dev/null
    $F bench load -m $f --device gpu --runs ${RUNS70:-3} --cache warm --strategies prefetch --prompt-tokens 32 \
      --peer "/tmp/llama/bin/llama-completion -m {model} -ngl 99 -fa on -c 4096 -n 1 -p 'Once upon a time' -no-cnv --temp 0 --no-display-prompt 2>/dev/null" >"$o/l70.txt" 2>&1
    echo "rc=$?" >>"$o/l70.txt" ;;
  presets) # the architectures' real shapes (issue 20): first token and decode next to llama.cpp on the same files
    for pr in ${PRESETS:-qwen3-8b gemma3-4b gemma2-2b phi3-mini mistral-7b}; do
      f=/tmp/$pr.gguf
      $F gen --preset $pr --quant q4_k_m -o $f --progress plain >"$o/preset-$pr-gen.txt" 2>&1 || { echo "$pr: gen failed" >>"$o/presets.txt"; tail -3 "$o/preset-$pr-gen.txt" >>"$o/presets.txt"; continue; }
      cat $f >/dev/null
      echo "=== $pr ($(stat -c %s $f) bytes)" >>"$o/presets.txt"
      $F bench gen -m $f --device gpu -p 512 -n 128 -r 2 --peer "/tmp/llama/bin/llama-bench -ngl 99 -fa 1" >>"$o/presets.txt" 2>&1
      $F bench load -m $f --device gpu --runs 2 --cache warm --strategies prefetch --prompt-tokens 8 \
        --peer "/tmp/llama/bin/llama-completion -m {model} -ngl 99 -fa on -c 4096 -n 1 -p 'Once upon a time' -no-cnv --temp 0 --no-display-prompt 2>/dev/null" >>"$o/presets.txt" 2>&1
      rm -f $f
    done ;;
  moe) # issue 21: mixtures loaded expert by expert, first token (prefetch vs eager vs llama.cpp) and decode next to llama-bench
    for pr in ${MOE_PRESETS:-qwen3-30b-a3b}; do
      f=/tmp/$pr.gguf
      $F gen --preset $pr --quant q4_k_m --valid-utf8 -o $f --progress plain >"$o/moe-$pr-gen.txt" 2>&1 || { echo "$pr: gen failed" >>"$o/moe.txt"; tail -3 "$o/moe-$pr-gen.txt" >>"$o/moe.txt"; continue; }
      cat $f >/dev/null
      echo "=== $pr ($(stat -c %s $f) bytes)" >>"$o/moe.txt"
      $F bench load -m $f --device gpu --runs 3 --cache warm --strategies prefetch,eager --prompt-tokens 8 --svg "$o/moe-$pr.svg" \
        --peer "/tmp/llama/bin/llama-completion -m {model} -ngl 99 -fa on -c 4096 -n 1 -p 'Once upon a time' -no-cnv --temp 0 --no-display-prompt 2>/dev/null" >>"$o/moe.txt" 2>&1
      echo "rc=$?" >>"$o/moe.txt"
      $F bench gen -m $f --device gpu -p 512 -n 128 -r 2 --peer "/tmp/llama/bin/llama-bench -ngl 99 -fa 1" >>"$o/moe.txt" 2>&1
      echo "rc=$?" >>"$o/moe.txt"
      rm -f $f
    done ;;
  *) echo "unknown phase $phase" >&2 ;;
  esac
  echo "$phase: $(( $(date +%s) - s )) s" | tee -a "$o/phases.txt"
  tar -C /tmp/serve-logs -czf "${OUT:-out}/serve.tgz" serve 2>/dev/null
done
