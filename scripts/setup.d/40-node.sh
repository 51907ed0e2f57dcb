#!/usr/bin/env bash
# Node package (bindings/node): npm dependencies, then the native addon (release, built from
# source with cargo through @napi-rs/cli) and the compiled TypeScript layer, both by the package's
# own install script. Fast when nothing changed: npm ci only reruns when package-lock.json does.
set -euo pipefail
cd "$(dirname "$0")/../../bindings/node"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "setup: Node.js 20+ with npm is required for bindings/node" >&2
  exit 1
fi
# better-sqlite3 compiles with node-gyp when no prebuilt binary can be fetched.
if ! command -v g++ >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "setup: installing g++ and make for node-gyp"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends g++ make >/dev/null
  else
    echo "setup: g++ and make are required (apt-get install g++ make)" >&2
    exit 1
  fi
fi

stamp=node_modules/.idempo-lock-sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f node_modules/better-sqlite3/build/Release/better_sqlite3.node ]; then
  exit 0 # dependencies current; `make node-build` rebuilds the addon incrementally
fi
echo "setup: npm ci in bindings/node (its install script builds the native addon with cargo)"
npm ci --no-audit --no-fund --loglevel=error
echo "$want" >"$stamp"
