# The idempo-gateway reverse proxy (bindings/gateway, bindings/gateway/README.md).
#
#   make test-gateway   the gateway crate's tests: unit tests, spec/vectors/store on the memory,
#                       SQLite and PostgreSQL stores (directly and through PgBouncer) and on the
#                       Redis store (one server and a Redis Cluster), and the integration tests
#                       through real sockets (the built binary in front of an upstream hyper
#                       server), with throwaway PostgreSQL, PgBouncer, Redis and Redis Cluster
#                       servers from scripts/test-services.sh, whose DIR/env is exported
#                       (IDEMPO_TEST_PG_DSN, IDEMPO_TEST_PGBOUNCER_DSN, IDEMPO_TEST_REDIS_URL,
#                       IDEMPO_TEST_REDIS_CLUSTER_NODES; the target fails if one is missing, so
#                       those tests never skip here)
#   make demo-gateway   builds the gateway, runs it on SQLite in front of a small payments service
#                       written without idempo (Python standard library), plays new, replay,
#                       mismatch and in-flight; exits non-zero if a case does not behave
TEST_TARGETS += test-gateway

.PHONY: test-gateway demo-gateway

test-gateway:
	svc=$$(mktemp -d); trap '$(CURDIR)/scripts/test-services.sh stop '"$$svc"' >/dev/null 2>&1 || true; rm -rf '"$$svc" EXIT; \
	  scripts/test-services.sh start "$$svc" >/dev/null; \
	  set -a; . "$$svc/env"; set +a; \
	  for v in IDEMPO_TEST_PG_DSN IDEMPO_TEST_PGBOUNCER_DSN IDEMPO_TEST_REDIS_URL IDEMPO_TEST_REDIS_CLUSTER_NODES; do \
	    [ -n "$$(printenv $$v)" ] || { echo "test-gateway: scripts/test-services.sh did not set $$v" >&2; exit 1; }; \
	  done; \
	  $(CARGO) test -q -p idempo-gateway

demo-gateway:
	$(CARGO) build --release -q -p idempo-gateway
	python3 bindings/gateway/demo/run.py target/release/idempo-gateway
