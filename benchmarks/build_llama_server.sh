#!/usr/bin/env bash
# Builds llama.cpp's llama-server (the server llama.vim and llama.vscode talk to) for bench_replay's llama-server
# configuration, from the llama.cpp sources the `bench` extra already uses: llama-cpp-python's sdist vendors them.
#
#   bash benchmarks/build_llama_server.sh            # prints the path of the built llama-server
#   LLAMA_CPP_PYTHON_VERSION=0.3.36 JOBS=2 bash benchmarks/build_llama_server.sh
#   LLAMA_SERVER_DIR=/work/llama.cpp/avx2 LLAMA_CPU_LEVEL=avx2 bash benchmarks/build_llama_server.sh
#
# LLAMA_CPU_LEVEL=avx2 builds the AVX2-only kernels (AVX, AVX2, FMA, F16C; no AVX-512, no VNNI, no AMX), the peer of
# rest-lsp's forced AVX2 level, on any x86 CPU; put it in its own LLAMA_SERVER_DIR beside the default build.
# The build also leaves llama.cpp's shared libraries in build/bin: LLAMA_CPP_LIB_PATH=<dir>/build/bin makes
# llama-cpp-python (the `bench` extra) load this build instead of its own.
# LLAMA_TARGETS=ggml-cpu builds only the CPU backend (the kernels: all that a level changes); with
# LD_LIBRARY_PATH=<dir>/build/bin another build's llama-server and libllama run it (they find their libraries by
# RUNPATH, which LD_LIBRARY_PATH overrides), e.g. the AVX2 kernels without a second full build.
#
# Idempotent: the sdist, the sources and the build live in benchmarks/.llama.cpp/ (git-ignored); a second run
# only prints the path. Needs the network once (pip download), cmake and a C++ compiler.
# Rule: on a CPU with AVX-512 the AVX-512 kernels are built without AMX (a native build of this llama.cpp version
# with AMX crashes on any prompt batch on such a machine); on any other CPU the plain AVX2 build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="${LLAMA_SERVER_DIR:-$here/.llama.cpp}"
version="${LLAMA_CPP_PYTHON_VERSION:-}"
jobs="${JOBS:-2}"
python="${PYTHON:-$here/../.venv/bin/python}"
[ -x "$python" ] || python=python3

targets="${LLAMA_TARGETS:-llama-server}"
binary="$root/build/bin/llama-server"
[ "$targets" = llama-server ] || binary="$root/build/bin/libggml-cpu.so"
if [ -e "$binary" ]; then
    echo "$binary"
    exit 0
fi

mkdir -p "$root"
if ! ls "$root"/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
    spec="llama-cpp-python${version:+==$version}"
    "$python" -m pip download --no-binary :all: --no-deps --dest "$root" "$spec" >&2
fi
sdist="$(ls "$root"/llama_cpp_python-*.tar.gz | sort | tail -1)"
src="$root/src"
if [ ! -f "$src/CMakeLists.txt" ]; then
    rm -rf "$src" "$root/unpack"
    mkdir -p "$root/unpack"
    tar -xzf "$sdist" -C "$root/unpack"
    mv "$root"/unpack/llama_cpp_python-*/vendor/llama.cpp "$src"
    rm -rf "$root/unpack"
fi

level="${LLAMA_CPU_LEVEL:-auto}"
case "$level" in auto|avx2) ;; *) echo "LLAMA_CPU_LEVEL must be auto or avx2, not '$level'" >&2; exit 2 ;; esac

flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF
       -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF
       -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
if [ "$level" = avx2 ]; then
    flags+=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF
            -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX512_VBMI=OFF)
elif grep -q avx512f /proc/cpuinfo 2>/dev/null; then
    flags+=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON)
    grep -q avx512_vnni /proc/cpuinfo && flags+=(-DGGML_AVX512_VNNI=ON)
    grep -q avx512_bf16 /proc/cpuinfo && flags+=(-DGGML_AVX512_BF16=ON)
    grep -q avx512vbmi /proc/cpuinfo && flags+=(-DGGML_AVX512_VBMI=ON)
else
    flags+=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
fi

cmake -S "$src" -B "$root/build" "${flags[@]}" >&2
nice -n 15 cmake --build "$root/build" --target $targets -j "$jobs" >&2
echo "$binary"
