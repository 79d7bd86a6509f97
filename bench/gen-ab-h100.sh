#!/usr/bin/env bash
# A kernel change checked and its decode timed against the build before
# it, in one call on the GPU machine. Build here and carry bin/device.tar.xz:
#
#   make device DEVICE_PKGS="kernels/gpu pipeline/model"
#   cp OLD_FORGE bin/device/forge-old     # the build before the change
#   tar -C bin -cJf bin/device.tar.xz device
#
#   GPU_TESTS='regexp' MODEL_TESTS='regexp' bash bench/gen-ab-h100.sh
#
# The CUDA objects of the sources as they are compile first
# (device-prelude.sh; $OUT/cuda-obj.tar for bench/kernels-gen.sh merge):
# bin/device/forge and the tests load them, forge-old its own shipped
# objects. Then `forge bench gen -p 0 -n 128 -r 3` on the 8B Q4_K_M shape
# (PRESETS to change), new and old alternating, ROUNDS times; with
# TUNINGS (space-separated FORGE_DECODE_TUNING values), the new build again
# under each of them in every round; with OTHERS (space-separated names of
# more builds in bin/device, e.g. a change in parts), each of them too,
# on its own embedded objects or kernels compiled from its own sources.
set -uo pipefail
. bench/device-prelude.sh bin/device.tar.xz gen-ab.txt
if [ -n "${GPU_TESTS:-}" ]; then
  (cd kernels/gpu && ../../$B/gpu.test -test.v -test.timeout 400s -test.run "$GPU_TESTS") >"$out/tests-gpu.txt" 2>&1
  echo "gpu tests rc=$?" >>"$log"
fi
if [ -n "${MODEL_TESTS:-}" ]; then
  (cd "$mdir" && "$OLDPWD/$B/model.test" -test.v -test.timeout 400s -test.run "$MODEL_TESTS") >"$out/tests-model.txt" 2>&1
  echo "model tests rc=$?" >>"$log"
fi
for pr in ${PRESETS:-llama3-8b}; do
  f=/tmp/$pr.gguf
  [ -f $f ] || $B/forge gen --preset $pr --quant q4_k_m --valid-utf8 -o $f --progress plain >"$out/gen-$pr.txt" 2>&1
  cat $f >/dev/null
  for r in $(seq 1 "${ROUNDS:-2}"); do
    echo "== $pr round $r new" >>"$log"
    $B/forge bench gen -m $f --device gpu -p 0 -n 128 -r 3 2>&1 | grep -E "tg128" >>"$log"
    for o in forge-old ${OTHERS:-}; do # each on its own objects (or its sources, compiled)
      echo "== $pr round $r ${o/#forge-old/old}" >>"$log"
      env -u FORGE_KERNEL_OBJECTS $B/$o bench gen -m $f --device gpu -p 0 -n 128 -r 3 2>&1 | grep -E "tg128" >>"$log"
    done
    for tun in ${TUNINGS:-}; do
      echo "== $pr round $r new FORGE_DECODE_TUNING=$tun" >>"$log"
      FORGE_DECODE_TUNING=$tun $B/forge bench gen -m $f --device gpu -p 0 -n 128 -r 3 2>&1 | grep -E "tg128|forge:" >>"$log"
    done
  done
done
