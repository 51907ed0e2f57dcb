# Operations files (deploy/): Prometheus alert rules, nginx/Envoy/Istio/Linkerd retry settings.
#
#   make test-ops   promtool check + unit test of the alert rules, nginx -t of the nginx snippet,
#                   YAML parse of the mesh files, PromQL parse of the Grafana dashboard and a
#                   check that it and the alerts use only series idempo exports (scripts/check-deploy.sh)

TEST_TARGETS += test-ops

.PHONY: test-ops

test-ops: python-setup
	./scripts/check-deploy.sh
