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
  pipeline)
    d=$(mktemp -d); mkdir -p "$d/github.com/forge-llm" && ln -s "$PWD" "$d/github.com/forge-llm/forge"
    (cd "$d" && FORGE_REQUIRE_GPU=1 "$OLDPWD/bin/device/pipeline.test" -test.v -test.run GPU -test.timeout 300s) >"$o/logs/pipeline.txt" 2>&1 ;;
  big70) # the 70B shape: write it, then first token (warm) and decode
    f=/tmp/l70.gguf
    mkdir -p "$o/logs/big70"
    rm -f /tmp/l7.gguf
    s0=$(date +%s%N)
    bin/device/forge gen --preset llama3-70b --quant q4_k_m -o $f --progress plain >"$o/logs/big70/gen.txt" 2>&1
    echo "gen: exit $?, $(( ($(date +%s%N)-s0)/1000000 )) ms, $(stat -c %s $f) bytes" >>"$o/logs/big70/gen.txt"
    cat $f >/dev/null
    bin/device/forge bench load -m $f --device gpu --runs 2 --cache warm --strategies prefetch,eager --prompt-tokens 32 >"$o/logs/big70/load.txt" 2>&1
    d=$(mktemp -d); mkdir -p "$d/github.com/forge-llm" && ln -s "$PWD" "$d/github.com/forge-llm/forge"
    (cd "$d" && FORGE_REQUIRE_GPU=1 FORGE_BIG_MODEL=$f "$OLDPWD/bin/device/model.test" -test.v -test.run GPUDecodeBench -test.timeout 400s) >"$o/logs/big70/decode.txt" 2>&1 ;;
  floor) # the driver alone in a fresh process, next to forge on the tiny model
    cc -O2 -o /tmp/driver bench/floor/driver.c -ldl
    { for i in 1 2 3 4 5; do /tmp/driver; done
      for i in 1 2 3; do
        bin/device/forge -v run --device gpu -m gguf/testdata/stories260K-Q4_0.gguf -p "Once upon a time" -n 1 --temp 0 --progress plain 2>&1 >/dev/null |
          grep -oE '(context|kernels|warm)=[0-9.]+ms|^load:.*first token [0-9.]+m?s' | tr '\n' ' '; echo
      done
    } >"$o/logs/floor.txt" 2>&1 ;;
  why) # the device's own start-up times (forge -v) under each setting of $GRID, tiny and 8B
    for m in gguf/testdata/stories260K-Q4_0.gguf /tmp/l8.gguf; do
      for g in ${GRID:-default}; do
        for i in 1 2; do
          echo "== $m $g"
          env $([ $g = default ] && echo FORGE_X= || echo $g | tr , ' ') bin/device/forge -v run --device gpu -m $m -p "Once upon a time" -n 1 --temp 0 --progress plain 2>&1 >/dev/null |
            grep -E 'gpu: backend|device open|^load:' | sed -E 's/^time=[^ ]+ level=DEBUG //; s/ · prompt.*//'
        done
      done
    done >"$o/logs/why.txt" 2>&1 ;;
  grid) # forge bench load (prefetch, warm) of $GRID_MODELS under each setting of $GRID (VAR=value or default)
    f=/tmp/l8.gguf
    [ -f $f ] || bin/device/forge gen --preset llama3-8b --quant q4_k_m -o $f --progress plain >/dev/null 2>&1
    for m in ${GRID_MODELS:-$f}; do
      for g in ${GRID:-default FORGE_GPU_UPLOAD=st=16,rn=32}; do
        echo "== $m $g"
        env $([ $g = default ] && echo FORGE_X= || echo $g | tr , ' ') bin/device/forge bench load -m $m --device gpu --runs ${RUNS:-6} \
          --cache warm --strategies prefetch --prompt-tokens 32 2>&1 | tail -1
      done
    done >"$o/logs/grid.txt" 2>&1 ;;
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
