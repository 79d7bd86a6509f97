#!/usr/bin/env bash
# One call on the GPU machine for everything GPU-side: unpack the binaries
# `make device` built (carried as bin/device.tar.xz, since the working tree
# that travels is limited), run the phases named on the command line, and
# pack every log into $OUT/h100.tgz (the machine returns few files).
#
#   tar -C bin -cJf bin/device.tar.xz device   # here, after make device
#   bench/h100.sh quick decode load benchload  # there
#
# quick: every GPU package's tests (bench/device.sh quick); decode: decode
# and prompt rates, 8B and 7B (bench/gpu-decode.sh); load: the load path on
# the 8B shape (bench/device.sh load); benchload: `forge bench load`, all
# four strategies, warm and cold, with the SVG timeline (issue 8).
set -uo pipefail
[ -f bin/device.tar.xz ] && tar -C bin -xJf bin/device.tar.xz
o=${OUT:-out}
mkdir -p "$o/logs"
for phase in "$@"; do
  s=$(date +%s)
  case $phase in
  quick) OUT=$o/logs/quick bash bench/device.sh quick >"$o/logs/quick.txt" 2>&1 ;;
  engine)
    d=$(mktemp -d); mkdir -p "$d/github.com/forge-llm" && ln -s "$PWD" "$d/github.com/forge-llm/forge"
    (cd "$d" && FORGE_REQUIRE_GPU=1 "$OLDPWD/bin/device/pipeline.test" -test.v -test.run EngineGPU -test.timeout 200s) >"$o/logs/engine.txt" 2>&1 ;;
  decode) OUT=$o/logs/decode bash bench/gpu-decode.sh bench >"$o/logs/decode.txt" 2>&1 ;;
  load) OUT=$o/logs/load bash bench/device.sh load >"$o/logs/load.txt" 2>&1 ;;
  benchload)
    f=/tmp/l8.gguf
    [ -f $f ] || bin/device/forge gen --preset llama3-8b --quant q4_k_m -o $f --progress plain >/dev/null 2>&1
    mkdir -p "$o/logs/benchload"
    dd if=$f of=/dev/null bs=16M iflag=direct 2>&1 | tail -1 >"$o/logs/benchload/disk.txt"
    bl() { bin/device/forge bench load -m $f --device gpu --runs ${RUNS:-3} --cache both "$@"; }
    bl --strategies ${STRATEGIES:-prefetch,eager,lazy,host-f32} --prompt-tokens 32 \
      --svg "$o/logs/benchload/timeline.svg" >"$o/logs/benchload/table.txt" 2>&1
    # Issue 9: prefetch against eager with a 512-token prompt.
    bl --strategies prefetch,eager --prompt-tokens 512 >"$o/logs/benchload/p512.txt" 2>&1 ;;
  esac
  echo "phase $phase: exit $?, $(( $(date +%s)-s )) s"
done
tar -C "$o" -czf "$o/h100.tgz" logs && rm -rf "$o/logs"
