# The idempo-gateway reverse proxy (bindings/gateway, bindings/gateway/README.md).
#
#   make test-gateway   the gateway crate's tests alone (make test runs them within test-rust,
#                       in the workspace's one build): unit tests, spec/vectors/store on the memory,
#                       SQLite and PostgreSQL stores (directly and through PgBouncer) and on the
#                       Redis store (one server and a Redis Cluster), and the integration tests
#                       through real sockets (the built binary in front of an upstream hyper
#                       server), with throwaway PostgreSQL, PgBouncer, Redis and Redis Cluster
#                       servers (scripts/with-services.sh: it fails if one did not start, so
#                       those tests never skip here)
#   make demo-gateway   builds the gateway, runs it on SQLite in front of a small payments service
#                       written without idempo (Python standard library), plays new, replay,
#                       mismatch and in-flight; exits non-zero if a case does not behave

.PHONY: test-gateway demo-gateway

test-gateway:
	./scripts/with-services.sh $(CARGO) test -q -p idempo-gateway

demo-gateway:
	$(CARGO) build --release -q -p idempo-gateway
	python3 bindings/gateway/demo/run.py target/release/idempo-gateway
