#!/usr/bin/env bash
# The serving engine on the GPU machine next to llama-server (issue 18), in
# as few calls as the device allows:
#
#   call 1: bench/serve-h100.sh build models        # llama.cpp with CUDA, the 8B files
#   call 2 (machine still warm): bench/serve-h100.sh load turns swap
#
# bin/forge is cross-built here (make build) and travels with the tree;
# llama.cpp's source archive travels in .carry (bench/llamacpp-cuda.sh).
# Every log lands in $OUT/serve/ and is packed into $OUT/serve.tgz.
set -uo pipefail
o=${OUT:-out}/serve
mkdir -p "$o"
F=bin/forge
L8=/tmp/l8.gguf
L8B=/tmp/l8b.gguf
LS=/tmp/llama/bin/llama-server
NP=${NP:-16}
CLIENTS=${CLIENTS:-1,4,16,64}

llama_up() { # start llama-server on $L8 with $NP slots, wait for its health
  "$LS" -m $L8 -ngl 99 -fa on -np "$NP" -c $((NP * 1024)) --host 127.0.0.1 --port 8090 >"$o/llama-server.log" 2>&1 &
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
  models)
    [ -f $L8 ] || $F gen --preset llama3-8b --quant q4_k_m -o $L8 --progress plain >"$o/gen.txt" 2>&1
    [ -f $L8B ] || $F gen --preset llama3-8b --quant q4_k_m --seed 2 -o $L8B --progress plain >>"$o/gen.txt" 2>&1
    cat $L8 $L8B >/dev/null ;;
  load) # N clients x 128 tokens, forge vs llama-server, one run
    llama_up && {
      $F bench serve -m l8=$L8 --device gpu --clients "$CLIENTS" --prompt-tokens 32 --max-tokens 128 \
        --requests-per-client ${RPC:-2} --peer-url llama=http://127.0.0.1:8090 --svg "$o/load.svg" --json >"$o/load.json" 2>"$o/load.err"
      echo "rc=$?" >>"$o/load.err"
      # the table from the same JSON is not re-run: print the human table from a second, short pass
      $F bench serve -m l8=$L8 --device gpu --clients 1 --prompt-tokens 10 --max-tokens 16 --requests-per-client 8 \
        --peer-url llama=http://127.0.0.1:8090 >"$o/short.txt" 2>&1
      llama_down
    } ;;
  table) # the same as load, as a table
    llama_up && {
      $F bench serve -m l8=$L8 --device gpu --clients "$CLIENTS" --prompt-tokens 32 --max-tokens 128 \
        --requests-per-client ${RPC:-2} --peer-url llama=http://127.0.0.1:8090 --svg "$o/load.svg" >"$o/load.txt" 2>&1
      echo "rc=$?" >>"$o/load.txt"
      llama_down
    } ;;
  turns) # batching on: a GPU server without --batch-seqs runs one sequence at a time, with no prefix cache
    llama_up && {
      $F bench serve -m l8=$L8 --device gpu --serve-flag=--batch-seqs=16 --clients 1,4 --turns 4 --history-tokens 2000 --turn-tokens 32 --max-tokens 32 \
        --peer-url llama=http://127.0.0.1:8090 >"$o/turns.txt" 2>&1
      echo "rc=$?" >>"$o/turns.txt"
      llama_down
    } ;;
  swap)
    $F bench serve -m a=$L8 -m b=$L8B --device gpu --swap --budget 8GiB --requests-per-client 6 >"$o/swap.txt" 2>&1
    echo "rc=$?" >>"$o/swap.txt" ;;
  *) echo "unknown phase $phase" >&2 ;;
  esac
  echo "$phase: $(( $(date +%s) - s )) s" | tee -a "$o/phases.txt"
done
tar -C "${OUT:-out}" -czf "${OUT:-out}/serve.tgz" serve 2>/dev/null
