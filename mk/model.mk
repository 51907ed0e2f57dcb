# Model checking of the key state machine (tests/src/model; results in spec/MODEL.md).
#
#   make model        fast tier: the stateright guarantee tables and mutations plus the proptest
#                     suite (both also run in `cargo test --workspace`; about 1-2 min on 2 cores)
#   make model-deep   deep tier: larger configurations (#[ignore]d tests in tests/tests/model_deep.rs),
#                     depth-first on 2 threads; tens of minutes, several GB of memory
# Not in TEST_TARGETS: the fast tier already runs in test-rust.
.PHONY: model model-deep

model:
	$(CARGO) test -p idempo-tests --test model_check --test machine_proptest -- --nocapture

model-deep:
	$(CARGO) test -p idempo-tests --test model_deep -- --ignored --nocapture --test-threads=1
