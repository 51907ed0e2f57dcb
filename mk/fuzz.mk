# Fuzzing idempo-core (fuzz/, a cargo-fuzz crate outside the workspace). Not part of `make test`.
#
#   make fuzz-build   build the fuzz targets with plain cargo (no cargo-fuzz, no sanitizer)
#   make fuzz-smoke   run each target for FUZZ_SECONDS (default 60) under libFuzzer with RSS and
#                     malloc limits; needs `cargo install cargo-fuzz`. On a stable toolchain the
#                     sanitizer flags need RUSTC_BOOTSTRAP=1, which this verb sets.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= $(basename $(notdir $(wildcard fuzz/fuzz_targets/*.rs)))

.PHONY: fuzz-build fuzz-smoke

fuzz-build:
	cd fuzz && $(CARGO) build -q

fuzz-smoke:
	@command -v cargo-fuzz >/dev/null || { echo "fuzz-smoke: cargo-fuzz is missing (cargo install cargo-fuzz)" >&2; exit 1; }
	for t in $(FUZZ_TARGETS); do \
	  (cd fuzz && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run $$t -- \
	    -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536) || exit 1; \
	done

# CI smoke (part of `make test`): every target for FUZZ_CI_SECONDS (default 10). Setup installs
# cargo-fuzz (scripts/setup.d/60-fuzz.sh); only IDEMPO_SKIP_FUZZ=1 skips it, with a notice.
FUZZ_CI_SECONDS ?= 10
TEST_TARGETS += fuzz-ci

.PHONY: fuzz-ci

fuzz-ci:
	@if command -v cargo-fuzz >/dev/null; then \
	  $(MAKE) --no-print-directory fuzz-smoke FUZZ_SECONDS=$(FUZZ_CI_SECONDS); \
	else \
	  [ "$${IDEMPO_SKIP_FUZZ:-0}" = 1 ] || { echo "fuzz-ci: cargo-fuzz is missing (make setup installs it)" >&2; exit 1; }; \
	  echo "fuzz-ci: skipped (IDEMPO_SKIP_FUZZ=1)"; \
	fi
