#!/usr/bin/env bash
# Builds llama.cpp as its users run it, from the llama-cpp-python sdist on
# PyPI (its vendor/llama.cpp; the file itself, checked by its SHA-256, since
# `pip download` of this sdist builds its metadata with cmake and
# scikit-build-core), then scripts/llama_driver.cpp against its libllama.
# usage: scripts/build-llama-cpp.sh TOP SRC (libllama, llama-quantize,
# llama-tokenize, llama-cli for its --help, llama-perplexity)
#   TOP: where the sdist is unpacked; SRC: the llama.cpp tree (TOP's
#   vendor/llama.cpp, or one already built in SRC/build)
# Prints nothing on stdout; the build takes about 10 minutes on 2 cores.
set -euo pipefail
top=$1 src=$2
here=$(cd "$(dirname "$0")" && pwd)
sdist=llama_cpp_python-0.3.36
url=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/$sdist.tar.gz
sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# this machine's CPU reports AMX but traps on it (SIGILL)
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
bin=$src/build/bin
if ! command -v cmake >/dev/null; then
    echo "bench: apt-get install cmake" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends cmake >/dev/null
fi
targets="llama llama-quantize llama-tokenize llama-cli llama-perplexity"
missing=""
for t in $targets; do
    [ "$t" = llama ] || [ -e "$bin/$t" ] || missing=1
done
if [ -n "$missing" ]; then
    mkdir -p "$top"
    if [ ! -d "$src" ]; then
        echo "bench: downloading the $sdist sdist from PyPI" >&2
        curl -sSfL --retry 3 -o "$top/$sdist.tar.gz" "$url"
        echo "$sha  $top/$sdist.tar.gz" | sha256sum -c --quiet - >&2
        tar xzf "$top/$sdist.tar.gz" -C "$top"
    fi
    echo "bench: building llama.cpp (about 10 minutes on 2 cores)" >&2
    cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON \
        -DLLAMA_BUILD_TESTS=OFF -DGGML_BUILD_TESTS=OFF \
        -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" >&2
    cmake --build "$src/build" -j 2 --target $targets >&2
fi
driver=$src/build/gkq_llama_driver
if [ ! -e "$driver" ] || [ "$here/llama_driver.cpp" -nt "$driver" ]; then
    g++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" \
        "$here/llama_driver.cpp" -L"$bin" -lllama -lggml -lggml-base \
        -Wl,-rpath,"$bin" -o "$driver" >&2
fi
