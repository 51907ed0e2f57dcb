# idempo-gateway's cost per request (evidence/bench/gateway/, docs/EVIDENCE.md "Gateway").
#
#   make bench-gateway   one interleaved run (~2.5 min): requests/s, p50 and p99 with a fresh
#                        Idempotency-Key per request (~220-byte JSON body, wrk -t1 -c16 on CPU 1)
#                        straight to a small Rust upstream (bindings/gateway/examples/bench_upstream.rs),
#                        through the gateway as a plain reverse proxy (protocol off: fallback_upstream),
#                        through the gateway on the memory, SQLite and PostgreSQL stores (a throwaway
#                        server from scripts/test-services.sh, or IDEMPO_BENCH_POSTGRES_URL), and the
#                        Python ASGI integration (FastAPI) on SQLite; the server side on CPU 0. Prints
#                        issue 21's two targets (p50 within 10% of the plain proxy, 5x the ASGI
#                        integration's req/s) as figures, never asserted.
#                        BENCH_GATEWAY_DURATION: seconds per measured run (default 3);
#                        BENCH_GATEWAY_ARGS passes options (--rounds 1, --no-services, --only ...).
#   make bench-gateway-count   the gateway's user-space CPU instructions per request (valgrind's
#                        callgrind; plain proxy, memory, SQLite; ~1.5 min): a figure a loaded machine
#                        does not move, with the functions that cost the most.
#                        BENCH_GATEWAY_COUNT_ARGS passes options (--requests N, --rows plain,memory).
BENCH_GATEWAY_DURATION ?= 3
BENCH_GATEWAY_ARGS ?=
BENCH_GATEWAY_COUNT_ARGS ?=

.PHONY: bench-gateway bench-gateway-count

bench-gateway: python-setup bench-load-tools
	$(CARGO) build --release -q -p idempo-gateway --bin idempo-gateway --example bench_upstream
	$(CURDIR)/.venv/bin/python -m evidence.bench.gateway.run --seconds $(BENCH_GATEWAY_DURATION) $(BENCH_GATEWAY_ARGS)

bench-gateway-count: python-setup
	@command -v valgrind >/dev/null 2>&1 || { \
	  [ "$$(id -u)" -eq 0 ] || { echo "bench-gateway-count: valgrind is required (apt-get install valgrind)" >&2; exit 1; }; \
	  echo "bench-gateway-count: installing valgrind (Debian package)"; export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends valgrind >/dev/null; }
	$(CARGO) build --release -q -p idempo-gateway --bin idempo-gateway --example bench_upstream
	$(CURDIR)/.venv/bin/python -m evidence.bench.gateway.count $(BENCH_GATEWAY_COUNT_ARGS)
