#!/usr/bin/env bash
# hip-resources.sh: the register, shared-memory and scratch use of every
# kernel of the HIP code objects, per gfx target, read from the objects'
# AMDGPU metadata note (llvm-readelf --notes of Debian's llvm-15). No GPU
# is needed: the objects are compiled through hiprtc here.
#
#   bench/hip-resources.sh                   # compile gfx90a, gfx942 (where hiprtc takes it), gfx1030
#   bench/hip-resources.sh kernels/gpu/obj   # read an objects folder instead (the shipped objects)
#
# Columns: VGPRs (.vgpr_count; AGPRs separately on CDNA), SGPRs, LDS bytes
# (.group_segment_fixed_size), scratch bytes per lane
# (.private_segment_fixed_size: spills and stack arrays), spilled VGPRs and
# SGPRs, and the workgroup size the compiler assumed (__launch_bounds__).
set -euo pipefail
cd "$(dirname "$0")/.."
READELF="${READELF:-/usr/lib/llvm-15/bin/llvm-readelf}"
if ! [ -x "$READELF" ]; then
  READELF="$(command -v llvm-readelf-15 || command -v llvm-readelf || true)"
fi
if [ -z "$READELF" ]; then
  echo "hip-resources: llvm-readelf not found (apt-get install llvm-15)" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [ $# -ge 1 ]; then
  objdir="$1"
  targets="$(ls "$objdir" | sed -n 's/^hip-\(gfx[0-9a-z]*\)-.*\.gz$/\1/p' | sort -u)"
else
  objdir="$work/obj"
  targets=""
  for t in gfx90a gfx942 gfx1030; do
    # hiprtc 5.2 rejects or crashes on some newer targets: try each alone.
    if go run ./kernels/gpu/gen -backend hip -arch "$t" -dir "$objdir" >"$work/gen-$t.log" 2>&1; then
      targets="$targets $t"
    else
      why="$(grep -m1 -E '^(SIG[A-Z]+|kernels-gen:)' "$work/gen-$t.log" | cut -c1-160)"
      echo "hip-resources: $t: hiprtc could not compile it (${why:-see the generator log}); left out" >&2
      rm -f "$objdir"/hip-"$t"-*.gz
    fi
  done
fi

echo "| target | module | kernel | VGPRs | AGPRs | SGPRs | LDS B | scratch B/lane | VGPR spills | SGPR spills | max workgroup |"
echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for t in $targets; do
  for f in "$objdir"/hip-"$t"-*.gz; do
    mod="$(basename "$f" .gz)"
    mod="${mod#hip-$t-}"
    gzip -dc "$f" >"$work/code.o"
    "$READELF" --notes "$work/code.o" | awk -v t="$t" -v m="$mod" '
      function flush() {
        if (name != "") printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", t, m, name, v, a, s, lds, scr, vs, ss, wg
        name = ""; v = "-"; a = "-"; s = "-"; lds = "-"; scr = "-"; vs = "-"; ss = "-"; wg = "-"
      }
      /^  - \.args:/ || /^  - \.[a-z_]+:/ { flush() }
      $1 == ".name:" { name = $2 }
      $1 == ".vgpr_count:" { v = $2 }
      $1 == ".agpr_count:" { a = $2 }
      $1 == ".sgpr_count:" { s = $2 }
      $1 == ".group_segment_fixed_size:" { lds = $2 }
      $1 == ".private_segment_fixed_size:" { scr = $2 }
      $1 == ".vgpr_spill_count:" { vs = $2 }
      $1 == ".sgpr_spill_count:" { ss = $2 }
      $1 == ".max_flat_workgroup_size:" { wg = $2 }
      /^amdhsa\.target:/ || /^amdhsa\.version:/ { flush() }
      END { flush() }
    '
  done
done
