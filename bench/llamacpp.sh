#!/usr/bin/env bash
# Fetches llama.cpp's command-line tools as Debian unstable packages them
# (CPU backends; no CUDA build is packaged) and unpacks them, with the C
# library they were built against, under $DIR (default bench/llamacpp/root,
# ignored by git), so they run on an older Debian without root:
#
#   bench/llamacpp.sh                       # needs deb.debian.org
#   bench/llamacpp/llama llama-completion -m MODEL -p "Hello" -n 1 --temp 0 -no-cnv
#
# This is how forge's outputs and files are checked against llama.cpp on a
# machine where no llama.cpp build is installed (forge bench load --peer
# 'bench/llamacpp/llama llama-completion -m {model} …'). The .debs are
# ~13 MB, so the unpacked folder can be carried to a machine without
# network access.
set -euo pipefail
cd "$(dirname "$0")"
dir=${DIR:-$PWD/llamacpp}
apt=$(mktemp -d)
trap 'rm -rf "$apt"' EXIT
mkdir -p "$apt/lists/partial" "$apt/cache" "$dir/debs" "$dir/root"
echo "deb http://deb.debian.org/debian sid main" >"$apt/sources.list"
o=(-oDir::Etc::SourceList="$apt/sources.list" -oDir::Etc::SourceParts=/dev/null
  -oDir::State::Lists="$apt/lists" -oDir::Cache="$apt/cache" -oAPT::Architecture=amd64)
apt-get "${o[@]}" update -qq
(cd "$dir/debs" && apt-get "${o[@]}" download llama.cpp-tools llama.cpp-tools-extra libllama0 libggml0 \
  libc6 libgcc-s1 libstdc++6 libgomp1 libssl3t64 libzstd1 zlib1g)
for f in "$dir"/debs/*.deb; do dpkg -x "$f" "$dir/root"; done
# The packaged tools look for their CPU backends in /usr/lib/…/ggml; pick
# the best one this processor runs and name it explicitly.
cat >"$dir/llama" <<'WRAP'
#!/bin/sh
R=$(dirname "$(readlink -f "$0")")/root
L=$R/usr/lib/x86_64-linux-gnu
B=$L/ggml/backends0
if [ -z "${GGML_BACKEND_PATH:-}" ]; then
  f=$(grep -m1 '^flags' /proc/cpuinfo)
  case "$f" in
    *avx512_vnni*) GGML_BACKEND_PATH=$B/libggml-cpu-icelake.so ;;
    *avx512f*) GGML_BACKEND_PATH=$B/libggml-cpu-skylakex.so ;;
    *avx2*) GGML_BACKEND_PATH=$B/libggml-cpu-haswell.so ;;
    *) GGML_BACKEND_PATH=$B/libggml-cpu-x64.so ;;
  esac
  export GGML_BACKEND_PATH
fi
tool=$1
shift
exec "$L/ld-linux-x86-64.so.2" --library-path "$L:$L/ggml:$L/llama" "$R/usr/bin/$tool" "$@"
WRAP
chmod +x "$dir/llama"
"$dir/llama" llama-completion --version 2>&1 | head -2
