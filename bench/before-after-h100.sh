#!/usr/bin/env bash
# Two builds of forge side by side on the 8B shape, in one call on the GPU
# machine (issue 24's "first-token/decode figures within noise"): decode
# and prompt throughput (forge bench gen) and the first token of fresh
# processes (forge bench load), each build in turn, twice, so that drift
# of the machine shows as a difference between the two rounds of one
# build rather than between builds.
#
#   OLD=path/to/forge-old NEW=path/to/forge bash bench/before-after-h100.sh
#
# The 8B Q4_K_M file is written by $NEW (forge gen) unless /tmp/l8.gguf
# exists. Logs and the summary go to $OUT (or ./out).
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
old=${OLD:?OLD names the build to compare with} new=${NEW:?NEW names this build}
L8=/tmp/l8.gguf
export FORGE_CACHE_DIR=${FORGE_CACHE_DIR:-/tmp/forge-kernels}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/ba-summary.txt"
[ -f $L8 ] || "$new" gen --preset llama3-8b --quant q4_k_m --valid-utf8 -o $L8 --progress plain >"$out/ba-gen.txt" 2>&1
cat $L8 >/dev/null
for round in 1 2; do
  for b in new old; do
    bin=$new; [ $b = old ] && bin=$old
    "$bin" bench gen -m $L8 --device gpu -p 512 -n 128 -r 3 >"$out/ba-gen-$b-$round.txt" 2>&1
    grep -E 'pp512|tg128' "$out/ba-gen-$b-$round.txt" | sed "s/^/$b round $round: /" | tee -a "$out/ba-summary.txt"
    "$bin" bench load -m $L8 --device gpu --runs 5 --cache warm --strategies prefetch --prompt-tokens 8 >"$out/ba-load-$b-$round.txt" 2>&1
    grep -E '^ +prefetch' "$out/ba-load-$b-$round.txt" | sed "s/^/$b round $round: /" | tee -a "$out/ba-summary.txt"
  done
done
