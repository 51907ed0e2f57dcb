#!/usr/bin/env bash
# Generates the Swift side of the uniffi FFI from the compiled idempo-swift library.
#
#   bindings/swift/gen-bindings.sh generate   rewrite the committed generated files
#   bindings/swift/gen-bindings.sh check      regenerate into a temporary folder and fail on any
#                                             difference with the committed files (CI)
#
# uniffi 0.32 library mode reads the interface metadata from the library's symbol table, so the
# input is the UNSTRIPPED dev build (target/debug/libidempo_swift.so or .dylib); the Apple build strips
# only what it ships. Generated files (never edit them by hand):
#   Sources/IdempoBindings/IdempoBindings.swift   Swift wrapper (module IdempoBindings)
#   Sources/IdempoFFI/IdempoFFI.h                 C declarations of the FFI
#   Sources/IdempoFFI/module.modulemap            the C module IdempoFFI
# Names come from bindings/swift/uniffi.toml. Leaves target/debug/libidempo_swift.{a,so} as the
# plain (feature-less) build that the Swift package links.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd -P)"
repo="$(cd "$here/../.." && pwd -P)"
cd "$repo"
mode="${1:-}"
case "$mode" in generate|check) ;; *) sed -n '2,15p' "$0" >&2; exit 2 ;; esac

CARGO="${CARGO:-cargo}"
target_dir=$("$CARGO" metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
# The generator first (its feature set rebuilds the library), then the plain library last, so
# the files left in target/debug are the ones the Swift package links.
"$CARGO" build -q -p idempo-swift --features bindgen --bin uniffi-bindgen-swift
"$CARGO" build -q -p idempo-swift --lib
case "$(uname -s)" in Darwin) ext=dylib ;; *) ext=so ;; esac
lib="$target_dir/debug/libidempo_swift.$ext"
bindgen="$target_dir/debug/uniffi-bindgen-swift"
[ -f "$lib" ] || { echo "gen-bindings: $lib is missing" >&2; exit 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/IdempoBindings" "$out/IdempoFFI"
"$bindgen" "$lib" "$out/IdempoBindings" --swift-sources >/dev/null
"$bindgen" "$lib" "$out/IdempoFFI" --headers >/dev/null
"$bindgen" "$lib" "$out/IdempoFFI" --modulemap --module-name IdempoFFI --modulemap-filename module.modulemap >/dev/null
for f in IdempoBindings/IdempoBindings.swift IdempoFFI/IdempoFFI.h IdempoFFI/module.modulemap; do
  [ -s "$out/$f" ] || { echo "gen-bindings: the generator did not write $f" >&2; exit 1; }
done

dest="$here/Sources"
if [ "$mode" = generate ]; then
  for f in IdempoBindings/IdempoBindings.swift IdempoFFI/IdempoFFI.h IdempoFFI/module.modulemap; do
    mkdir -p "$(dirname "$dest/$f")"
    cp "$out/$f" "$dest/$f"
  done
  echo "gen-bindings: wrote bindings/swift/Sources/{IdempoBindings,IdempoFFI}"
else
  status=0
  for f in IdempoBindings/IdempoBindings.swift IdempoFFI/IdempoFFI.h IdempoFFI/module.modulemap; do
    if ! diff -u "$dest/$f" "$out/$f" >"$out/diff" 2>&1; then
      echo "gen-bindings: bindings/swift/Sources/$f is out of date:" >&2
      head -n 40 "$out/diff" >&2
      status=1
    fi
  done
  if [ "$status" != 0 ]; then
    echo "gen-bindings: run 'make swift-bindings' and commit the result" >&2
    exit 1
  fi
  echo "gen-bindings: generated Swift bindings are current"
fi
