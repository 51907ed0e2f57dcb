# Model checking of the key state machine (tests/src/model; results in spec/MODEL.md).
#
#   make model        fast tier: the stateright guarantee tables (P1-P10, the contract C1-C4,
#                     liveness L), the mutations, the recipes under the model and the proptest
#                     suite (all also run in `cargo test --workspace`; model_check alone takes
#                     about 2 min 45 s of CPU: 1.5 min on an idle 2-core machine, 4-7 min loaded)
#   make model-deep   deep tier: larger configurations (#[ignore]d tests in tests/tests/model_deep.rs),
#                     depth-first on 2 threads; tens of minutes, several GB of memory
# Not in TEST_TARGETS: the fast tier already runs in test-rust.
.PHONY: model model-deep

model:
	$(CARGO) test -p idempo-tests --test model_check --test recipes_model --test machine_proptest -- --nocapture

model-deep:
	$(CARGO) test -p idempo-tests --test model_deep -- --ignored --nocapture --test-threads=1
