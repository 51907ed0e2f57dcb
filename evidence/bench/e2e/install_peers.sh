#!/usr/bin/env bash
# The peers of `make bench-e2e`, in a bench-only folder (git-ignored), never in the project's own
# dependencies: asgi-idempotency-header (pip --target DIR/python), express-idempotency and
# @node-idempotency/core with its memory adapter (npm, DIR/node). Pinned versions; quiet and quick
# when already there.
#   evidence/bench/e2e/install_peers.sh DIR
set -euo pipefail
dir=${1:?usage: install_peers.sh DIR}
py=${PYTHON:-python3}
mkdir -p "$dir/python" "$dir/node"

want_py="asgi-idempotency-header==0.2.0"
if [ "$(cat "$dir/python/.stamp" 2>/dev/null)" != "$want_py" ]; then
  echo "bench-e2e: installing $want_py into $dir/python"
  # --no-deps: it needs only Starlette, which the project's .venv has (FastAPI's own).
  "$py" -m pip install -q --disable-pip-version-check --no-deps --upgrade --target "$dir/python" "$want_py"
  echo "$want_py" >"$dir/python/.stamp"
fi

want_node="express-idempotency@1.0.6 @node-idempotency/core@1.0.11 @node-idempotency/storage-adapter-memory@1.0.2"
if [ "$(cat "$dir/node/.stamp" 2>/dev/null)" != "$want_node" ]; then
  echo "bench-e2e: installing $want_node into $dir/node"
  [ -f "$dir/node/package.json" ] || echo '{"name":"idempo-bench-e2e-peers","private":true}' >"$dir/node/package.json"
  # shellcheck disable=SC2086
  npm install --prefix "$dir/node" --no-audit --no-fund --loglevel=error --save-exact $want_node
  echo "$want_node" >"$dir/node/.stamp"
fi
