#!/usr/bin/env bash
# Checks the operations files in deploy/ with the real tools where this machine has them:
# promtool (alert rules and their unit test), nginx -t (the retry snippet inside a throwaway
# nginx.conf), and a YAML parse of the Envoy, Istio and Linkerd files. Run by `make test-ops`.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}

promtool check rules deploy/prometheus/idempo-alerts.yml
(cd deploy/prometheus && promtool test rules idempo-alerts.test.yml)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/nginx.conf" <<CONF
pid $tmp/nginx.pid;
error_log $tmp/error.log;
events {}
http {
  access_log off;
  client_body_temp_path $tmp/body;
  proxy_temp_path $tmp/proxy;
  fastcgi_temp_path $tmp/fastcgi;
  uwsgi_temp_path $tmp/uwsgi;
  scgi_temp_path $tmp/scgi;
  include $PWD/deploy/nginx/idempo-retries.conf;
}
CONF
nginx -t -q -p "$tmp" -c "$tmp/nginx.conf"
echo "check-deploy: deploy/nginx/idempo-retries.conf: nginx -t ok"

"$py" - <<'PY'
import pathlib, yaml
for path in sorted(pathlib.Path("deploy").glob("*/*.yaml")):
    docs = list(yaml.safe_load_all(path.read_text()))
    assert docs and all(isinstance(d, dict) for d in docs), path
    print(f"check-deploy: {path}: YAML ok")
PY
