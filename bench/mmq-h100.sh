#!/usr/bin/env bash
# The tensor-core batched matmul (kernels/gpu/cu/mmq.cu) on the GPU machine
# in one call: ptxas resources, its tests, the per-row-count benchmark
# against the multi-row matrix-vector kernels, and the batched decode step
# of the 8B shape with and without it (FORGE_TEST_GPU_MMQ=off). Binaries, built
# here and carried as bin/dev:
#
#   for p in kernels/gpu pipeline/model; do
#     CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o bin/dev/$(basename $p).test ./$p; done
#   CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/dev/forge ./cmd/forge
#
#   tar -C bin -cJf bin/dev.tar.xz dev   # optional: the script unpacks it
#
# (The device tool sends the session's checkout: from a helper's worktree,
# copy bin/dev (or the tarball), this script and kernels/gpu/cu into an
# ignored folder of that checkout, carry it, and run the script there.)
#
#   bench/mmq-h100.sh [phases…]   # default: ptxas test bench step
#
# Each phase runs only if the call's budget ($BUDGET seconds from the start,
# default 160) leaves room; the 8B file is written in the background from
# the start. Logs in $OUT. Phase pipeline (not in the default) runs the
# serving engine's GPU determinism test (bin/dev/pipeline.test, testdata
# from $REPO).
set -uo pipefail
[ -f bin/dev.tar.xz ] && tar -C bin -xJf bin/dev.tar.xz
o=${OUT:-out}
mkdir -p "$o"
t0=$(date +%s)
budget=${BUDGET:-160}
left() { echo $((budget - ($(date +%s) - t0))); }
export FORGE_REQUIRE_GPU=1 FORGE_CACHE_DIR=/tmp/forge-kernels
big=/tmp/l8.gguf
best=""
phases=${*:-ptxas test bench step}
sum=$o/summary.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } >"$sum" 2>&1
if [[ " $phases " == *" step "* ]]; then
  (bin/dev/forge gen --preset llama3-8b --quant q4_k_m -o $big --progress plain >"$o/gen.txt" 2>&1 && cat $big >/dev/null
   echo "gen done at $(( $(date +%s) - t0 )) s" >>"$o/gen.txt") &
fi
mkdir -p pipeline/model kernels/gpu
d=$(mktemp -d)
mkdir -p "$d/github.com/forge-llm" && ln -s "$PWD" "$d/github.com/forge-llm/forge"
for ph in $phases; do
  echo "== $ph at $(( $(date +%s) - t0 )) s, $(left) s left" >>"$sum"
  case $ph in
  ptxas)
    (cd kernels/gpu/cu && timeout 40 nvcc -arch=sm_90 -cubin -Xptxas -v -o /tmp/mmq.cubin mmq.cu) >"$o/ptxas.txt" 2>&1
    grep -E "Compiling entry|registers|spill" "$o/ptxas.txt" | sed -E 's/ptxas info +: //' >>"$sum" ;;
  test)
    (cd kernels/gpu && timeout $(( $(left) > 60 ? 60 : $(left) )) ../../bin/dev/gpu.test -test.v -test.run 'TestMMQ|TestMultiRowMatMul' -test.timeout 120s) >"$o/test.txt" 2>&1
    echo "exit $?" >>"$sum"
    grep -E '^(--- |ok|PASS|FAIL|panic)|differs|error|worst' "$o/test.txt" | head -60 >>"$sum" ;;
  bench)
    (cd kernels/gpu && timeout $(( $(left) - 5 )) ../../bin/dev/gpu.test -test.run '^$' -test.bench "${BENCH:-BenchmarkMMQ}" -test.benchtime ${BENCHTIME:-50x} -test.timeout 300s) >"$o/bench.txt" 2>&1
    echo "exit $?" >>"$sum"
    grep -E '^Benchmark' "$o/bench.txt" | awk '{for(i=1;i<=NF;i++) if($(i)=="us/op") u=$(i-1); print $1, u}' >>"$sum"
    # the variant of each type with the least time summed over its runs
    best=$(grep '^BenchmarkMMQ' "$o/bench.txt" | awk '{for(i=1;i<=NF;i++) if($i=="us/op") u=$(i-1); split($1,a,"/"); v=a[5]; sub(/-[0-9]+$/,"",v); if (v ~ /^mmq/) s[a[2]" "v]+=u} END{for(k in s) print k, s[k]}' |
      sort -k1,1 -k3,3n | awk '!seen[$1]++{printf "%s%s=%s", (n++ ? "," : ""), tolower($1), substr($2,4)}')
    echo "best variants: $best" >>"$sum" ;;
  pipeline) # the serving engine's determinism test on the GPU (testdata from the repository at $REPO)
    d2=$(mktemp -d); mkdir -p "$d2/github.com/forge-llm" && ln -s "${REPO:-$PWD}" "$d2/github.com/forge-llm/forge"
    (cd "$d2" && timeout $(( $(left) > 70 ? 60 : $(left) - 10 )) "$OLDPWD/bin/dev/pipeline.test" -test.v -test.run 'TestGPUBatchInvariant' -test.timeout 100s) >"$o/pipeline.txt" 2>&1
    echo "exit $?" >>"$sum"
    grep -E '^(\s*--- |ok|PASS|FAIL|panic)' "$o/pipeline.txt" | head -20 >>"$sum" ;;
  step)
    wait
    tail -2 "$o/gen.txt" >>"$sum"
    for v in best old new; do
      [ "$(left)" -lt 25 ] && { echo "step $v: no time left" >>"$sum"; continue; }
      case $v in
      old) e=FORGE_TEST_GPU_MMQ=off ;;
      best) e=FORGE_TEST_GPU_MMQ=${best:-} ;;
      *) e=FORGE_X= ;;
      esac
      echo "step $v: $e" >>"$sum"
      env $e FORGE_BIG_MODEL=$big \
        timeout $(( $(left) - 3 )) bash -c "cd $d/github.com/forge-llm/forge/pipeline/model && $PWD/bin/dev/model.test -test.v -test.run TestGPUBatchStepBench -test.timeout 300s" >"$o/step-$v.txt" 2>&1
      echo "step $v: exit $?" >>"$sum"
      grep -E 'GPU-BATCH|^(--- |ok|FAIL|panic)' "$o/step-$v.txt" | sed 's/^ *//' >>"$sum"
      grep -E 'GPU-PROFILE' "$o/step-$v.txt" | sed 's/^ *//' | head -34 >>"$sum"
    done ;;
  esac
done
echo "== end at $(( $(date +%s) - t0 )) s" >>"$sum"
