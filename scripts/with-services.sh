#!/usr/bin/env bash
# Runs a command beside throwaway PostgreSQL, PgBouncer, Redis and Redis Cluster servers
# (scripts/test-services.sh start, data in a temporary folder), with their addresses in its
# environment (IDEMPO_TEST_PG_DSN, IDEMPO_TEST_PGBOUNCER_DSN, IDEMPO_TEST_REDIS_URL,
# IDEMPO_TEST_REDIS_CLUSTER_NODES), and stops them afterwards whatever the command's outcome.
# Exits with the command's status; fails before running it when a server did not start, so a test
# suite never skips its store tests for want of an address.
#
#   scripts/with-services.sh CMD [ARG...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
svc=$(mktemp -d)
trap '"$here/test-services.sh" stop "$svc" >/dev/null 2>&1 || true; rm -rf "$svc"' EXIT
"$here/test-services.sh" start "$svc" >/dev/null
set -a
# shellcheck disable=SC1091
. "$svc/env"
set +a
for v in IDEMPO_TEST_PG_DSN IDEMPO_TEST_PGBOUNCER_DSN IDEMPO_TEST_REDIS_URL IDEMPO_TEST_REDIS_CLUSTER_NODES; do
  [ -n "${!v:-}" ] || {
    echo "with-services: scripts/test-services.sh did not set $v" >&2
    exit 1
  }
done
"$@"
