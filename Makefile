# idempo task runner. README.md and .ci/run call these verbs word for word.
#
#   make demo    set up what is missing and run the main demo
#   make test    run every test (lint, Rust, and each binding's suite)
#   make test-rust   cargo test --workspace beside throwaway PostgreSQL, PgBouncer and Redis
#                (scripts/with-services.sh), so no store test skips
#   make bench   print benchmark figures (never asserted)
#   make bench-e2e   idempo's added time per request against the bare app and the peer middlewares
#                (FastAPI, Express 5, Fastify 5; every store; wrk; ~10 min; mk/bench-e2e.mk)
#   make bench-gateway   idempo-gateway on each store against a plain reverse proxy, the upstream
#                alone and the Python ASGI integration (wrk; ~2.5 min; mk/bench-gateway.mk)
#   make bench-gateway-count   the gateway's CPU instructions per request (valgrind; ~1.5 min)
#   make lint    cargo fmt --check, clippy -D warnings (the workspace's lint policy is
#                [workspace.lints] in Cargo.toml), each crate's rust-version against its
#                dependencies under the committed Cargo.lock (scripts/check-msrv.py), and the
#                check that the Python and TypeScript hosts make no protocol decision
#                (scripts/check_edge_rules.py), ruff over every Python file (ruff.toml) and
#                Biome over the TypeScript and JavaScript of bindings/node (biome.json)
#   make ci      what .ci/run does: setup, then test (CI sets IDEMPO_CARGO_FLAGS=--locked)
#   make check   fast and offline, for a contributor's loop (after one `make setup`): lint, core's
#                unit tests, and the Python and Node suites without the tests that need
#                PostgreSQL or Redis
#
# Each binding adds its own verbs in mk/<binding>.mk and appends them to TEST_TARGETS,
# BENCH_TARGETS; setup steps live in scripts/setup.d/.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
IDEMPO_CARGO_FLAGS ?=
CARGO ?= cargo $(IDEMPO_CARGO_FLAGS)
TEST_TARGETS :=
BENCH_TARGETS :=
DEMO_TARGET := demo-cli

.PHONY: demo demo-cli setup test ci lint check test-rust bench bench-rust bench-report fmt clean

-include $(sort $(wildcard mk/*.mk))

setup:
	./scripts/setup.sh

# The demo sets up only what it needs (the Python package in .venv), not the test servers or Swift.
demo: $(DEMO_TARGET)

demo-cli:
	$(CARGO) build --release -q -p idempo-cli
	./scripts/demo-cli.sh target/release/idempo

test: setup lint test-rust $(TEST_TARGETS)
	@echo "make test: all suites passed"

ci: setup test

lint:
	python3 scripts/check-msrv.py
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -q -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc -q -p idempo-core --no-deps
	python3 scripts/check_edge_rules.py
	$(CURDIR)/.venv/bin/ruff check --quiet .
	cd bindings/node && node_modules/.bin/biome lint --error-on-warnings .

check: lint
	$(CARGO) test -q -p idempo-core
	cd bindings/python && IDEMPO_SKIP_SERVICES=1 $(CURDIR)/.venv/bin/python -m pytest -q -x -p no:cacheprovider -n 2
	cd bindings/node && IDEMPO_SKIP_SERVICES=1 node --test --test-concurrency=4 test/*.test.mjs
	@echo "make check: passed (services-backed tests skipped; make test runs everything)"

# With the servers of scripts/test-services.sh, so the store tests of every crate run here (the
# gateway's, the PostgreSQL recipes' linearizability) in the one build --workspace makes: a
# `cargo test -p` of its own would resolve other features and build the dependencies again.
test-rust:
	./scripts/with-services.sh $(CARGO) test --workspace -q

bench: bench-report bench-rust $(BENCH_TARGETS)

# One table: canonicalize and fingerprint per body in MB/s and as a share of raw SHA-256 measured
# in the same run (the issue's targets are stated in those terms).
bench-report:
	$(CARGO) run --release -q -p idempo-benches --bin report

bench-rust:
	$(CARGO) bench -p idempo-benches

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
