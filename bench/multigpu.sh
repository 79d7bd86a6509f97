#!/usr/bin/env bash
# Issue 25 on a machine with two GPUs (the run tool's nvidia-h100-x2), in
# one call of under 9 minutes. Nothing is built there: build here first,
#
#   bench/multigpu.sh build     # CGO_ENABLED=0 forge, pipeline.test, model.test, rocm.test → bin/multigpu.tar.xz
#
# then, carrying bin/multigpu.tar.xz (and .carry/llama-bin.* for llama.cpp's
# `-sm layer` decode, when present), from the repository root there:
#
#   bench/multigpu.sh           # summary on stdout and in $OUT/summary, logs in $OUT/logs
#
# 1. The split tests on the GPUs: rocm.test TestPeerCopy (two contexts of
#    card 0, and card 0 to card 1), model.test TestGPUSplit (two contexts of
#    card 0: logits of a split equal the single backend's, op by op and
#    with recorded stages) and pipeline.test TestGPUSplit* over gpu:0,1
#    (greedy tokens equal one GPU's: stories260K, K-quant synth with
#    rope_freqs, Qwen2; every strategy; faults), then over gpu:0,0.
# 2. The 8B shape (forge gen llama3-8b q4_k_m): 32 greedy tokens on gpu:0
#    and on gpu:0,1 split 50/50, compared.
# 3. The 70B shape at Q4_K_M (written in the background during 1-2),
#    page cache warm: forge bench load on one GPU and on two (first token,
#    load rate), decode tg64 on one and two (forge bench gen), llama.cpp's
#    llama-bench -sm layer on the same two GPUs where its binaries came.
# 4. A Q8_0 model that does not fit one GPU, on two: the 70B shape
#    (~75 GB) where that exceeds GPU 0's memory, else llama3-70b-100l (the
#    70B's blocks × 100, ~93 GB; the 70B at Q8_0 fits one 80 GiB card).
#    It is first tried on one GPU (expected to fail for lack of memory),
#    then run on two. Skipped when the call has run too long for it
#    (Q8=auto, the default: the clock at that point must leave ~3.5 min);
#    Q8=1 forces it, Q8=0 skips it. Q8_SHAPE names the preset instead.
#
# RUNS (default 3) is forge bench load's runs per device setting; PARTS=tests
# stops after parts 1 and 2.
set -uo pipefail
t0=$(date +%s)
elapsed() { echo $(($(date +%s) - t0)); }

if [ "${1:-}" = build ]; then
  set -e
  d=$(mktemp -d)
  CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$d/forge" ./cmd/forge
  CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o "$d/pipeline.test" ./pipeline
  CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o "$d/model.test" ./pipeline/model
  CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o "$d/rocm.test" ./rocm
  mkdir -p bin
  tar -C "$d" -cf - forge pipeline.test model.test rocm.test | xz -T0 -6 >bin/multigpu.tar.xz
  rm -rf "$d"
  ls -la bin/multigpu.tar.xz
  exit 0
fi

out=${OUT:-out}
logs=$out/logs
mkdir -p "$logs"
sum=$out/summary
: >"$sum"
say() { echo "$*" | tee -a "$sum"; }
bin=/tmp/mg
mkdir -p $bin
tar -C $bin -xJf bin/multigpu.tar.xz || { say "no bin/multigpu.tar.xz (run bench/multigpu.sh build here first)"; exit 1; }
export FORGE_REQUIRE_GPU=1 FORGE_CACHE_DIR=${FORGE_CACHE_DIR:-/tmp/forge-kernels}
runs=${RUNS:-3}
{
  date -u
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -4
  echo "cores $(nproc), $(free -g | awk '/Mem/{print $2}') GiB RAM, /tmp: $(df -h /tmp | awk 'NR==2{print $4}') free"
} 2>&1 | tee -a "$sum"
ngpu=$(nvidia-smi -L | wc -l)
[ "$ngpu" -ge 2 ] || say "WARNING: $ngpu GPU(s): the two-GPU parts will fail"

f8=/tmp/mg-l8.gguf f70=/tmp/mg-l70.gguf
gen() { # preset quant file log
  local s=$(date +%s%N)
  $bin/forge gen --preset "$1" --quant "$2" -o "$3" --progress plain >"$4" 2>&1
  local rc=$?
  local e=$(date +%s%N) n=$(stat -c %s "$3" 2>/dev/null || echo 0)
  echo "gen $1 $2: exit $rc, $n bytes in $(((e - s) / 1000000)) ms ($((n / ((e - s) / 1000 + 1))) MB/s)" >>"$4"
  tail -1 "$4"
}
[ "${PARTS:-all}" != 70b ] && say "$(gen llama3-8b q4_k_m $f8 $logs/gen-8b.txt)"
# The 70B file is written while the tests run (they use the GPUs, the
# writer the CPUs and the disk).
genpid=
if [ "${PARTS:-all}" != tests ]; then
  [ "${PARTS:-all}" = 70b ] && Q8=${Q8:-0}
  gen llama3-70b q4_k_m $f70 $logs/gen-70b.txt >/dev/null &
  genpid=$!
fi

# 1. Tests. Built with -trimpath, a test binary finds gguf/testdata at
# github.com/forge-llm/forge/gguf/testdata under its working directory.
wd=$(mktemp -d)
mkdir -p "$wd/github.com/forge-llm" && ln -s "$PWD" "$wd/github.com/forge-llm/forge"
test_run() { # label binary pattern env…
  local label=$1 b=$2 pat=$3
  shift 3
  (cd "$wd" && env "$@" $bin/$b -test.v -test.run "$pat" -test.timeout 300s) >"$logs/$label.txt" 2>&1
  local rc=$?
  say "test $label: exit $rc ($(grep -cE '^\s*--- PASS' "$logs/$label.txt") passed, $(grep -cE '^\s*--- FAIL' "$logs/$label.txt") failed, $(grep -cE '^\s*--- SKIP' "$logs/$label.txt") skipped)"
  grep -E '^\s*--- FAIL|^panic' "$logs/$label.txt" | head -5 | tee -a "$sum"
}
if [ "${PARTS:-all}" != 70b ]; then # PARTS=70b: part 3 (and 4) only
test_run rocm-peer rocm.test '^TestPeerCopy$' FORGE_X=
test_run model-split model.test '^TestGPUSplit$' FORGE_X=
test_run pipeline-split-2gpu pipeline.test '^TestGPUSplit' FORGE_SPLIT_DEVICE=gpu:0,1
test_run pipeline-split-1card pipeline.test '^TestGPUSplitTokens$' FORGE_SPLIT_DEVICE=gpu:0,0
say "tests done at $(elapsed) s"

# 2. The 8B shape: greedy tokens on one GPU and split 50/50 over two.
cat $f8 >/dev/null
tokens() { # device [split]
  local args=(run -m $f8 -p "Once upon a time" -n 32 --temp 0 --json --progress plain --device "$1")
  [ -n "${2:-}" ] && args+=(--split "$2")
  $bin/forge "${args[@]}" 2>>"$logs/run-8b.txt" | tee -a "$logs/run-8b.txt" | grep -oE '"tokens":\[[0-9,]*\]'
}
one=$(tokens gpu:0)
two=$(tokens gpu:0,1 1,1)
if [ -n "$one" ] && [ "$one" = "$two" ]; then
  say "8B Q4_K_M greedy, 32 tokens: gpu:0,1 split 50/50 = gpu:0 (equal)"
else
  say "8B Q4_K_M greedy, 32 tokens: DIFFER  one=$one  two=$two"
fi
rm -f $f8
fi
if [ "${PARTS:-all}" = tests ]; then # PARTS=tests: parts 1 and 2 only, for a short call
  say "stopped after the tests and the 8B check (PARTS=tests) at $(elapsed) s"
  exit 0
fi

# 3. The 70B shape at Q4_K_M.
wait $genpid
say "$(tail -1 $logs/gen-70b.txt)"
cat $f70 >/dev/null
say "70B file warm at $(elapsed) s"
# median of a bench load column (7: context ms, 9: resident ms, 10: first token ms, 14: load GB/s, 15: link GB/s) of the prefetch warm row
col() { awk -v c="$2" '$1=="prefetch" && $2=="warm" {split($c, a, "/"); print a[2]}' "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "n/a" }'; }
# Log names: 1 for gpu:0, 2 for gpu:0,1 (no ':' or ',' in files that come
# back). UPLOADS (space-separated --gpu-upload settings, e.g. "st=16") adds
# runs of both with those settings, logged as load-1-<setting>.txt.
for n in 1 2; do
  d=gpu:0
  [ $n = 2 ] && d=gpu:0,1
  $bin/forge bench load -m $f70 --device $d --runs "$runs" --cache warm --strategies prefetch --prompt-tokens 32 >"$logs/load-$n.txt" 2>&1
done
for u in ${UPLOADS:-}; do
  for n in 1 2; do
    d=gpu:0
    [ $n = 2 ] && d=gpu:0,1
    $bin/forge bench load -m $f70 --device $d --gpu-upload "$u" --runs "$runs" --cache warm --strategies prefetch --prompt-tokens 32 >"$logs/load-$n-${u//[=,]/_}.txt" 2>&1
    say "70B bench load $d --gpu-upload $u: context $(col "$logs/load-$n-${u//[=,]/_}.txt" 7) ms, resident $(col "$logs/load-$n-${u//[=,]/_}.txt" 9) ms, first token $(col "$logs/load-$n-${u//[=,]/_}.txt" 10) ms, load $(col "$logs/load-$n-${u//[=,]/_}.txt" 14) GB/s"
  done
done
ft1=$(col "$logs/load-1.txt" 10) ft2=$(col "$logs/load-2.txt" 10)
lr1=$(col "$logs/load-1.txt" 14) lr2=$(col "$logs/load-2.txt" 14)
say "70B Q4_K_M context / resident ms: gpu:0 $(col "$logs/load-1.txt" 7) / $(col "$logs/load-1.txt" 9), gpu:0,1 $(col "$logs/load-2.txt" 7) / $(col "$logs/load-2.txt" 9)"
lk1=$(col "$logs/load-1.txt" 15) lk2=$(col "$logs/load-2.txt" 15)
say "70B Q4_K_M link rate (bytes / (resident - context)): gpu:0 ${lk1:-?} GB/s, gpu:0,1 ${lk2:-?} GB/s (× $(ratio "$lk2" "$lk1"))"
# SPLITS (space-separated --split shares, e.g. "37,43") adds split runs with
# those shares; one debug run (-v) logs the split's opening step by step.
for sp in ${SPLITS:-}; do
  $bin/forge bench load -m $f70 --device gpu:0,1 --split "$sp" --runs "$runs" --cache warm --strategies prefetch --prompt-tokens 32 >"$logs/load-2-split-${sp//[=,.]/_}.txt" 2>&1
  say "70B bench load gpu:0,1 --split $sp: context $(col "$logs/load-2-split-${sp//[=,.]/_}.txt" 7) ms, resident $(col "$logs/load-2-split-${sp//[=,.]/_}.txt" 9) ms, first token $(col "$logs/load-2-split-${sp//[=,.]/_}.txt" 10) ms"
done
$bin/forge -v run --device gpu:0,1 -m $f70 -p "Once upon a time" -n 2 --temp 0 --progress plain >"$logs/run-v-split.txt" 2>&1
grep -E "driver open|split device open|first token" "$logs/run-v-split.txt" | head -8 | tee -a "$sum"
say "70B Q4_K_M bench load (prefetch, warm, median of $runs): first token gpu:0 ${ft1:-?} ms, gpu:0,1 ${ft2:-?} ms (× $(ratio "$ft2" "$ft1"), target ≤ 0.7)"
say "70B Q4_K_M load rate: gpu:0 ${lr1:-?} GB/s, gpu:0,1 ${lr2:-?} GB/s (× $(ratio "$lr2" "$lr1"), target ≥ 1.6)"
tg() { awk -F'|' '{for (i = 1; i <= NF; i++) if ($i ~ /tg64/) {v = $(i + 1); gsub(/^ +| +$/, "", v); print v; exit}}' "$1"; }
for n in 1 2; do
  [ "${TG:-1}" = 0 ] && break # TG=0: no decode runs (a call without llama.cpp's)
  d=gpu:0
  [ $n = 2 ] && d=gpu:0,1
  $bin/forge bench gen -m $f70 --device $d -p 0 -n 64 -r 2 >"$logs/tg-$n.txt" 2>&1
done
tg1=$(tg "$logs/tg-1.txt") tg2=$(tg "$logs/tg-2.txt")
say "70B Q4_K_M decode tg64: gpu:0 ${tg1:-?} tok/s, gpu:0,1 ${tg2:-?} tok/s"
if [ "${LLAMA:-auto}" != 0 ] && ls .carry/llama-bin.* >/dev/null 2>&1; then
  mkdir -p /tmp/llama && cat .carry/llama-bin.* | xz -dc | tar -C /tmp/llama -xf -
  CUDA_VISIBLE_DEVICES=0,1 /tmp/llama/bin/llama-bench -m $f70 -ngl 99 -sm layer -p 0 -n 64 -r 2 -o md >"$logs/llama-bench.txt" 2>&1
  tgl=$(tg "$logs/llama-bench.txt")
  say "llama.cpp llama-bench -sm layer on 0,1: tg64 ${tgl:-? (see logs/llama-bench.txt)} tok/s; forge gpu:0,1 / llama.cpp = $(ratio "${tg2%% *}" "${tgl%% *}") (target ≥ 1.0)"
else
  say "llama.cpp: no .carry/llama-bin.* carried (or LLAMA=0): its -sm layer decode not run"
fi
rm -f $f70
say "70B part done at $(elapsed) s"

# 4. A Q8_0 model that needs two GPUs.
q8=${Q8:-auto}
if [ "$q8" = auto ]; then
  if [ "$(elapsed)" -le 330 ]; then q8=1; else q8=0; fi
fi
if [ "$q8" = 1 ]; then
  mem0=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0) # MiB
  shape=${Q8_SHAPE:-}
  if [ -z "$shape" ]; then
    # The 70B at Q8_0 is 74.96e9 bytes: more than GPU 0 holds, or not.
    if [ $((74960000000 + 3 * 1073741824)) -gt $((mem0 * 1048576)) ]; then shape=llama3-70b; else shape=llama3-70b-100l; fi
  fi
  fq=/tmp/mg-q8.gguf
  say "$(gen $shape q8_0 $fq $logs/gen-q8.txt) (GPU 0: $mem0 MiB)"
  cat $fq >/dev/null
  $bin/forge run --device gpu:0 -m $fq -p "Once upon a time" -n 4 --temp 0 --json --progress plain >"$logs/q8-gpu0.txt" 2>&1
  rc=$?
  say "Q8_0 $shape on gpu:0 alone: exit $rc: $(grep -v '^{' "$logs/q8-gpu0.txt" | tail -1 | cut -c1-220)"
  $bin/forge run --device gpu:0,1 -m $fq -p "Once upon a time" -n 32 --temp 0 --json --progress plain >"$logs/q8-split.txt" 2>&1
  rc=$?
  say "Q8_0 $shape on gpu:0,1: exit $rc $(grep -oE '"(first_token_ms|decode_tok_s|ready_ms)":[0-9.]+' "$logs/q8-split.txt" | tr '\n' ' ')"
  rm -f $fq
else
  say "Q8_0 part skipped (Q8=${Q8:-auto}, $(elapsed) s elapsed)"
fi
say "total $(elapsed) s"
