# Evidence (evidence/, docs/EVIDENCE.md): reliability under faults, hostile input, peer benchmarks.
#
#   make test-evidence    CI mode: short reliability suite, Python (ASGI) and Node (Express) apps on
#                         every store (kill -9, transactional kill -9 on both apps, SIGSTOP, outages,
#                         hung PostgreSQL, TTL/purge, soak) + hostile-input suites from Python and
#                         Node; fails on any violation. A few minutes.
#   make evidence-short   the same two suites, figures printed (alias of test-evidence)
#   make evidence-long    publishing mode: >= 10^5 trials per store (Python app; the Node app at a
#                         quarter of the rounds), purge of 10^6 rows, 1-minute soaks whose memory
#                         is judged after a 15 s warm-up (~26 min)
#   make bench-peers      one table: idempo vs serde_jcs/rfc8785/json.dumps/canonicalize/json-canonicalize
#                         (+ SHA-256), same bodies, plus end-to-end requests/s and p50/p99 per store
EV_PY := $(CURDIR)/.venv/bin/python

TEST_TARGETS += test-evidence

.PHONY: test-evidence evidence-short evidence-long evidence-reliability evidence-hostile bench-peers

test-evidence: evidence-short

evidence-short: python-setup node-build
	$(EV_PY) -m mypy --ignore-missing-imports evidence
	$(EV_PY) -m evidence.reliability.run --mode short
	$(EV_PY) -m evidence.hostile.run

evidence-long: python-setup node-build
	$(EV_PY) -m evidence.reliability.run --mode long
	$(EV_PY) -m evidence.hostile.run

evidence-reliability: python-setup node-build
	$(EV_PY) -m evidence.reliability.run --mode $${EVIDENCE_MODE:-short}

evidence-hostile: python-setup node-build
	$(EV_PY) -m evidence.hostile.run

bench-peers: python-setup node-build
	$(EV_PY) -m evidence.bench.peers
