#!/usr/bin/env bash
# The reader is a library for runtime nodes: its default build must not pull
# the CLI or compute crates (clap, anyhow, candle), and stays small. Prints
# the crate count (the README quotes it); fails above 130.
set -euo pipefail
cd "$(dirname "$0")/.."

tree="$(cargo tree --locked -p gkq-reader -e normal --prefix none)"
for heavy in clap anyhow candle-core aws-sdk-s3 tokenizers; do
  if grep -q "^$heavy v" <<<"$tree"; then
    echo "check-deps: gkq-reader's default build pulls $heavy:" >&2
    cargo tree --locked -p gkq-reader -e normal -i "$heavy" >&2
    exit 1
  fi
done
n="$(cut -d' ' -f1 <<<"$tree" | sort -u | wc -l)"
echo "check-deps: gkq-reader's default library build resolves $n crates (itself included; limit 130)"
if [ "$n" -gt 130 ]; then
  echo "check-deps: over the limit of 130" >&2
  exit 1
fi
