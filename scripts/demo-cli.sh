#!/usr/bin/env bash
# Demo of the idempo CLI on a sample payment body (the main job until the Python demo lands).
set -euo pipefail
bin=${1:-target/release/idempo}
body=spec/examples/payment.json
echo "== body as the client sent it"; cat "$body"; echo
echo "== canonical form (RFC 8785)"; "$bin" canonicalize "$body"; echo
echo "== fingerprint"; "$bin" fingerprint --method POST --route /payments --exclude /client_timestamp "$body"
echo "== key check"; "$bin" check-key '"3f6c1e0a-77c4-4b2e-9d7e-5b1f2c9a0d11"'
