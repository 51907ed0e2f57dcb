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

# The Grafana dashboard and the alert rules use only series that idempo exports: the request path
# (spec/vectors/metrics/request.json) and the purge process (spec/STORAGE.md §4.7). Every panel
# query, with Grafana's variables filled in, must parse as PromQL (promtool, as recording rules).
"$py" - "$tmp" <<'PY'
import json, pathlib, re, subprocess, sys, yaml
tmp = pathlib.Path(sys.argv[1])
exported = {m["prometheus"] for m in json.loads(pathlib.Path("spec/vectors/metrics/request.json").read_text())["metrics"]}
exported |= set(re.findall(r"^\| `(idempo_[a-z_]+)", pathlib.Path("spec/STORAGE.md").read_text(), re.M))
def names(expr):
    found = set()
    for n in re.findall(r"\b(idempo_[a-z_]+)", expr):
        base = re.sub(r"_(bucket|sum|count)$", "", n)
        found.add(base if base in exported else n)
    return found
dash = json.loads(pathlib.Path("deploy/grafana/idempo.json").read_text())
rules, used = [], set()
for panel in dash["panels"]:
    assert panel["targets"], panel["title"]
    for t in panel["targets"]:
        expr = t["expr"].replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$job", ".*")
        rules.append({"record": f"idempo:panel_{panel['id']}_{t['refId']}", "expr": expr})
        used |= names(expr)
(tmp / "dashboard-rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
subprocess.run(["promtool", "check", "rules", str(tmp / "dashboard-rules.yml")], check=True, stdout=subprocess.DEVNULL)
for group in yaml.safe_load(pathlib.Path("deploy/prometheus/idempo-alerts.yml").read_text())["groups"]:
    for rule in group["rules"]:
        used |= names(rule["expr"])
unknown = sorted(used - exported)
assert not unknown, f"deploy/ queries series idempo does not export: {unknown}"
unused = sorted(exported - used)
assert not unused, f"series no dashboard panel or alert shows: {unused}"
print(f"check-deploy: deploy/grafana/idempo.json: {len(rules)} queries parse; dashboard and alerts use only exported series ({len(exported)})")
PY
