# Evidence (evidence/, docs/EVIDENCE.md): reliability under faults, hostile input, peer benchmarks.
#
#   make test-evidence    CI mode: short reliability suite, Python (ASGI) and Node (Express) apps on
#                         every store (kill -9, transactional kill -9 on both apps, SIGSTOP, outages,
#                         hung PostgreSQL, TTL/purge, soak) + hostile-input suites from Python and
#                         Node + the production topologies' short rows (below, one fault each,
#                         ~2 min) + the same scenarios against idempo-gateway where they apply
#                         (evidence/reliability/gateway.py: storms, kill -9 of the upstream and of
#                         the gateway, SIGSTOP of each, PostgreSQL stopped and hung, TTL and the
#                         purge task; the debug binary); fails on any violation. A few minutes.
#   make evidence-short   the same suites, figures printed (alias of test-evidence)
#   make evidence-long    publishing mode: >= 10^5 trials per store (Python app; the Node app at a
#                         quarter of the rounds), purge of 10^6 rows, 1-minute soaks whose memory
#                         is judged after a 15 s warm-up (~26 min), then evidence-topologies
#   make evidence-topologies   the long topology storms (evidence/reliability/topologies.py): 4 worker
#                         processes per app (uvicorn --workers 4, the Node supervisor's 4 workers),
#                         60 s duplicate storms against PgBouncer in transaction mode (kill -9 of a
#                         worker mid-handler x3, pg_ctl restart -m immediate x3 with PgBouncer's
#                         server_login_retry at 1 s and at its 15 s default), a primary with a
#                         synchronous standby promoted mid-load (multi-host DSN), a Redis Cluster with
#                         replicas (kill -9 of a primary x2, a replica takes over); doubles, lost
#                         answers and the 503 window per topology (~14 min)
#   make bench-peers      one table: idempo vs serde_jcs/rfc8785/json.dumps/canonicalize/json-canonicalize
#                         (+ SHA-256), same bodies, plus end-to-end requests/s and p50/p99 per store
EV_PY := $(CURDIR)/.venv/bin/python
# The gateway's debug binary as test-rust's `cargo test --workspace` builds it (target/debug/
# idempo-gateway, its integration tests' binary): within `make test` nothing is built again, where a
# `cargo build -p idempo-gateway` would resolve other features under another profile and build
# every dependency a second time.
EV_GATEWAY_BUILD := $(CARGO) test --workspace -q --no-run

TEST_TARGETS += test-evidence

.PHONY: test-evidence evidence-short evidence-long evidence-topologies evidence-reliability evidence-hostile bench-peers

test-evidence: evidence-short

evidence-short: python-setup node-build
	$(EV_PY) -m mypy --ignore-missing-imports evidence
	$(EV_PY) -m evidence.reliability.run --mode short
	$(EV_GATEWAY_BUILD)
	IDEMPO_GATEWAY_BIN=$${CARGO_TARGET_DIR:-target}/debug/idempo-gateway $(EV_PY) -m evidence.reliability.gateway --mode short
	$(EV_PY) -m evidence.reliability.topologies --mode short
	$(EV_PY) -m evidence.hostile.run

evidence-long: python-setup node-build
	$(EV_PY) -m evidence.reliability.run --mode long
	$(EV_GATEWAY_BUILD)
	IDEMPO_GATEWAY_BIN=$${CARGO_TARGET_DIR:-target}/debug/idempo-gateway $(EV_PY) -m evidence.reliability.gateway --mode long
	$(EV_PY) -m evidence.hostile.run
	$(EV_PY) -m evidence.reliability.topologies --mode long

evidence-topologies: python-setup node-build
	$(EV_PY) -m evidence.reliability.topologies --mode long

evidence-reliability: python-setup node-build
	$(EV_PY) -m evidence.reliability.run --mode $${EVIDENCE_MODE:-short}

evidence-hostile: python-setup node-build
	$(EV_PY) -m evidence.hostile.run

bench-peers: python-setup node-build
	$(EV_PY) -m evidence.bench.peers
