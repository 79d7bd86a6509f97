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
# The binaries land in /tmp/llama/bin next to llama.cpp's shared libraries
# (found through an $ORIGIN run path): shared, so the CUDA kernels are
# packed once rather than once per tool, which keeps the pieces small enough
# to carry. CUDA's runtime and cuBLAS come from the machine's CUDA.
set -euo pipefail
case ${1:-build} in
build)
  rm -rf /tmp/llama && mkdir -p /tmp/llama/src /tmp/llama/bin
  tar -C /tmp/llama/src -xJf .carry/llama.tar.xz
  cmake -S /tmp/llama/src -B /tmp/llama/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF >/tmp/llama/cmake.log 2>&1 || { tail -40 /tmp/llama/cmake.log; exit 1; }
  cmake --build /tmp/llama/build -j"$(nproc)" --target llama-server llama-bench llama-completion >/tmp/llama/build.log 2>&1 ||
    { tail -60 /tmp/llama/build.log; exit 1; }
  for t in llama-server llama-bench llama-completion; do
    cp "$(find /tmp/llama/build -name $t -type f -perm -u+x | head -1)" /tmp/llama/bin/
  done
  find /tmp/llama/build -name '*.so*' \( -type f -o -type l \) -exec cp -P {} /tmp/llama/bin/ \;
  strip /tmp/llama/bin/* 2>/dev/null || true
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
