# idempo task runner. README.md and .ci/run call these verbs word for word.
#
#   make demo    set up what is missing and run the main demo
#   make test    run every test (lint, Rust, and each binding's suite)
#   make bench   print benchmark figures (never asserted)
#   make lint    cargo fmt --check and clippy -D warnings
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo

.PHONY: demo test lint test-rust bench fmt clean

demo:
	$(CARGO) build --release -q -p idempo-cli
	./scripts/demo-cli.sh target/release/idempo

test: lint test-rust

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -q -- -D warnings

test-rust:
	$(CARGO) test --workspace -q

bench:
	$(CARGO) bench -p idempo-benches

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
