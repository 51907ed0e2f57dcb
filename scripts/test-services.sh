#!/usr/bin/env bash
# Throwaway PostgreSQL and Redis servers for the binding test suites.
#
#   scripts/test-services.sh start DIR   start both (data in DIR, random free localhost ports), wait until
#                                        they answer, print IDEMPO_TEST_PG_DSN=... and
#                                        IDEMPO_TEST_REDIS_URL=... lines, and write them to DIR/env
#   scripts/test-services.sh stop DIR    stop both (safe to call twice, or after a failed start)
#
# Installs nothing: scripts/setup.d/20-services.sh installs the Debian packages. PostgreSQL refuses to
# run as root, so as root it runs as the `postgres` OS user (runuser). PostgreSQL listens on 127.0.0.1
# with trust authentication and fsync off (the data is thrown away); Redis runs with persistence off
# and `maxmemory-policy noeviction`, as idempo requires.
set -euo pipefail

die() {
  echo "test-services: $*" >&2
  exit 1
}

usage() {
  echo "usage: $0 start|stop DIR" >&2
  exit 2
}

[ $# -eq 2 ] || usage
cmd=$1
dir=$2

pg_bindir() {
  if command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(readlink -f "$(command -v pg_ctl)")"
    return
  fi
  local found
  found=$(compgen -G '/usr/lib/postgresql/*/bin' | sort -V | tail -n 1 || true)
  [ -n "$found" ] || die "PostgreSQL binaries not found (run scripts/setup.sh)"
  echo "$found"
}

# Runs a PostgreSQL program as the postgres OS user when we are root, else as ourselves.
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

free_port() {
  python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

pg_datadir() {
  if [ -f "$dir/pgdata" ]; then cat "$dir/pgdata"; else echo "$dir/pg"; fi
}

start_pg() {
  local bindir data port tries=0
  bindir=$(pg_bindir)
  data="$dir/pg"
  mkdir -p "$data"
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$data"
    chmod 700 "$data"
    # DIR may sit under a path the postgres user cannot traverse (e.g. /root): use /tmp then.
    if ! runuser -u postgres -- test -w "$data"; then
      rmdir "$data"
      data=$(mktemp -d /tmp/idempo-pg.XXXXXX)
      chown postgres: "$data"
      echo "$data" >"$dir/pgdata"
    fi
  fi
  as_pg "$bindir/initdb" -D "$data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 ||
    die "initdb failed, see $dir/initdb.log"
  while :; do
    port=$(free_port)
    if as_pg "$bindir/pg_ctl" -D "$data" -l "$data/server.log" -w -t 30 \
      -o "-p $port -k $data -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=200" \
      start >"$dir/pg_ctl.log" 2>&1; then
      break
    fi
    tries=$((tries + 1))
    [ "$tries" -lt 3 ] || die "PostgreSQL did not start, see $data/server.log"
  done
  as_pg "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -t 10 || die "PostgreSQL not ready on port $port"
  echo "$port" >"$dir/pg.port"
  echo "postgresql://postgres@127.0.0.1:$port/postgres"
}

start_redis() {
  local port tries=0
  command -v redis-server >/dev/null 2>&1 || die "redis-server not found (run scripts/setup.sh)"
  while :; do
    port=$(free_port)
    if redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
      --maxmemory-policy noeviction --daemonize yes --pidfile "$dir/redis.pid" \
      --logfile "$dir/redis.log" --dir "$dir" >/dev/null 2>&1; then
      local i
      for i in $(seq 1 100); do
        if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
          echo "$port" >"$dir/redis.port"
          echo "redis://127.0.0.1:$port/0"
          return 0
        fi
        sleep 0.05
      done
    fi
    tries=$((tries + 1))
    [ "$tries" -lt 3 ] || die "Redis did not start, see $dir/redis.log"
  done
}

stop_all() {
  local data bindir
  data=$(pg_datadir)
  if [ -f "$data/postmaster.pid" ]; then
    bindir=$(pg_bindir)
    as_pg "$bindir/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  if [ -f "$dir/pgdata" ]; then
    rm -rf "$data"
    rm -f "$dir/pgdata"
  fi
  if [ -f "$dir/redis.pid" ]; then
    local pid
    pid=$(cat "$dir/redis.pid")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      local i
      for i in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
      done
    fi
    rm -f "$dir/redis.pid"
  fi
}

case "$cmd" in
start)
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ ! -e "$dir/env" ] || die "$dir already holds running services (run: $0 stop $dir)"
  # A failed start must not leave half the servers running.
  trap 'stop_all' ERR
  pg_dsn=$(start_pg)
  redis_url=$(start_redis)
  trap - ERR
  {
    echo "IDEMPO_TEST_PG_DSN=$pg_dsn"
    echo "IDEMPO_TEST_REDIS_URL=$redis_url"
  } >"$dir/env"
  cat "$dir/env"
  ;;
stop)
  [ -d "$dir" ] || exit 0
  dir=$(cd "$dir" && pwd)
  stop_all
  rm -f "$dir/env"
  ;;
*)
  usage
  ;;
esac
