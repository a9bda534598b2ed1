#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the test servers,
# runs every test of the workspace (the HTTP tests start nginx themselves),
# then a bounded run of the parser fuzzer.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-test-deps.sh
cargo test --workspace --locked
# private s3:// reads: the reader's optional `s3` feature (the AWS SDK)
cargo test --locked -p gkq-reader --features s3 --test s3
cargo xtask fuzz --seconds "${GKQ_FUZZ_SECONDS:-20}"
