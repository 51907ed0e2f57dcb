# Node package (bindings/node): the `idempo` npm package (napi-rs addon + TypeScript layer).
#
#   make test-node    build (release addon + tsc), type-check, then `node --test` against throwaway
#                     PostgreSQL and Redis (scripts/test-services.sh), including the shared vectors
#   make bench-node   fingerprint benchmark vs `canonicalize` + crypto and `json-canonicalize`
#   make node-build   rebuild the addon and the compiled TypeScript only
#   make node-dist    the npm tarballs in bindings/node/pkg-dist/: idempo-<version>.tgz and the
#                     prebuilt addon's platform package idempo-<platform>-<version>.tgz
#   make bench-node-express  peak RSS of a 100 MiB streamed response and time to first byte of a
#                     slow stream through Express (prints figures; run once)
NODE_DIR := bindings/node

TEST_TARGETS += test-node
BENCH_TARGETS += bench-node

.PHONY: test-node bench-node node-build node-setup node-dist bench-node-express

node-setup:
	bash scripts/setup.d/40-node.sh

node-build: node-setup
	cd $(NODE_DIR) && node scripts/install.cjs

test-node: node-build
	cd $(NODE_DIR) && node node_modules/typescript/bin/tsc -p tsconfig.json --noEmit
	cd $(NODE_DIR) && node node_modules/typescript/bin/tsc -p test/tsconfig.json --noEmit
	git diff --exit-code -- $(NODE_DIR)/native/index.d.ts $(NODE_DIR)/native/index.js || \
	  { echo "test-node: the committed napi-generated files are stale; commit the regenerated ones" >&2; exit 1; }
	cd $(NODE_DIR) && $(CURDIR)/scripts/with-services.sh node --test --test-concurrency=1 test/*.test.mjs

node-dist: node-build
	cd $(NODE_DIR) && node scripts/dist.cjs

bench-node-express: node-build
	cd $(NODE_DIR) && node bench/express-stream.mjs

bench-node: node-build
	cd $(NODE_DIR) && node bench/fingerprint.mjs
