#!/usr/bin/env bash
# Installs everything `make test` and `make demo` need on a fresh Debian 12 machine with Rust,
# Python 3.11 and Node 20. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! rustup component list --installed 2>/dev/null | grep -q rustfmt; then rustup component add rustfmt clippy; fi
