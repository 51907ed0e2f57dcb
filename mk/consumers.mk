# Consumers evidence (evidence/consumers/, docs/EVIDENCE.md "Consumers"): a storm of duplicated
# deliveries to four Redis Streams consumer processes (Python redis-py + idempotent_function, Node
# ioredis + idempotent) with kill -9 of consumers mid-function and the Redis that is broker and
# store killed and restarted; deliveries, executions, doubles, lost messages and typed errors.
#
#   make evidence-consumers        the short rows (~30 s), fails on a violation; part of
#                                  make evidence-short / make test
#   make evidence-consumers-long   more messages, kills and outages per row (~5 min)
TEST_TARGETS += evidence-consumers

.PHONY: evidence-consumers evidence-consumers-long

# The short evidence run includes the consumers rows.
evidence-short: evidence-consumers

evidence-consumers: python-setup node-build
	$(CURDIR)/.venv/bin/python -m mypy --ignore-missing-imports evidence/consumers
	$(CURDIR)/.venv/bin/python -m evidence.consumers.run --mode short

evidence-consumers-long: python-setup node-build
	$(CURDIR)/.venv/bin/python -m evidence.consumers.run --mode long
