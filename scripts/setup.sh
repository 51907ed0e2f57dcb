#!/usr/bin/env bash
# Installs everything `make test` and `make demo` need on a fresh Debian 12 machine with Rust,
# Python 3.11 and Node 20. Idempotent: a second run only checks. Each part is a script in
# scripts/setup.d/, run in name order.
set -euo pipefail
cd "$(dirname "$0")/.."
for part in scripts/setup.d/*.sh; do
  [ -e "$part" ] || continue
  bash "$part"
done
