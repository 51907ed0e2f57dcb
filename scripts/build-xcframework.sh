#!/usr/bin/env bash
# build-xcframework.sh: the Apple build of the idempo Swift package's Rust core (macOS only).
#
# Needs macOS with Xcode (xcodebuild, lipo, strip, ditto, swift) and rustup. Builds the
# idempo-swift static library for
#   aarch64-apple-ios        iOS devices
#   aarch64-apple-ios-sim    iOS simulator on Apple silicon  } lipo'd into one simulator library
#   x86_64-apple-ios         iOS simulator on Intel          }
#   aarch64-apple-darwin     macOS on Apple silicon           } lipo'd into one macOS library
#   x86_64-apple-darwin      macOS on Intel                   }
# then packs them with the FFI header and an XCFramework modulemap (module IdempoFFI) into
#   bindings/swift/IdempoFFI.xcframework         (what Package.swift uses on Apple platforms)
#   bindings/swift/IdempoFFI.xcframework.zip     (to publish; its checksum is printed)
# To ship a release, upload the zip and build the package with
#   IDEMPO_FFI_URL=<zip url> IDEMPO_FFI_CHECKSUM=<printed checksum>
# or replace the path-based binaryTarget in Package.swift with .binaryTarget(url:checksum:).
#
# The header and modulemap are generated (uniffi library mode) from an UNSTRIPPED host build,
# which is where uniffi 0.32 reads the interface metadata; the shipped libraries are release
# builds without debug info. The committed Swift bindings are checked against the same build.
#
#   scripts/build-xcframework.sh            build everything
#   IDEMPO_XCF_SKIP_MACOS=1 scripts/...     iOS slices only
set -euo pipefail

if [ "$(uname -s)" != Darwin ]; then
  echo "build-xcframework: needs macOS with Xcode (this is $(uname -s)); on Linux use 'make test-swift'" >&2
  exit 2
fi
for tool in xcodebuild lipo strip ditto swift cargo rustup; do
  command -v "$tool" >/dev/null || { echo "build-xcframework: '$tool' not found" >&2; exit 2; }
done

cd "$(dirname "$0")/.."
repo=$(pwd -P)
out="$repo/bindings/swift"
work="$repo/target/xcframework"
ios_targets=(aarch64-apple-ios aarch64-apple-ios-sim x86_64-apple-ios)
mac_targets=(aarch64-apple-darwin x86_64-apple-darwin)
targets=("${ios_targets[@]}")
if [ "${IDEMPO_XCF_SKIP_MACOS:-0}" != 1 ]; then targets+=("${mac_targets[@]}"); fi

echo "build-xcframework: [1/5] rust targets" >&2
rustup target add "${targets[@]}" >/dev/null

echo "build-xcframework: [2/5] generated bindings (from the unstripped host build)" >&2
bindings/swift/gen-bindings.sh check
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
host_lib="$target_dir/debug/libidempo_swift.dylib"
rm -rf "$work" && mkdir -p "$work/Headers"
"$target_dir/debug/uniffi-bindgen-swift" "$host_lib" "$work/Headers" --headers >/dev/null
"$target_dir/debug/uniffi-bindgen-swift" "$host_lib" "$work/Headers" --modulemap --xcframework \
  --module-name IdempoFFI --modulemap-filename module.modulemap >/dev/null

echo "build-xcframework: [3/5] release static libraries: ${targets[*]}" >&2
for t in "${targets[@]}"; do
  CARGO_PROFILE_RELEASE_DEBUG=false cargo build -q --release --lib -p idempo-swift --target "$t"
done
lib() { echo "$target_dir/$1/release/libidempo_swift.a"; }

echo "build-xcframework: [4/5] lipo + strip" >&2
mkdir -p "$work/ios" "$work/ios-simulator"
cp "$(lib aarch64-apple-ios)" "$work/ios/libidempo_swift.a"
lipo -create "$(lib aarch64-apple-ios-sim)" "$(lib x86_64-apple-ios)" -output "$work/ios-simulator/libidempo_swift.a"
args=(-library "$work/ios/libidempo_swift.a" -headers "$work/Headers"
      -library "$work/ios-simulator/libidempo_swift.a" -headers "$work/Headers")
if [ "${IDEMPO_XCF_SKIP_MACOS:-0}" != 1 ]; then
  mkdir -p "$work/macos"
  lipo -create "$(lib aarch64-apple-darwin)" "$(lib x86_64-apple-darwin)" -output "$work/macos/libidempo_swift.a"
  args+=(-library "$work/macos/libidempo_swift.a" -headers "$work/Headers")
fi
for a in "$work"/*/libidempo_swift.a; do strip -S -x "$a" 2>/dev/null || strip -S "$a"; done

echo "build-xcframework: [5/5] xcodebuild -create-xcframework" >&2
rm -rf "$out/IdempoFFI.xcframework" "$out/IdempoFFI.xcframework.zip"
xcodebuild -create-xcframework "${args[@]}" -output "$out/IdempoFFI.xcframework" >/dev/null
(cd "$out" && ditto -c -k --sequesterRsrc --keepParent IdempoFFI.xcframework IdempoFFI.xcframework.zip)
checksum=$(cd "$repo" && swift package compute-checksum "$out/IdempoFFI.xcframework.zip")
echo "built bindings/swift/IdempoFFI.xcframework and bindings/swift/IdempoFFI.xcframework.zip"
echo "checksum: $checksum"
