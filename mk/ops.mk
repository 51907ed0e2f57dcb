# Operations files (deploy/): Prometheus alert rules, nginx/Envoy/Istio/Linkerd retry settings.
#
#   make test-ops   promtool check + unit test of the alert rules, nginx -t of the nginx snippet,
#                   YAML parse of the mesh files (scripts/check-deploy.sh)

TEST_TARGETS += test-ops

.PHONY: test-ops

test-ops: python-setup
	./scripts/check-deploy.sh
