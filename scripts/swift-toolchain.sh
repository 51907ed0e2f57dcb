#!/usr/bin/env bash
# swift-toolchain.sh: a Swift 6 toolchain for building and testing bindings/swift on Linux.
#
# Debian 12 (the CI image) ships no Swift compiler; Debian 13 (trixie) ships `swiftlang` (Swift 6.0.x).
# This script bootstraps a minimal Debian 13 root into a cache folder with debootstrap, installs
# swiftlang there, and runs commands inside it with chroot, the repository bind-mounted at the same
# path so paths are identical inside and outside. Needs root, ~3 GB of disk and ~4 minutes the first
# time; afterwards the root is reused (the cache lives outside the repository, so it survives clones).
#
#   scripts/swift-toolchain.sh install           install once; a no-op when the root is ready
#   scripts/swift-toolchain.sh run DIR CMD [ARG] run CMD inside the root with DIR bind-mounted at the
#                                                same path and used as working directory, e.g.
#                                                scripts/swift-toolchain.sh run "$PWD" swift test
#   scripts/swift-toolchain.sh status            print whether the root is ready (exit 1 if not)
#   scripts/swift-toolchain.sh path              print the root folder
#
# Commands run with a clean environment plus the caller's IDEMPO_* variables.
# Environment: IDEMPO_SWIFT_ROOT  root folder (default /opt/idempo-swift-root)
#              IDEMPO_DEBIAN_MIRROR  Debian mirror (default: the one this machine's apt uses)
#
# Rust libraries are built on the host (glibc 2.36) and linked from Swift inside the root
# (glibc 2.41): linking older-glibc objects against a newer glibc is supported.
set -euo pipefail

ROOT="${IDEMPO_SWIFT_ROOT:-/opt/idempo-swift-root}"
SUITE=trixie
READY="$ROOT/.idempo-swift-ready"
BOOTSTRAPPED="$ROOT/.idempo-debootstrap-done"
LOCK="${ROOT%/}.lock"
PACKAGES="swiftlang libc6-dev libstdc++-14-dev python3 ca-certificates"

log() { echo "swift-toolchain: $*" >&2; }
die() { log "$*"; exit 1; }

mirror() {
  if [ -n "${IDEMPO_DEBIAN_MIRROR:-}" ]; then echo "$IDEMPO_DEBIAN_MIRROR"; return; fi
  local uri=""
  uri=$(grep -h -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)
  [ -n "$uri" ] || uri=$(grep -h -E '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)
  [ -n "$uri" ] || uri=http://deb.debian.org/debian
  echo "$uri"
}

mount_proc() {
  mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
}

ensure_dev() {
  # minbase normally creates the device nodes; bind the host's /dev if it did not (containers).
  if [ ! -c "$ROOT/dev/null" ] && ! mountpoint -q "$ROOT/dev"; then
    mount --bind /dev "$ROOT/dev"
  fi
}

do_install() {
  if [ -f "$READY" ]; then return 0; fi
  [ "$(id -u)" = 0 ] || die "install needs root (debootstrap, chroot, mount)"
  mkdir -p "$(dirname "$ROOT")"
  exec 9>"$LOCK"
  if ! flock -n 9; then
    log "another install holds $LOCK; waiting"
    flock 9
  fi
  if [ -f "$READY" ]; then return 0; fi
  local started=$SECONDS
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap on the host"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
  fi
  if [ ! -f "$BOOTSTRAPPED" ]; then
    if [ -e "$ROOT" ] && [ -n "$(ls -A "$ROOT" 2>/dev/null)" ]; then
      log "removing an unfinished root at $ROOT"
      for m in proc dev; do mountpoint -q "$ROOT/$m" && umount -l "$ROOT/$m"; done
      rm -rf --one-file-system "$ROOT"
    fi
    local m; m=$(mirror)
    log "[1/3] debootstrap Debian $SUITE (minbase) into $ROOT from $m"
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$ROOT" "$m" >"$ROOT.debootstrap.log" 2>&1 \
      || { tail -n 20 "$ROOT.debootstrap.log" >&2; die "debootstrap failed (log: $ROOT.debootstrap.log)"; }
    touch "$BOOTSTRAPPED"
    log "      done in $((SECONDS - started))s"
  fi
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
  mount_proc
  ensure_dev
  log "[2/3] apt-get install $PACKAGES (inside the root; the largest step)"
  chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    /bin/bash -c "apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $PACKAGES >/dev/null && apt-get clean" \
    || die "apt-get install inside $ROOT failed"
  log "[3/3] checking the compiler"
  chroot "$ROOT" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root swift --version 2>&1 | head -n1 >&2 \
    || die "swift does not run inside $ROOT"
  touch "$READY"
  log "ready in $((SECONDS - started))s ($(du -sh --one-file-system "$ROOT" 2>/dev/null | cut -f1))"
}

do_run() {
  [ $# -ge 2 ] || die "usage: swift-toolchain.sh run DIR CMD [ARG...]"
  local dir
  dir=$(cd "$1" && pwd -P); shift
  do_install
  mount_proc
  ensure_dev
  # Serialise runs: the bind mount below is shared by everything inside the root.
  exec 8>"$ROOT/.idempo-run.lock"
  flock 8
  mkdir -p "$ROOT$dir"
  local mounted=0
  if ! mountpoint -q "$ROOT$dir"; then mount --bind "$dir" "$ROOT$dir"; mounted=1; fi
  # A clean environment inside, plus every IDEMPO_* variable of the caller.
  local -a passenv=()
  local name
  while IFS= read -r name; do passenv+=("$name=${!name}"); done < <(compgen -e | grep '^IDEMPO_' || true)
  local rc=0
  chroot "$ROOT" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
    "${passenv[@]}" /bin/bash -c 'cd "$0" && exec "$@"' "$dir" "$@" || rc=$?
  if [ "$mounted" = 1 ]; then umount "$ROOT$dir" 2>/dev/null || umount -l "$ROOT$dir" || true; fi
  return "$rc"
}

case "${1:-}" in
  install) do_install ;;
  run) shift; do_run "$@" ;;
  status) if [ -f "$READY" ]; then echo "ready: $ROOT"; else echo "not installed: $ROOT"; exit 1; fi ;;
  path) echo "$ROOT" ;;
  *) sed -n '2,21p' "$0" >&2; exit 2 ;;
esac
