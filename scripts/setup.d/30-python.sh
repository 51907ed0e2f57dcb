#!/usr/bin/env bash
# Python binding: a repo-local virtualenv (.venv) with the test dependencies and the idempo package
# built from bindings/python (maturin, release profile). Reinstalls only when the sources changed.
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=.venv
py=${PYTHON:-python3}
deps=(
  "maturin>=1.9,<2" "pytest>=8" "httpx>=0.27" "starlette>=0.37" "fastapi>=0.110" "uvicorn>=0.29"
  "psycopg[binary]>=3.1" "redis>=5" "rfc8785>=0.1.4" "mypy>=1.10" "flask>=2.3" "django>=4.2"
  "prometheus-client>=0.20" "openapi-spec-validator>=0.7" "opentelemetry-sdk>=1.20" "ruff>=0.6"
  "celery[redis]>=5.3,<6" "pytest-xdist>=3.5"
)

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv"
  "$py" -m venv "$venv"
fi

deps_stamp=$(printf '%s\n' "${deps[@]}" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.idempo-deps" 2>/dev/null || true)" != "$deps_stamp" ]; then
  echo "setup: installing Python test dependencies into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${deps[@]}"
  echo "$deps_stamp" >"$venv/.idempo-deps"
fi

pkg_stamp=$(
  find core/src core/Cargo.toml bindings/python/src bindings/python/python \
    bindings/python/Cargo.toml bindings/python/pyproject.toml Cargo.toml -type f \
    -not -name '*.pyc' -not -path '*/__pycache__/*' -not -name '*.so' -print0 |
    sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
)
if [ "$(cat "$venv/.idempo-pkg" 2>/dev/null || true)" != "$pkg_stamp" ]; then
  echo "setup: building and installing idempo (bindings/python) into $venv"
  # --no-build-isolation uses the venv's maturin (the backend runs it from PATH).
  PATH="$PWD/$venv/bin:$PATH" "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation \
    --force-reinstall --no-deps ./bindings/python
  echo "$pkg_stamp" >"$venv/.idempo-pkg"
fi
