#!/usr/bin/env bash
# Rust components used by `make lint`.
set -euo pipefail
if ! rustup component list --installed 2>/dev/null | grep -q '^rustfmt'; then rustup component add rustfmt; fi
if ! rustup component list --installed 2>/dev/null | grep -q '^clippy'; then rustup component add clippy; fi
