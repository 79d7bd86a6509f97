#!/usr/bin/env bash
# A mixture's first token during the load, in one call on the GPU machine
# (issue 21), next to llama.cpp and to the load before pacing:
#
#   MOE_PRESETS="qwen3-30b-a3b gpt-oss-20b" DENSE=1 bash bench/moe-prefetch-h100.sh
#
# carrying .carry/forge.xz (xz of bin/forge) and .carry/llama-bin.*
# (bench/llamacpp-cuda.sh). For each preset it writes the Q4_K_M file and
# runs, page cache warm, 8-token prompt:
#   1. forge bench load, prefetch and eager, llama-completion as the peer;
#   2. the same prefetch with --gpu-upload unpaced (every chunk queued for
#      the staging ring at once, as before the loader paced them);
#   3. one prefetch run with --expert-profiles in a fresh folder (it loads
#      by index and writes the profile), then 1. again with that folder:
#      every run loads the experts earlier runs routed to first;
#   4. forge bench gen -p 512 -n 128 next to llama-bench.
# GEN=0 leaves out 4, UNPACED=0 leaves out 2. DENSE=1 adds the 8B shape's first token paced and unpaced, alternating,
# (pacing must not slow a dense load). Everything lands in $OUT/moe.txt;
# the timelines in $OUT/*.svg.
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
F=bin/forge
L=/tmp/llama/bin
export FORGE_CACHE_DIR=${FORGE_CACHE_DIR:-/tmp/forge-kernels}
log=$out/moe.txt
bash bench/llamacpp-cuda.sh unpack >/tmp/unpack.txt 2>&1 || tail -5 /tmp/unpack.txt
mkdir -p bin && xz -dc .carry/forge.xz >$F && chmod +x $F
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } >>"$log"
peer="$L/llama-completion -m {model} -ngl 99 -fa on -c 4096 -n 1 -p 'Once upon a time' -no-cnv --temp 0 --no-display-prompt 2>/dev/null"
phase() { echo "--- $* ($(date -u +%T))" >>"$log"; }
for pr in ${MOE_PRESETS:-qwen3-30b-a3b}; do
  f=/tmp/$pr.gguf
  phase "$pr: gen"
  $F gen --preset "$pr" --quant q4_k_m --valid-utf8 -o $f --progress plain >/tmp/gen-$pr.txt 2>&1 || { tail -3 /tmp/gen-$pr.txt >>"$log"; continue; }
  cat $f >/dev/null
  echo "=== $pr ($(stat -c %s $f) bytes)" >>"$log"
  phase "$pr: prefetch, eager, llama-completion"
  $F bench load -m $f --device gpu --runs 3 --cache warm --strategies prefetch,eager --prompt-tokens 8 --svg "$out/$pr.svg" --peer "$peer" >>"$log" 2>&1
  if [ "${UNPACED:-1}" = 1 ]; then
    phase "$pr: prefetch unpaced"
    $F bench load -m $f --device gpu --runs 3 --cache warm --strategies prefetch --prompt-tokens 8 --gpu-upload unpaced >>"$log" 2>&1
  fi
  phase "$pr: the expert profile's first run (loads by index, writes the profile)"
  pd=$(mktemp -d)
  $F bench load -m $f --device gpu --runs 1 --cache warm --strategies prefetch --prompt-tokens 8 --expert-profiles "$pd" 2>&1 | grep -E '^ +prefetch|strategy' >>"$log"
  phase "$pr: prefetch, eager, llama-completion with the profile"
  $F bench load -m $f --device gpu --runs 3 --cache warm --strategies prefetch,eager --prompt-tokens 8 --expert-profiles "$pd" \
    --svg "$out/$pr-profile.svg" --peer "$peer" >>"$log" 2>&1
  [ "${GEN:-1}" = 1 ] && phase "$pr: bench gen" &&
  $F bench gen -m $f --device gpu -p 512 -n 128 -r 2 --peer "$L/llama-bench -ngl 99 -fa 1" >>"$log" 2>&1
  rm -f $f
done
if [ "${DENSE:-0}" = 1 ]; then
  f=/tmp/l8.gguf
  phase "8B: gen"
  $F gen --preset llama3-8b --quant q4_k_m -o $f --progress plain >/tmp/gen-l8.txt 2>&1 && cat $f >/dev/null
  for round in 1 2; do
    phase "8B paced, round $round"
    $F bench load -m $f --device gpu --runs 5 --cache warm --strategies prefetch --prompt-tokens 8 2>&1 | grep -E '^ +prefetch|strategy' >>"$log"
    phase "8B unpaced, round $round"
    $F bench load -m $f --device gpu --runs 5 --cache warm --strategies prefetch --prompt-tokens 8 --gpu-upload unpaced 2>&1 | grep -E '^ +prefetch|strategy' >>"$log"
  done
fi
phase done
