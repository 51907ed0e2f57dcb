# Python binding (bindings/python): the idempo package in a repo-local virtualenv.
#
#   make test-python    stubtest of the extension, mypy of the package, the pytest suite on two workers (each
#                       file's tests on one; each worker starts its own throwaway PostgreSQL and Redis via
#                       scripts/test-services.sh; IDEMPO_SKIP_SERVICES=1 skips those tests)
#   make bench-python   fingerprint benchmark against json.dumps+sha256 and rfc8785 (prints ratios); WSGI
#                       streamed responses: server peak memory for 100 MiB, time to first byte of a slow stream
#   make demo-python    the payments demo: python -m idempo.demo
#   make python-dev     fast debug rebuild of the extension into .venv (maturin develop)
#   make dist           dist/: the abi3 wheel tagged manylinux2014 (linked with zig where the host's glibc is
#                       newer; maturin's compliance check accepts it) and the sdist (scripts/python-dist.sh).
#                       test-python installs a wheel into a fresh venv with no cargo on PATH and serves a
#                       request (tests/test_wheel.py): dist/'s wheel when there is one, else one built from
#                       setup's release build.
PY_VENV := .venv
PY := $(CURDIR)/$(PY_VENV)/bin/python

TEST_TARGETS += test-python
BENCH_TARGETS += bench-python
DEMO_TARGET := demo-python

.PHONY: test-python bench-python demo-python python-setup python-dev dist

python-setup:
	bash scripts/setup.d/30-python.sh

test-python: python-setup
	cd bindings/python && $(PY) -m mypy.stubtest idempo._idempo
	cd bindings/python && $(PY) -m mypy python/idempo
	cd bindings/python && $(PY) -m pytest -q -n 2 --dist loadfile

bench-python: python-setup
	$(PY) bindings/python/bench/bench_fingerprint.py
	$(PY) bindings/python/bench/bench_stream.py
	$(PY) bindings/python/bench/bench_wsgi_stream.py

demo-python: python-setup
	$(PY) -m idempo.demo

python-dev:
	cd bindings/python && VIRTUAL_ENV=$(CURDIR)/$(PY_VENV) $(CURDIR)/$(PY_VENV)/bin/maturin develop -q

dist: python-setup
	bash scripts/python-dist.sh
