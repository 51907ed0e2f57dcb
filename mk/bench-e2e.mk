# End to end overhead (evidence/bench/e2e/, docs/EVIDENCE.md "End-to-end overhead"): idempo's added
# time per request against the bare app and every peer middleware, in one interleaved run.
#
#   make bench-e2e        FastAPI / Express 5 / Fastify 5, bare, idempo (memory, SQLite, PostgreSQL,
#                         PgBouncer, Redis) and the peers (asgi-idempotency-header, express-idempotency,
#                         @node-idempotency/core, installed into the git-ignored
#                         evidence/bench/e2e/.peers/), wrk on CPU 1 against one server process on
#                         CPU 0, fresh keys and replays; one table (~9 minutes). Printed, never asserted.
#                         BENCH_E2E_ARGS passes options (--quick, --seconds 3, --rounds 3, --only express).
#   make bench-e2e-smoke  the harness's own smoke test (--quick, no services; checks the table and the
#                         dedup checks, not the figures)
BENCH_E2E_ARGS ?=

.PHONY: bench-e2e bench-e2e-smoke bench-e2e-setup bench-load-tools

# wrk and taskset, shared with mk/bench-gateway.mk.
bench-load-tools:
	@command -v wrk >/dev/null 2>&1 || { \
	  [ "$$(id -u)" -eq 0 ] || { echo "bench: wrk is required (apt-get install wrk)" >&2; exit 1; }; \
	  echo "bench: installing wrk (Debian package)"; export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends wrk >/dev/null; }
	@command -v taskset >/dev/null 2>&1 || { echo "bench: taskset (util-linux) is required" >&2; exit 1; }

bench-e2e-setup: python-setup node-build bench-load-tools
	PYTHON=$(CURDIR)/.venv/bin/python bash evidence/bench/e2e/install_peers.sh evidence/bench/e2e/.peers

bench-e2e: bench-e2e-setup
	$(CURDIR)/.venv/bin/python -m evidence.bench.e2e.run $(BENCH_E2E_ARGS)

bench-e2e-smoke: bench-e2e-setup
	$(CURDIR)/.venv/bin/python -m pytest -q -p no:cacheprovider evidence/bench/e2e/test_smoke.py
