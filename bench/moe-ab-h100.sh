#!/usr/bin/env bash
# Two forge builds' first token on a mixture during the load, alternating
# on one GPU machine (issue 21): carry .carry/forge.xz (the build under
# test) and .carry/forge-old.xz (the one before it). For each preset in
# $MOE_PRESETS (default gpt-oss-20b) it writes the Q4_K_M file once, then
# for each round and each build: a prefetch run that writes a fresh expert
# profile, then `forge bench load` prefetch and eager by that profile
# (8-token prompt, page cache warm, 3 runs), and last one `forge -v run`
# of each build for its uploader's debug line. Everything lands in
# $OUT/ab.txt.
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out" bin
export FORGE_CACHE_DIR=${FORGE_CACHE_DIR:-/tmp/forge-kernels}
log=$out/ab.txt
xz -dc .carry/forge.xz >bin/forge-new && xz -dc .carry/forge-old.xz >bin/forge-old && chmod +x bin/forge-new bin/forge-old
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } >>"$log"
for pr in ${MOE_PRESETS:-gpt-oss-20b}; do
  f=/tmp/$pr.gguf
  bin/forge-new gen --preset "$pr" --quant q4_k_m --valid-utf8 -o $f --progress plain >/tmp/gen.txt 2>&1 || { tail -3 /tmp/gen.txt >>"$log"; continue; }
  cat $f >/dev/null
  for round in ${ROUNDS:-1 2}; do
    for b in old new; do
      pd=$(mktemp -d)
      echo "=== $pr round $round build $b ($(date -u +%T))" >>"$log"
      bin/forge-$b bench load -m $f --device gpu --runs 1 --cache warm --strategies prefetch --prompt-tokens 8 --expert-profiles "$pd" 2>&1 | grep -E '^ +prefetch' >>"$log"
      bin/forge-$b bench load -m $f --device gpu --runs 3 --cache warm --strategies prefetch,eager --prompt-tokens 8 --expert-profiles "$pd" \
        --svg "$out/$pr-$b-$round.svg" 2>&1 | grep -E '^ +(prefetch|eager)' >>"$log"
    done
  done
  for b in old new; do
    bin/forge-$b -v run -m $f --device gpu --expert-profiles "$pd" -n 1 -p 'Once upon a time' 2>&1 >/dev/null | grep -E 'device uploads|device open|^load' >>"$log"
  done
  rm -f $f
done
cat "$log"
