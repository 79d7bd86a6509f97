#!/usr/bin/env bash
# Regenerates the compiled kernels shipped in the binary (kernels/gpu/obj:
# gzip'd cubins, PTX and AMD code objects plus manifest.json). CI fails
# (TestShippedObjectsMatchSources) when a kernel source changes without this.
#
#   bench/kernels-gen.sh            # here: HIP objects through hiprtc (ROCm 5.2's
#                                   # libamdhip64, no GPU needed), and the CUDA ones
#                                   # too where libnvrtc is installed; else it builds
#                                   # bin/device/kernels-gen for the GPU machine
#   bench/kernels-gen.sh cuda       # on a machine with libnvrtc but no Go (the GPU
#                                   # machine): writes $OUT/cuda-obj.tar (and keeps
#                                   # the objects in $KOBJ_DIR/obj where it is set)
#   bench/kernels-gen.sh merge FILE # back here: merges that tar into kernels/gpu/obj
#
# nvrtc needs no GPU: it only has to be installed. `make kernels` runs the
# first form.
set -euo pipefail
cd "$(dirname "$0")/.."
obj=kernels/gpu/obj
case "${1:-here}" in
here)
  go run ./kernels/gpu/gen -backend hip -dir "$obj"
  if ldconfig -p 2>/dev/null | grep -q libnvrtc || ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1; then
    go run ./kernels/gpu/gen -backend cuda -dir "$obj"
  else
    mkdir -p bin/device
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/device/kernels-gen ./kernels/gpu/gen
    echo "no libnvrtc here: carry bin/device/kernels-gen and this script to a machine with CUDA," >&2
    echo "run 'bench/kernels-gen.sh cuda' there, then 'bench/kernels-gen.sh merge cuda-obj.tar' here" >&2
  fi
  ;;
cuda)
  # KOBJ_DIR keeps the objects in $KOBJ_DIR/obj after the tar is written,
  # so that the runs that follow load them (FORGE_KERNEL_OBJECTS).
  out=${OUT:-out}
  tmp=${KOBJ_DIR:-$(mktemp -d)}
  mkdir -p "$out" "$tmp/obj"
  "${BIN:-bin/device}/kernels-gen" -backend cuda -dir "$tmp/obj"
  tar -C "$tmp" -cf "$out/cuda-obj.tar" obj
  [ -n "${KOBJ_DIR:-}" ] || rm -rf "$tmp"
  echo "wrote $out/cuda-obj.tar"
  ;;
merge)
  tmp=$(mktemp -d)
  tar -C "$tmp" -xf "${2:?merge needs the tar from 'kernels-gen.sh cuda'}"
  go run ./kernels/gpu/gen -merge "$tmp/obj" -dir "$obj"
  rm -rf "$tmp"
  ;;
*)
  echo "usage: $0 [here|cuda|merge FILE]" >&2
  exit 2
  ;;
esac
