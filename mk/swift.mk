# Swift package (Package.swift at the root, sources in bindings/swift): see bindings/swift/README.md.
#
#   make test-swift            toolchain (cached), Rust lib on the host, generated-bindings check,
#                              then `swift build` + `swift test` inside the Debian 13 root
#   make swift-bindings        regenerate the committed Swift bindings (after changing the FFI)
#   make swift-bindings-check  fail if the committed generated files are not current
#   make swift-build           build the package (and its tests) without running them
#
# Linux has no Swift toolchain on Debian 12: scripts/swift-toolchain.sh keeps one in a Debian 13
# root (IDEMPO_SWIFT_ROOT, default /opt/idempo-swift-root; ~4 min and ~3 GB once per machine) and
# runs swift there with this repository bind-mounted at the same path. The Rust library is built
# on the host and linked from there (glibc 2.36 objects against glibc 2.41: compatible).
SWIFT_TOOLCHAIN := ./scripts/swift-toolchain.sh
SWIFT_LIB_DIR := bindings/swift/.build/rust
SWIFT_FLAGS := --scratch-path bindings/swift/.build/swiftpm -Xlinker -L$(CURDIR)/$(SWIFT_LIB_DIR)
SWIFT_CARGO_TARGET = $(shell $(CARGO) metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')

TEST_TARGETS += test-swift

.PHONY: test-swift swift-toolchain swift-bindings swift-bindings-check swift-lib swift-build

swift-toolchain:
	$(SWIFT_TOOLCHAIN) install

swift-bindings:
	bindings/swift/gen-bindings.sh generate

# Builds the generator and the library (the check needs both) and regenerates into a temp folder.
swift-bindings-check:
	bindings/swift/gen-bindings.sh check

# The static library the package links, placed inside the repository so the root sees it.
swift-lib:
	$(CARGO) build -q -p idempo-swift --lib
	mkdir -p $(SWIFT_LIB_DIR)
	ln -f "$(SWIFT_CARGO_TARGET)/debug/libidempo_swift.a" $(SWIFT_LIB_DIR)/ 2>/dev/null \
	  || cp "$(SWIFT_CARGO_TARGET)/debug/libidempo_swift.a" $(SWIFT_LIB_DIR)/

swift-build: swift-toolchain swift-lib
	$(SWIFT_TOOLCHAIN) run $(CURDIR) swift build $(SWIFT_FLAGS) --build-tests

test-swift: swift-toolchain swift-bindings-check swift-lib
	$(SWIFT_TOOLCHAIN) run $(CURDIR) swift build $(SWIFT_FLAGS)
	$(SWIFT_TOOLCHAIN) run $(CURDIR) swift test $(SWIFT_FLAGS) --disable-swift-testing
