#!/usr/bin/env bash
# cargo-fuzz for the fuzz smoke run in `make test` (fuzz-ci) and `make fuzz-smoke`. Built from
# crates.io once per machine (a few minutes); IDEMPO_SKIP_FUZZ=1 skips it (fuzz-ci then says so).
set -euo pipefail
[ "${IDEMPO_SKIP_FUZZ:-0}" = 1 ] && exit 0
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "setup: installing cargo-fuzz (once per machine)"
  cargo install --quiet --locked cargo-fuzz
fi
