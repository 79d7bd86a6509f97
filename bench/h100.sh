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
# four strategies, warm and cold, with the SVG timeline (issue 8); floor:
# the driver alone and bench/floor/overlap.c; why: `forge -v run` start-up
# lines; grid / abgrid: settings of $GRID (VAR=value, commas for several;
# or forge flags, --flag=value, + between several)
# in blocks / interleaved run by run; mixed: prefetch next to host-f32 and
# eager; aftermath: the driver right after a forge process and after idling;
# big70: the 70B shape.
set -uo pipefail
# A $GRID setting: "default", environment variables (VAR=value, commas
# between several) or forge flags (--flag=value, + between several).
grid_env() { case $1 in default | --*) ;; *) echo "$1" | tr , ' ' ;; esac; }
grid_flags() { case $1 in --*) echo "$1" | tr + ' ' ;; esac; }
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
    (cd "$d" && FORGE_REQUIRE_GPU=1 "$OLDPWD/bin/device/pipeline.test" -test.v -test.run GPU -test.bench GPULoadTiming -test.benchtime 1x -test.timeout 300s) >"$o/logs/pipeline.txt" 2>&1 ;;
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
      # Copies next to module loads, the cuBLAS dlopen and cublasCreate
      # (the kernel cache is filled by the runs above).
      f=/tmp/l8.gguf
      [ -f $f ] || bin/device/forge gen --preset llama3-8b --quant q4_k_m -o $f --progress plain >/dev/null 2>&1
      cat $f >/dev/null
      cc -O2 -I/usr/local/cuda/include -o /tmp/overlap bench/floor/overlap.c -L/usr/local/cuda/lib64/stubs -lcuda -ldl -lpthread &&
        for i in 1 2; do /tmp/overlap $f "${FORGE_CACHE_DIR:-$HOME/.cache/forge/kernels}"/*.bin; done
    } >"$o/logs/floor.txt" 2>&1 ;;
  why) # the device's own start-up times (forge -v) under each setting of $GRID, tiny and 8B
    for m in gguf/testdata/stories260K-Q4_0.gguf /tmp/l8.gguf; do
      for g in ${GRID:-default}; do
        for i in 1 2; do
          echo "== $m $g"
          env FORGE_X= $(grid_env $g) bin/device/forge -v run --device gpu -m $m -p "Once upon a time" -n 1 --temp 0 --progress plain $(grid_flags $g) 2>&1 >/dev/null |
            grep -E 'gpu: backend|device open|reserving|device uploads|cuBLAS|^load:' | sed -E 's/^time=[^ ]+ level=DEBUG //; s/ · prompt.*//'
        done
      done
    done >"$o/logs/why.txt" 2>&1 ;;
  grid) # forge bench load (prefetch, warm) of $GRID_MODELS under each setting of $GRID (VAR=value or default)
    f=/tmp/l8.gguf
    [ -f $f ] || bin/device/forge gen --preset llama3-8b --quant q4_k_m -o $f --progress plain >/dev/null 2>&1
    for m in ${GRID_MODELS:-$f}; do
      for g in ${GRID:-default --gpu-upload=st=16,rn=32}; do
        echo "== $m $g"
        env FORGE_X= $(grid_env $g) bin/device/forge bench load -m $m --device gpu --runs ${RUNS:-6} \
          --cache warm --strategies prefetch --prompt-tokens 32 $(grid_flags $g) 2>&1 | tail -1
      done
    done >"$o/logs/grid.txt" 2>&1 ;;
  mixed) # the warm 8B, prefetch next to host-f32 and next to eager, run by run
    f=/tmp/l8.gguf
    [ -f $f ] || bin/device/forge gen --preset llama3-8b --quant q4_k_m -o $f --progress plain >/dev/null 2>&1
    for st in prefetch,host-f32 prefetch,eager; do
      echo "== $st"
      bin/device/forge bench load -m $f --device gpu --runs ${RUNS:-4} --cache warm --strategies $st --prompt-tokens 32
    done >"$o/logs/mixed.txt" 2>&1 ;;
  p512) # issue 9: prefetch against eager, 512-token prompt, warm, under each setting of $GRID
    f=/tmp/l8.gguf
    [ -f $f ] || bin/device/forge gen --preset llama3-8b --quant q4_k_m -o $f --progress plain >/dev/null 2>&1
    for g in ${GRID:-default}; do
      echo "== $g"
      env FORGE_X= $(grid_env $g) bin/device/forge bench load -m $f --device gpu --runs ${RUNS:-3} \
        --cache warm --strategies prefetch,eager --prompt-tokens 512 $(grid_flags $g) 2>&1 | tail -2
    done >"$o/logs/p512.txt" 2>&1 ;;
  abgrid) # the settings of $GRID interleaved run by run ($RUNS rounds; forge bench load-once, warm 8B),
    # for each prompt length in $PROMPTS and strategy in $STRATS; min/median/max by setting
    f=/tmp/l8.gguf
    [ -f $f ] || bin/device/forge gen --preset llama3-8b --quant q4_k_m -o $f --progress plain >/dev/null 2>&1
    cat $f >/dev/null
    for r in $(seq ${RUNS:-6}); do
      for p in ${PROMPTS:-32}; do
        for st in ${STRATS:-prefetch}; do
          for g in ${GRID:-default}; do
            echo "$g $p $st $(env FORGE_X= $(grid_env $g) bin/device/forge bench load-once -m $f \
              --strategy $st --prompt-tokens $p --device gpu --fork-ns $(date +%s%N) $(grid_flags $g) 2>/dev/null | tail -1)"
          done
        done
      done
    done >"$o/logs/abgrid.raw" 2>&1
    python3 - "$o/logs/abgrid.raw" >"$o/logs/abgrid.txt" 2>&1 <<'PY'
import collections, json, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    g, p, st, js = line.rstrip("\n").split(" ", 3)
    try:
        runs[(int(p), st, g)].append(json.loads(js))
    except ValueError:
        print("unreadable run:", line[:300])
def mmm(rs, k):
    xs = sorted(r.get(k, 0) for r in rs)
    return "%.0f/%.0f/%.0f" % (xs[0], statistics.median(xs), xs[-1])
for (p, st, g), rs in sorted(runs.items()):
    print("prompt %4d %-9s %-52s n=%d  context %s  ready %s  resident %s  first token %s" % (p, st, g, len(rs),
          mmm(rs, "context_ms"), mmm(rs, "ready_ms"), mmm(rs, "resident_ms"), mmm(rs, "first_token_ms")))
PY
    ;;
  aftermath) # the driver's start-up right after a forge process ends, and after the GPU idled
    f=/tmp/l8.gguf
    [ -f $f ] || bin/device/forge gen --preset llama3-8b --quant q4_k_m -o $f --progress plain >/dev/null 2>&1
    cc -O2 -o /tmp/driver bench/floor/driver.c -ldl
    { for st in prefetch host-f32 prefetch; do
        echo "== after $st"
        bin/device/forge bench load-once -m $f --strategy $st --prompt-tokens 32 --device gpu | tail -1 | grep -oE '"(context|first_token)_ms":[0-9.]+' | tr '\n' ' '; echo
        for i in 1 2 3 4; do /tmp/driver; done
      done
      for idle in 1 3 10; do echo "== after $idle s idle"; sleep $idle; /tmp/driver; /tmp/driver; done
    } >"$o/logs/aftermath.txt" 2>&1 ;;
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
