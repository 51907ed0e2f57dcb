#!/usr/bin/env bash
# Swift toolchain for bindings/swift: a Debian 13 root with swiftlang, made once per machine by
# scripts/swift-toolchain.sh (cached in $IDEMPO_SWIFT_ROOT, default /opt/idempo-swift-root; ~4 min
# and ~3 GB the first time, a file check afterwards). Set IDEMPO_SKIP_SWIFT=1 to skip.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${IDEMPO_SKIP_SWIFT:-0}" = 1 ]; then exit 0; fi
if scripts/swift-toolchain.sh status >/dev/null 2>&1; then exit 0; fi
scripts/swift-toolchain.sh install
