#!/usr/bin/env bash
# make dist: the Python package as an abi3 wheel that installs without Rust, plus an sdist, in dist/.
#
#   DIST_COMPAT  manylinux tag to build for (default manylinux2014 = manylinux_2_17: glibc 2.17+,
#                every maintained Linux distribution). maturin checks the extension's symbols
#                against it (its auditwheel check) and refuses a wheel that would not load there.
#   DIST_ZIG     1 (default when the host's glibc is newer than the tag's): link with zig (the
#                `ziglang` PyPI package, installed into .venv on first use) against the tag's
#                glibc; 0: the host's linker (only for a tag at or above the host's glibc).
#   DIST_OUT     output folder (default dist/)
#
# The sdist (`pip install idempo-*.tar.gz`) compiles the extension from source: it needs cargo.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=$PWD/.venv
out=${DIST_OUT:-$PWD/dist}
compat=${DIST_COMPAT:-manylinux2014}
host_glibc=$(ldd --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+$' || echo "")
case $compat in
  manylinux2014) tag_glibc=2.17 ;;
  manylinux_2_*) tag_glibc=$(echo "$compat" | sed -E 's/manylinux_2_([0-9]+)/2.\1/') ;;
  *) tag_glibc="" ;;
esac
zig=${DIST_ZIG:-}
if [ -z "$zig" ]; then
  zig=0
  if [ -n "$host_glibc" ] && [ -n "$tag_glibc" ] &&
    [ "$(printf '%s\n%s\n' "$tag_glibc" "$host_glibc" | sort -V | tail -1)" != "$tag_glibc" ]; then
    zig=1  # the host's glibc is newer than the tag's: link against the tag's glibc with zig
  fi
fi

mkdir -p "$out"
args=(build --release --compatibility "$compat" -o "$out")
if [ "$zig" = 1 ]; then
  if ! "$venv/bin/python" -c "import ziglang" 2>/dev/null; then
    echo "dist: installing zig (the ziglang package) into .venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "ziglang>=0.11"
  fi
  args+=(--zig)
  echo "dist: host glibc $host_glibc is newer than $compat's $tag_glibc: linking with zig"
fi
cd bindings/python
PATH="$venv/bin:$PATH" "$venv/bin/maturin" "${args[@]}"
PATH="$venv/bin:$PATH" "$venv/bin/maturin" sdist -o "$out"
ls -l "$out"
