# Model checking of the key state machine (tests/src/model; results in spec/MODEL.md).
#
#   make model        fast tier: the stateright guarantee tables (P1-P10, the contract C1-C4,
#                     liveness L), the mutations, the recipes under the model and the proptest
#                     suite (all also run in `cargo test --workspace`; model_check alone takes
#                     about 2 min 45 s of CPU: 1.5 min on an idle 2-core machine, 4-7 min loaded)
#   make test-recipes-pg   the shipped PostgreSQL recipes under concurrency: histories of four
#                     clients against a real server, direct and through PgBouncer, each checked for
#                     linearizability against core's primitives (tests/tests/recipes_postgres.rs;
#                     starts the servers with scripts/test-services.sh; about 10 s)
#   make model-deep   deep tier: larger configurations (#[ignore]d tests in tests/tests/model_deep.rs),
#                     depth-first on 2 threads; tens of minutes, several GB of memory
#   make model-deep-open  the one deep bound that has never finished (opt-in)
# Not in TEST_TARGETS: the fast tier and the recipes against PostgreSQL already run in test-rust
# (which has the servers: scripts/with-services.sh).
.PHONY: model model-deep model-deep-open test-recipes-pg

test-recipes-pg:
	./scripts/with-services.sh $(CARGO) test -q -p idempo-tests --test recipes_postgres -- --nocapture --test-threads=1

model:
	$(CARGO) test -p idempo-tests --test model_check --test recipes_model --test machine_proptest -- --nocapture

model-deep:
	$(CARGO) test -p idempo-tests --test model_deep -- --ignored --nocapture --test-threads=1 --skip open_

# The deep bound that has not finished yet (transactional, three clients in two scopes, two
# retries, clock 0..4): hours and tens of GB, if it ends at all on 2 cores (spec/MODEL.md §6).
model-deep-open:
	$(CARGO) test -p idempo-tests --test model_deep -- --ignored --nocapture --exact open_transactional_three_clients_two_scopes
