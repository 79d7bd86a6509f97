#!/usr/bin/env bash
# Per-kernel times of a mixture's decode steps on the GPU machine, from
# Nsight Compute (each kernel timed alone, clocks left alone), to find
# where a step's time goes next to the sum of its kernels:
#
#   PRESET=qwen3-30b-a3b bash bench/ncu-decode.sh     # carrying .carry/forge.xz
#
# It writes the Q4_K_M file, runs `forge bench gen -p 8 -n 6 -r 1` under
# ncu (every kernel of the run, graph nodes one by one), and summarizes the
# kernels after the last prompt into $OUT/ncu-summary.txt: per kernel name,
# launches and microseconds per decode step; the raw CSV is $OUT/ncu.csv.xz.
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out" bin
xz -dc .carry/forge.xz >bin/forge && chmod +x bin/forge
f=/tmp/${PRESET:-qwen3-30b-a3b}.gguf
export FORGE_CACHE_DIR=/tmp/forge-kernels
bin/forge gen --preset "${PRESET:-qwen3-30b-a3b}" --quant q4_k_m -o $f --progress plain >/tmp/gen.txt 2>&1 || { tail -3 /tmp/gen.txt; exit 1; }
bin/forge bench gen -m $f --device gpu -p 8 -n 6 -r 1 >"$out/plain.txt" 2>&1
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $ncu"
timeout 480 "$ncu" --clock-control none ${NCU_FLAGS:-} --graph-profiling node --metrics gpu__time_duration.sum --csv --log-file /tmp/ncu.csv \
  bin/forge bench gen -m $f --device gpu -p 8 -n 6 -r 1 >"$out/ncu-run.txt" 2>&1
echo "ncu exit $?"
python3 - /tmp/ncu.csv >"$out/ncu-summary.txt" <<'PY'
import csv, sys, collections
rows = []
with open(sys.argv[1]) as fh:
    lines = [l for l in fh if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") == "gpu__time_duration.sum":
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "")
        us = v / 1000 if unit in ("nsecond", "ns") else v if unit in ("usecond", "us") else v * 1000
        rows.append((int(r["ID"]), r["Kernel Name"].split("(")[0], us, r.get("Grid Size", ""), r.get("Block Size", "")))
rows.sort()
print("kernels profiled:", len(rows))
# The decode steps: everything after the last launch of a prompt-only kernel.
names = [n for _, n, _, _, _ in rows]
last_prompt = max((i for i, n in enumerate(names) if n.startswith(("moemmq", "mmq", "attn_prefill", "attn_prompt", "gather_rows"))), default=-1)
dec = rows[last_prompt + 1:]
steps = max(1, sum(1 for r in dec if r[1] in ("moe_route", "moe_router_f32")) // 48)
print("decode kernels after the last prompt kernel:", len(dec), "steps (moe_route/48):", steps)
agg = collections.OrderedDict()
for _, n, us, g, b in dec:
    a = agg.setdefault(n, [0, 0.0, g, b])
    a[0] += 1; a[1] += us
tot = sum(a[1] for a in agg.values())
print(f"sum of kernel times per step: {tot/steps:.1f} us over {len(dec)/steps:.0f} launches")
for n, (c, us, g, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{n:40s} {c/steps:6.1f} launches {us/steps:8.1f} us/step  {us/c:6.2f} us each  grid {g} block {b}")
PY
xz -T0 -c /tmp/ncu.csv >"$out/ncu.csv.xz"
tail -5 "$out/plain.txt"
cat "$out/ncu-summary.txt" | head -40
