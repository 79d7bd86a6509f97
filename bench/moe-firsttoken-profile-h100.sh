#!/usr/bin/env bash
# Where a mixture's first token spends its host time, on one GPU machine:
# carry .carry/forge.xz. For each preset in $MOE_PRESETS it writes the
# Q4_K_M file, runs `forge bench gen -p 8 -n 0` (the 8-token prompt on a
# resident model) and then, page cache warm, one `forge -v run` per
# strategy ($STRATEGIES) of an 8-token prompt with --cpu-profile (after a
# run that writes an expert profile, so prefetch loads the routed experts
# first). The profiles and logs land in $OUT; read them here with
# `go tool pprof -top bin/forge OUT/P-S.prof`.
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out" bin
export FORGE_CACHE_DIR=${FORGE_CACHE_DIR:-/tmp/forge-kernels}
log=$out/profile.txt
xz -dc .carry/forge.xz >bin/forge && chmod +x bin/forge
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } >>"$log"
prompt='Once upon'
for pr in ${MOE_PRESETS:-gpt-oss-20b}; do
  f=/tmp/$pr.gguf
  bin/forge gen --preset "$pr" --quant q4_k_m --valid-utf8 -o $f --progress plain >/tmp/gen.txt 2>&1 || { tail -3 /tmp/gen.txt >>"$log"; continue; }
  cat $f >/dev/null
  echo "=== $pr ($(date -u +%T))" >>"$log"
  bin/forge bench gen -m $f --device gpu -p 8 -n 0 -r 5 2>&1 | grep -E 'pp8' >>"$log"
  pd=$(mktemp -d)
  bin/forge run -m $f --device gpu --expert-profiles "$pd" -n 1 -p "$prompt" >/dev/null 2>&1
  for s in ${STRATEGIES:-prefetch eager}; do
    for i in 1 2; do
      bin/forge -v --cpu-profile "$out/$pr-$s-$i.prof" run -m $f --device gpu --strategy $s --expert-profiles "$pd" -n 1 -p "$prompt" \
        2>"$out/$pr-$s-$i.log" >/dev/null
      echo "$s $i: $(grep -E '^load' "$out/$pr-$s-$i.log")" >>"$log"
    done
  done
  rm -f $f
done
cat "$log"
