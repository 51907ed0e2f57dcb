# Mutation testing of core's key state machine with cargo-mutants (results in spec/MODEL.md §5.2).
#
#   make mutants            both passes over core/src/machine and core/src/policy.rs:
#                           the model tests alone as judge (tests/tests/model_check.rs), then
#                           the whole test suite as judge (cargo test --workspace);
#                           each prints cargo-mutants' kill table (caught / missed / unviable /
#                           timeout) and keeps its outcomes in target/mutants/<pass>/mutants.out
#   make mutants-list       the mutants cargo-mutants would try, without running them
#   make mutants-core       the scoped pass of spec/MODEL.md §5.2: the store primitives, decide and
#                           the cleanup machine (store.rs, mod.rs, cleanup.rs; 46 mutants) judged by
#                           core's own tests and vectors (about an hour on 2 cores)
#
# Needs cargo-mutants from crates.io: `cargo install cargo-mutants --locked`.
# 457 mutants today (make mutants-list). Every mutant is a rebuild plus a test run: the suite
# pass's first stage (core's tests) takes about an hour on 2 cores (~10 s a mutant), its later
# stages only run the few it leaves; the model pass takes seconds a caught mutant and about two
# minutes a survivor (the model's whole fast tier).
# Narrow it with MUTANTS_FILES (e.g. MUTANTS_FILES=core/src/machine/store.rs) or
# MUTANTS_ARGS (e.g. MUTANTS_ARGS='--shard 0/8'). Not in TEST_TARGETS.
.PHONY: mutants mutants-tool mutants-list mutants-suite mutants-model mutants-core

# cargo-mutants from crates.io, the version these results were taken with, installed when missing.
MUTANTS_VERSION ?= 27.1.0
mutants-tool:
	@$(CARGO) mutants --version >/dev/null 2>&1 || { \
	  echo "mutants: installing cargo-mutants $(MUTANTS_VERSION) from crates.io"; \
	  $(CARGO) install --locked --version $(MUTANTS_VERSION) cargo-mutants; }

MUTANTS_FILES ?= core/src/machine/*.rs core/src/policy.rs
MUTANTS_TIMEOUT ?= 900
MUTANTS_JOBS ?= 1
MUTANTS_ARGS ?=
MUTANTS_FLAGS = --no-shuffle -j $(MUTANTS_JOBS) --timeout $(MUTANTS_TIMEOUT) \
	$(foreach f,$(MUTANTS_FILES),--file '$(f)') $(MUTANTS_ARGS)

# The model pass first: it takes minutes, the suite pass about an hour.
mutants: mutants-model mutants-suite

mutants-list: mutants-tool
	$(CARGO) mutants --list $(MUTANTS_FLAGS)

# Pass 1: the whole suite judges each mutant of core, in three stages that end where
# `cargo test --workspace` would: core's own tests (unit tests and spec/vectors), then, for the
# mutants nobody caught yet (--iterate), the tests crate (model, property tests, recipes, vectors),
# then, for what is still missed, the whole workspace. Sound because each stage runs a subset of
# the workspace's tests: a mutant one of them fails, the whole suite fails too; and much cheaper,
# since a mutant core catches costs one rebuild of core instead of one of every crate above it.
# The later stages skip the baseline (the unmutated suite passes in `make test-rust`).
# cargo-mutants exits 2 when a mutant survives and 3 on a timeout: both are results, not errors.
# (Written as `cmd || {...}`: the recipe shell runs with -e, which would stop at `cmd; rc=$$?`.)
MUTANTS_RESULT = || { rc=$$?; [ $$rc -eq 2 ] || [ $$rc -eq 3 ] || exit $$rc; }
mutants-suite: mutants-tool
	@mkdir -p target/mutants/suite
	$(CARGO) mutants $(MUTANTS_FLAGS) --test-package idempo-core \
		--output target/mutants/suite $(MUTANTS_RESULT)
	$(CARGO) mutants $(MUTANTS_FLAGS) --iterate --test-package idempo-tests --baseline skip \
		--output target/mutants/suite $(MUTANTS_RESULT)
	$(CARGO) mutants $(MUTANTS_FLAGS) --iterate --test-workspace=true --baseline skip \
		--output target/mutants/suite $(MUTANTS_RESULT)
	python3 scripts/mutants_table.py target/mutants/suite

# Pass 2: only the model's fast tier judges (what the model alone catches): its guarantee
# tables and witnesses, without the pinned state counts (IDEMPO_MODEL_NO_PINS) and without the
# mutation tests (whose pinned depths would judge by step count, not by a broken guarantee).
# --baseline skip: cargo-mutants 27 runs its unmutated baseline on the mutated package (core),
# which has no model_check target; the fast tier passes unmutated in test-rust.
# By default only the 36 mutants the target names (spec/MODEL.md §5.2): every mutant of a store
# primitive (store.rs) and of the flow's release/abandon choice. IDEMPO_MODEL_FAIL_FAST stops
# each exploration at the first counterexample its table does not expect and ends the test process
# at the first broken table (the verdict a full run would give, in seconds instead of the minutes a
# broken model's exploration can take); a survivor still explores everything (about 2 minutes);
# MUTANTS_MODEL_FILES='$(MUTANTS_FILES)' MUTANTS_MODEL_RE='.' judges all of them (days).
MUTANTS_MODEL_FILES ?= core/src/machine/store.rs core/src/machine/flow.rs
MUTANTS_MODEL_RE ?= store\.rs|ServerFlow::(on_finished|release|abandon)
mutants-model: mutants-tool
	@mkdir -p target/mutants/model
	IDEMPO_MODEL_NO_PINS=1 IDEMPO_MODEL_FAIL_FAST=1 $(CARGO) mutants --no-shuffle -j $(MUTANTS_JOBS) --timeout $(MUTANTS_TIMEOUT) \
		$(foreach f,$(MUTANTS_MODEL_FILES),--file '$(f)') --re '$(MUTANTS_MODEL_RE)' $(MUTANTS_ARGS) \
		--test-package idempo-tests --baseline skip \
		--output target/mutants/model -- --test model_check -- --skip mutation_ $(MUTANTS_RESULT)
	python3 scripts/mutants_table.py target/mutants/model

# The scoped pass: the primitives, decide and the cleanup machine, judged by core's tests alone.
MUTANTS_CORE_FILES = core/src/machine/store.rs core/src/machine/mod.rs core/src/machine/cleanup.rs
mutants-core: mutants-tool
	@mkdir -p target/mutants/core-primitives
	$(CARGO) mutants --no-shuffle -j $(MUTANTS_JOBS) --timeout 300 \
		$(foreach f,$(MUTANTS_CORE_FILES),--file '$(f)') --test-package idempo-core \
		--output target/mutants/core-primitives $(MUTANTS_ARGS)
