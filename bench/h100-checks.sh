#!/usr/bin/env bash
# Every GPU check of a round in one call on the GPU machine, the tree with
# gguf/testdata (bench/serve-h100.sh measures against the peers in another):
#
#   make device && tar -C bin -cJf bin/device.tar.xz device     # here
#   bash bench/h100-checks.sh                                     # there, carrying bin/device.tar.xz
#
# 1. bench/device.sh quick with KOBJ=1: the CUDA objects of the sources as
#    they are ($OUT/cuda-obj.tar, for bench/kernels-gen.sh merge), then
#    every GPU package's tests on them (rocm, kernels/gpu, actors, pipeline,
#    pipeline/model: conformance, mmq, prefill, merged prompts, the new
#    architectures, perplexity CPU vs GPU, a split over two contexts);
# 2. constrained decoding's cost at 16 sequences on the 8B shape with
#    GPT-2's vocabulary (issue 26: mask ≤ 5 % of decode time).
# Logs are packed into $OUT/checks.tgz; the summary goes to stdout.
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out" /tmp/checks
[ -f bin/device.tar.xz ] && tar -C bin -xJf bin/device.tar.xz
OUT=/tmp/checks KOBJ=1 bash bench/device.sh quick >/tmp/checks/quick.txt 2>&1
echo "device.sh quick: exit $?"
[ -f /tmp/checks/cuda-obj.tar ] && mv /tmp/checks/cuda-obj.tar "$out/"
[ -d /tmp/kobj/obj ] && export FORGE_KERNEL_OBJECTS=/tmp/kobj/obj
if [ "${CONSTRAIN:-1}" = 1 ]; then # CONSTRAIN=0 leaves the constrained-decoding cost out
f=/tmp/l8-gpt2.gguf
bin/device/forge gen --preset llama3-8b --quant q4_k_m --vocab gguf/testdata/tokenizer/ggml-vocab-gpt-2.gguf -o $f --progress plain >/tmp/checks/gen.txt 2>&1
d=$(mktemp -d); mkdir -p "$d/github.com/forge-llm" && ln -s "$PWD" "$d/github.com/forge-llm/forge"
(cd "$d" && FORGE_REQUIRE_GPU=1 FORGE_BIG_MODEL=$f "$OLDPWD/bin/device/pipeline.test" -test.run TestConstrainedDecodeCost -test.v -test.timeout 300s) >/tmp/checks/constrain.txt 2>&1
echo "constrain: exit $?"
grep -E "CONSTRAIN" /tmp/checks/constrain.txt
fi
cat /tmp/checks/log
grep -hE -- "^\s*--- FAIL" /tmp/checks/*.log | head -40
tar -C /tmp -czf "$out/checks.tgz" checks
