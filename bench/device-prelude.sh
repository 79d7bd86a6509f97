# device-prelude.sh: what the GPU-side scripts start with, sourced by them
# (bench/overlap-h100.sh, tuning-h100.sh, moe-decode-h100.sh) from the
# repository root with $1 the tarball of bin/device binaries and $2 the log's
# name: unpack it, set out, B (the binaries), log, the GPU test settings,
# mdir (a folder where pipeline's test binaries, built with -trimpath,
# find gguf/testdata at github.com/forge-llm/forge: run them from there),
# write the machine into the log, and compile the CUDA objects of the
# sources as they are ($out/cuda-obj.tar, for bench/kernels-gen.sh merge),
# which everything after loads (FORGE_KERNEL_OBJECTS), unless KOBJ=0.
out=${OUT:-out}
mkdir -p "$out"
tar -C bin -xJf "$1"
B=bin/device
export FORGE_REQUIRE_GPU=1 FORGE_CACHE_DIR=/tmp/forge-kernels
log=$out/$2
mdir=$(mktemp -d)
mkdir -p "$mdir/github.com/forge-llm" && ln -s "$PWD" "$mdir/github.com/forge-llm/forge"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } >>"$log"
# (KOBJ=0: the shipped objects are current; nothing to compile)
if [ "${KOBJ:-1}" = 0 ]; then
  :
elif KOBJ_DIR=/tmp/kobj BIN=$B bash bench/kernels-gen.sh cuda >/tmp/kobj.txt 2>&1; then
  export FORGE_KERNEL_OBJECTS=/tmp/kobj/obj
  echo "kernel objects compiled ($(date -u +%T))" >>"$log"
else
  tail -5 /tmp/kobj.txt >>"$log"
fi
