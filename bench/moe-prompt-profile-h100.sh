#!/usr/bin/env bash
# A mixture's short prompt on a resident model, kernel by kernel: carry
# bin/device.tar.xz (device/model.test, device/forge). Writes the Q4_K_M
# files of $MOE_PRESETS and runs pipeline/model's TestGPUDecodeBench on
# them (pp512, tg128, then the kernels of a decode step, of the 512-token
# prompt and of an 8-token one, with the 8-token step's wall time).
set -uo pipefail
KOBJ=${KOBJ:-0} . bench/device-prelude.sh bin/device.tar.xz profile.txt
files=
for pr in ${MOE_PRESETS:-gpt-oss-20b qwen3-30b-a3b}; do
  $B/forge gen --preset "$pr" --quant q4_k_m --valid-utf8 -o /tmp/$pr.gguf --progress plain >/tmp/gen.txt 2>&1 || tail -3 /tmp/gen.txt
  files=${files:+$files,}/tmp/$pr.gguf
done
(cd pipeline/model && FORGE_BIG_MODEL=$files ../../$B/model.test -test.v -test.run 'TestGPUDecodeBench$' -test.timeout 500s) >"$out/bench.txt" 2>&1
echo "exit $?" >>"$out/bench.txt"
grep -E 'GPU-BENCH|GPU-PROFILE|FAIL|ok|exit' "$out/bench.txt"
