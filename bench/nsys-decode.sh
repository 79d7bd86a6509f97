#!/usr/bin/env bash
# Where a decode step's time goes inside its recorded graph, from Nsight
# Systems (every kernel node's start and duration as it ran in the graph,
# unlike ncu's kernels timed alone):
#
#   PRESETS="qwen3-30b-a3b" bash bench/nsys-decode.sh     # carrying .carry/forge.xz
#
# For each preset it writes the Q4_K_M file, runs `forge bench gen -p 8 -n
# 64 -r 1` under `nsys profile --cuda-graph-trace=node`, and summarizes the
# last 32 decode steps into $OUT/nsys-<preset>.txt: per kernel, launches
# and microseconds per step in the graph, the sum of the kernels against
# the step's wall time (the rest is gaps between kernels).
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out" bin
xz -dc .carry/forge.xz >bin/forge && chmod +x bin/forge
export FORGE_CACHE_DIR=/tmp/forge-kernels
nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: $nsys"
for pr in ${PRESETS:-qwen3-30b-a3b}; do
  f=/tmp/$pr.gguf
  bin/forge gen --preset "$pr" --quant q4_k_m --valid-utf8 -o $f --progress plain >/tmp/gen.txt 2>&1 || { tail -3 /tmp/gen.txt; continue; }
  bin/forge bench gen -m $f --device gpu -p 8 -n 128 -r 3 >"$out/plain-$pr.txt" 2>&1
  timeout 240 "$nsys" profile --cuda-graph-trace=node --trace=cuda --force-overwrite true -o /tmp/ns-$pr \
    bin/forge bench gen -m $f --device gpu -p 8 -n 64 -r 1 >"$out/nsys-run-$pr.txt" 2>&1
  echo "nsys exit $?"
  "$nsys" stats --report cuda_gpu_trace --format csv --force-export true -o /tmp/tr-$pr /tmp/ns-$pr.nsys-rep >/dev/null 2>&1
  ls /tmp/tr-$pr* 2>/dev/null
  python3 - /tmp/tr-${pr}_cuda_gpu_trace.csv "${MARK:-mv_q6_k_c2}" >"$out/nsys-$pr.txt" <<'PY'
import csv, sys, collections
rows = []
with open(sys.argv[1]) as fh:
    for r in csv.DictReader(fh):
        name = r.get("Name", "")
        if not r.get("Start (ns)") or not r.get("Duration (ns)") or "[CUDA" in name:
            continue
        rows.append((int(r["Start (ns)"]), int(r["Duration (ns)"]), name.split("(")[0]))
rows.sort()
mark = sys.argv[2]
marks = [i for i, (_, _, n) in enumerate(rows) if n == mark]
print("kernels:", len(rows), "marks (%s):" % mark, len(marks))
steps = list(zip(marks[-33:-1], marks[-32:]))  # the last 32 whole steps, mark to mark
per = collections.defaultdict(lambda: [0, 0])
walls, sums = [], []
for a, b in steps:
    seg = rows[a + 1:b + 1]
    walls.append((rows[b][0] + rows[b][1] - (rows[a][0] + rows[a][1])) / 1000)
    sums.append(sum(d for _, d, _ in seg) / 1000)
    for _, d, n in seg:
        per[n][0] += 1
        per[n][1] += d
ns = len(steps)
print("steps: %d, wall %.1f us/step, kernels %.1f us/step, %.1f launches/step" % (ns, sum(walls) / ns, sum(sums) / ns, sum(v[0] for v in per.values()) / ns))
print("| kernel | launches a step | us a step | us each |")
print("| --- | --- | --- | --- |")
for n, (c, d) in sorted(per.items(), key=lambda kv: -kv[1][1]):
    print("| %s | %.0f | %.1f | %.2f |" % (n, c / ns, d / ns / 1000, d / c / 1000))
PY
  cat "$out/nsys-$pr.txt" | head -40
  rm -f $f
done
