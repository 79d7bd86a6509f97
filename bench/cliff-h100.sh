#!/usr/bin/env bash
# A fresh process's first token by prompt length, with its debug log (when
# cuBLAS is ready, when the weights are resident): where a prompt of a few
# hundred tokens waits after the load (issue 19's cliff). Carry
# .carry/forge.xz (and .carry/forge-NAME.xz for each other build in BINS);
# WORDS lists prompts in words of "the old river town" (on the synthetic
# 8B's vocabulary: 1 → 31 tokens, 12 → 328, 70 → 1894).
set -u
mkdir -p bin "$OUT"
for b in ${BINS:-forge}; do xz -dc .carry/$b.xz >bin/$b && chmod +x bin/$b; done
L8=/tmp/l8.gguf
[ -f $L8 ] || bin/forge gen --preset llama3-8b --quant q4_k_m --valid-utf8 -o $L8 --progress plain >"$OUT/gen.txt" 2>&1
cat $L8 >/dev/null
for w in ${WORDS:-1 12 70 1 12 70}; do
  for b in ${BINS:-forge}; do
    p=$(yes "the old river town" | head -n "$w" | tr '\n' ' ')
    bin/$b -v run -m $L8 --device gpu -n 1 --temp 0 -p "$p" >/dev/null 2>"$OUT/run-$b-$w.log"
    echo "== $b, $w words: $(grep -o 'tokens=[0-9]*' "$OUT/run-$b-$w.log" | head -1)"
    grep -E "cuBLAS ready|device open|^all resident|^load:" "$OUT/run-$b-$w.log" | sed -E 's/^time=[^ ]+ //; s/device="[^"]*"//' | cut -c1-200
  done
done
