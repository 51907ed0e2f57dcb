#!/usr/bin/env bash
# Database servers used by the binding test suites (PostgreSQL, PgBouncer and Redis from Debian's
# packages), and promtool for the alert rules in deploy/.
# Nothing is started here: scripts/test-services.sh runs throwaway instances per test run.
set -euo pipefail

have_pg() {
  command -v pg_ctl >/dev/null 2>&1 && return 0
  compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null
}

missing=()
have_pg || missing+=(postgresql)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v pgbouncer >/dev/null 2>&1 || missing+=(pgbouncer)
# promtool (in Debian's prometheus package) checks and unit-tests deploy/prometheus/.
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# nginx -t checks deploy/nginx/.
command -v nginx >/dev/null 2>&1 || missing+=(nginx)
[ "${#missing[@]}" -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing ${missing[*]}; install them (apt-get install ${missing[*]}) or run setup as root" >&2
  exit 1
fi
echo "setup: installing ${missing[*]} from Debian"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The prometheus and nginx packages may start their servers; the tests need only the tools.
for daemon in prometheus nginx; do
  if printf '%s\n' "${missing[@]}" | grep -qx "$daemon"; then
    service "$daemon" stop >/dev/null 2>&1 || pkill -x "$daemon" >/dev/null 2>&1 || true
  fi
done
