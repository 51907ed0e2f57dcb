# Operations files (deploy/): the Prometheus alert rules for the purge process's metrics.
#
#   make test-ops   promtool check rules + the rules' unit test (promtool test rules)
PROMTOOL ?= promtool

TEST_TARGETS += test-ops

.PHONY: test-ops

test-ops:
	$(PROMTOOL) check rules deploy/prometheus/idempo-alerts.yml
	cd deploy/prometheus && $(PROMTOOL) test rules idempo-alerts.test.yml
