#!/usr/bin/env bash
# The llama.cpp peer on the GPU machine: build llama-server and llama-bench
# with CUDA for sm_90 from a source archive carried in .carry/llama.tar.xz
# (a snapshot of a public llama.cpp mirror, without models/, docs/, media/,
# app/; never committed here), and pack the two binaries into $OUT in pieces
# small enough to come back, so later calls carry them instead of building.
#
#   bench/llamacpp-cuda.sh build    # there: ~5-6 min on 16 cores
#   bench/llamacpp-cuda.sh unpack   # there: binaries from .carry/llama-bin.*
#
# The binaries land in /tmp/llama/bin. llama.cpp's own libraries are linked
# in statically; CUDA's runtime and cuBLAS come from the machine's CUDA.
set -euo pipefail
case ${1:-build} in
build)
  rm -rf /tmp/llama && mkdir -p /tmp/llama/src /tmp/llama/bin
  tar -C /tmp/llama/src -xJf .carry/llama.tar.xz
  cmake -S /tmp/llama/src -B /tmp/llama/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF >/tmp/llama/cmake.log 2>&1 || { tail -40 /tmp/llama/cmake.log; exit 1; }
  cmake --build /tmp/llama/build -j"$(nproc)" --target llama-server llama-bench llama-completion >/tmp/llama/build.log 2>&1 ||
    { tail -60 /tmp/llama/build.log; exit 1; }
  for t in llama-server llama-bench llama-completion; do
    cp "$(find /tmp/llama/build -name $t -type f -perm -u+x | head -1)" /tmp/llama/bin/
  done
  strip /tmp/llama/bin/* || true
  ls -la /tmp/llama/bin
  if [ -n "${OUT:-}" ]; then
    tar -C /tmp/llama -cf - bin | xz -T0 -6 | split -b 15M -d - "$OUT/llama-bin."
    ls -la "$OUT"
  fi ;;
unpack)
  mkdir -p /tmp/llama
  cat .carry/llama-bin.* | xz -dc | tar -C /tmp/llama -xf -
  ls -la /tmp/llama/bin ;;
esac
