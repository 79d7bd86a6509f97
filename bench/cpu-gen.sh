#!/usr/bin/env bash
# CPU prompt/decode rates against llama.cpp (issue 23) and the batched
# engine's gain with 8 clients (issue 18's CPU item), on this machine, as
# one markdown report: bench/cpu-gen.sh [REPORT] (default
# bench/results/2026-11-25-cpu-gen.md). Run from the repository root on a
# quiet machine: every figure is a rate, and other processes on the cores
# lower it (the load average is recorded before and after).
#
#   - forge bench gen --device cpu -t $THREADS -p 128 -n 64 on the bench86m
#     shape (forge gen --preset bench86m) in Q4_K_M and Q8_0, with
#     llama-bench as its --peer (bench/llamacpp.sh fetches Debian's build if
#     bench/llamacpp is missing): both runtimes' rows in one table, forge's
#     first, then the ratios;
#   - llama-bench once more with each CPU backend variant of that package
#     that this processor can run and that the wrapper does not pick, so
#     the choice of variant is visible;
#   - BenchmarkEngineClients (pipeline): tokens/s summed over 1 and 8
#     clients with continuous batching, and the ratio.
#
# THREADS (default 2), REPS (-r, default 5), ENGINE_ITERS (default 5);
# NATIVE_BENCH: a natively built llama-bench to compare with too.
set -euo pipefail
report=${1:-bench/results/2026-11-25-cpu-gen.md}
threads=${THREADS:-2}
reps=${REPS:-5}
iters=${ENGINE_ITERS:-5}
root=$PWD
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench/results' || echo +changes)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

[ -x bench/llamacpp/llama ] || bench/llamacpp.sh >&2
go build -o "$tmp/forge" ./cmd/forge
"$tmp/forge" gen --preset bench86m --quant q4_k_m -o "$tmp/bench86m-q4_k_m.gguf" --progress plain >&2
"$tmp/forge" gen --preset bench86m --quant q8_0 -o "$tmp/bench86m-q8_0.gguf" --progress plain >&2
models=("$tmp/bench86m-q4_k_m.gguf" "$tmp/bench86m-q8_0.gguf")

flags=$(grep -m1 '^flags' /proc/cpuinfo)
backends=$root/bench/llamacpp/root/usr/lib/x86_64-linux-gnu/ggml/backends0
# The variant the wrapper (bench/llamacpp/llama) picks, as it picks it.
case "$flags" in
  *avx512_vnni*) picked=libggml-cpu-icelake.so ;;
  *avx512f*) picked=libggml-cpu-skylakex.so ;;
  *avx2*) picked=libggml-cpu-haswell.so ;;
  *) picked=libggml-cpu-x64.so ;;
esac

load() { cut -d' ' -f1-3 /proc/loadavg; }
load0=$(load)
gen=$("$tmp/forge" bench gen --device cpu -t "$threads" -p 128 -n 64 -r "$reps" -m "${models[0]}" -m "${models[1]}" \
  --peer "$root/bench/llamacpp/llama llama-bench" --json)
mktable() { python3 -c '
import json, sys
rows = json.load(sys.stdin)
print("| runtime | model | test | t/s |")
print("| --- | --- | --- | ---: |")
for r in rows:
    print("| %s | %s | %s | %.1f ± %.1f |" % (r["runtime"], r["model"], r["test"], r["avg_ts"], r["stddev_ts"]))
print()
print("| model | test | forge / llama.cpp |")
print("| --- | --- | ---: |")
peer = {(r["model"], r["test"]): r["avg_ts"] for r in rows if r["runtime"] != "forge"}
for r in rows:
    if r["runtime"] == "forge" and (r["model"], r["test"]) in peer:
        print("| %s | %s | %.2f |" % (r["model"], r["test"], r["avg_ts"] / peer[(r["model"], r["test"])]))
'; }
table=$(printf '%s' "$gen" | mktable)
# NATIVE_BENCH: a llama-bench built on this machine (GGML_NATIVE=ON), in a
# second run beside forge's, since the Debian build's kernels are chosen
# among a few generic variants.
table2=""
if [ -n "${NATIVE_BENCH:-}" ]; then
  gen2=$("$tmp/forge" bench gen --device cpu -t "$threads" -p 128 -n 64 -r "$reps" -m "${models[0]}" -m "${models[1]}" \
    --peer "$NATIVE_BENCH" --json)
  table2=$(printf '%s' "$gen2" | mktable)
fi
load1=$(load)

# The other variants this CPU can run, for reference (Zen 4, for one, runs
# both icelake and zen4).
variants=""
for v in zen4 icelake skylakex haswell; do
  so=libggml-cpu-$v.so
  [ "$so" = "$picked" ] && continue
  case "$v" in
    zen4) [[ "$flags" == *avx512_bf16* && "$flags" == *avx512_vnni* ]] || continue ;;
    icelake) [[ "$flags" == *avx512_vnni* ]] || continue ;;
    skylakex) [[ "$flags" == *avx512f* ]] || continue ;;
    haswell) [[ "$flags" == *avx2* ]] || continue ;;
  esac
  for m in "${models[@]}"; do
    out=$(GGML_BACKEND_PATH=$backends/$so bench/llamacpp/llama llama-bench -m "$m" -t "$threads" -p 128 -n 64 -r "$reps" -o json 2>/dev/null |
      python3 -c 'import json,sys; print(" / ".join("%s %.1f" % ("pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"], r["avg_ts"]) for r in json.load(sys.stdin)))' || echo failed)
    variants+="| $v | $(basename "$m") | $out |"$'\n'
  done
done

engine=$(go test -run '^$' -bench 'BenchmarkEngineClients$' -benchtime "${iters}x" ./pipeline/ 2>/dev/null | grep '^BenchmarkEngineClients' || true)
load2=$(load)

mkdir -p "$(dirname "$report")"
{
  echo "# CPU generation: forge against llama.cpp, and batching with 8 clients"
  echo
  echo "Written by \`bench/cpu-gen.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit."
  echo
  echo "- CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; relevant flags:" \
    "$(for f in avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512vbmi; do [[ " $flags " == *" $f "* ]] && printf '%s ' $f; done)"
  echo "- load average (1/5/15 min): $load0 before, $load1 after bench gen, $load2 after the engine benchmark"
  echo "- llama.cpp: $(bench/llamacpp/llama llama-completion --version 2>&1 | head -1) (Debian sid package, bench/llamacpp.sh), CPU backend" \
    "variant \`$picked\` (the wrapper's choice for these flags)"
  echo "- $(go version)"
  echo
  echo "## Prompt (pp128) and decode (tg64), $threads threads, bench86m, -r $reps"
  echo
  echo "\`forge bench gen --device cpu -t $threads -p 128 -n 64 -r $reps -m Q4_K_M -m Q8_0 --peer 'bench/llamacpp/llama llama-bench'\`"
  echo
  echo "$table"
  echo
  if [ -n "$table2" ]; then
    echo "The same against llama-bench built here (\`${NATIVE_LABEL:-$NATIVE_BENCH}\`), in a second run:"
    echo
    echo "$table2"
    echo
  fi
  if [ -n "$variants" ]; then
    echo "llama-bench with the other backend variants this CPU runs:"
    echo
    echo "| variant | model | t/s |"
    echo "| --- | --- | --- |"
    printf '%s' "$variants"
    echo
  fi
  echo "## Continuous batching on the CPU: 8 clients against 1"
  echo
  echo "\`go test -run '^\$' -bench 'BenchmarkEngineClients\$' -benchtime ${iters}x ./pipeline/\` (bench86m Q4_K_M, 32 tokens per"
  echo "client, the four cases interleaved in every iteration):"
  echo
  echo '```'
  echo "$engine"
  echo '```'
} >"$report"
cat "$report"
