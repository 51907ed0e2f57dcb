#!/usr/bin/env bash
# Throwaway PostgreSQL, PgBouncer and Redis servers for the binding test suites.
#
#   scripts/test-services.sh start DIR   start them (data in DIR, random free localhost ports), wait until
#                                        they answer, print IDEMPO_TEST_PG_DSN=...,
#                                        IDEMPO_TEST_PGBOUNCER_DSN=..., IDEMPO_TEST_REDIS_URL=... and
#                                        IDEMPO_TEST_REDIS_CLUSTER_NODES=host:port,... lines, and
#                                        write them to DIR/env
#   scripts/test-services.sh start-pair DIR   a PostgreSQL primary and a synchronous streaming standby
#                                        (pg_basebackup -R): IDEMPO_TEST_PG_PRIMARY_DSN=...,
#                                        IDEMPO_TEST_PG_STANDBY_DSN=..., IDEMPO_TEST_PG_MULTIHOST_DSN=...
#   scripts/test-services.sh promote DIR   stop the pair's primary at once and promote the standby
#   scripts/test-services.sh start-cluster-replicas DIR   a Redis Cluster of three primaries, each with
#                                        a replica (--cluster-replicas 1, cluster-node-timeout 2000 ms,
#                                        so a replica takes over about 2-4 s after its primary dies):
#                                        IDEMPO_TEST_REDIS_CLUSTER_NODES=host:port,... (six nodes);
#                                        DIR/redis-cluster/<port>.pid hold the nodes' pids
#   scripts/test-services.sh stop DIR    stop them (safe to call twice, or after a failed start)
#
# PgBouncer runs in transaction pooling mode in front of the PostgreSQL server (the topology of most
# managed PostgreSQL offerings): each transaction may run on another server connection, so a store
# that relies on session state (named prepared statements, SET without LOCAL) breaks behind it.
# The Redis Cluster has three primaries (cluster bus on port + 10000).
# IDEMPO_PGBOUNCER_LOGIN_RETRY=N (seconds) sets PgBouncer's server_login_retry (default: PgBouncer's
# own, 15 s: after one failed server login, e.g. during a PostgreSQL restart, it refuses clients
# that long before it tries again).
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
  echo "usage: $0 start|start-pair|promote|start-cluster-replicas|stop DIR" >&2
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

# A streaming standby of the server start_pg started (pg_basebackup -R), with synchronous
# replication on the primary, so a promotion loses no committed record. Prints its port.
start_standby() {
  local bindir data port primary tries=0
  bindir=$(pg_bindir)
  primary=$(cat "$dir/pg.port")
  data=$(mktemp -d /tmp/idempo-pg-standby.XXXXXX)
  echo "$data" >"$dir/pgstandby"
  if [ "$(id -u)" -eq 0 ]; then chown postgres: "$data"; fi
  chmod 700 "$data"
  as_pg "$bindir/pg_basebackup" -h 127.0.0.1 -p "$primary" -U postgres -D "$data" -R -X stream \
    >"$dir/basebackup.log" 2>&1 || die "pg_basebackup failed, see $dir/basebackup.log"
  while :; do
    port=$(free_port)
    if as_pg "$bindir/pg_ctl" -D "$data" -l "$data/server.log" -w -t 30 \
      -o "-p $port -k $data -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=200" \
      start >"$dir/pg_ctl.standby.log" 2>&1; then
      break
    fi
    tries=$((tries + 1))
    [ "$tries" -lt 3 ] || die "the standby did not start, see $data/server.log"
  done
  as_pg "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -t 10 || die "standby not ready on port $port"
  as_pg "$bindir/psql" -qAt -h 127.0.0.1 -p "$primary" -U postgres -c \
    "ALTER SYSTEM SET synchronous_standby_names = '*'" -c "SELECT pg_reload_conf()" >/dev/null
  local i
  for i in $(seq 1 200); do
    if [ "$(as_pg "$bindir/psql" -qAt -h 127.0.0.1 -p "$primary" -U postgres -c \
      "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")" = 1 ]; then
      echo "$port" >"$dir/pgstandby.port"
      echo "$port"
      return 0
    fi
    sleep 0.05
  done
  die "the standby did not become a synchronous standby"
}

# Stops the primary at once (as a crash would) and promotes the standby.
promote_standby() {
  local bindir
  bindir=$(pg_bindir)
  as_pg "$bindir/pg_ctl" -D "$(pg_datadir)" -m immediate -w stop >/dev/null 2>&1 ||
    die "could not stop the primary"
  as_pg "$bindir/pg_ctl" -D "$(cat "$dir/pgstandby")" -w -t 60 promote >/dev/null 2>&1 ||
    die "could not promote the standby"
}

start_pgbouncer() {
  local pg_port port tries=0 conf
  command -v pgbouncer >/dev/null 2>&1 || die "pgbouncer not found (run scripts/setup.sh)"
  pg_port=$(cat "$dir/pg.port")
  mkdir -p "$dir/pgbouncer"
  conf="$dir/pgbouncer/pgbouncer.ini"
  echo '"postgres" ""' >"$dir/pgbouncer/users.txt"
  if [ "$(id -u)" -eq 0 ]; then
    chown -R postgres: "$dir/pgbouncer"
    # As for PostgreSQL: DIR may not be reachable by the postgres user.
    if ! runuser -u postgres -- test -w "$dir/pgbouncer/users.txt"; then
      local alt
      alt=$(mktemp -d /tmp/idempo-pgbouncer.XXXXXX)
      cp "$dir/pgbouncer/users.txt" "$alt/"
      chown -R postgres: "$alt"
      conf="$alt/pgbouncer.ini"
      echo "$alt" >"$dir/pgbouncer.dir"
    fi
  fi
  local bdir
  bdir=$(dirname "$conf")
  while :; do
    port=$(free_port)
    cat >"$conf" <<INI
[databases]
postgres = host=127.0.0.1 port=$pg_port dbname=postgres user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $bdir/users.txt
pool_mode = transaction
max_client_conn = 400
default_pool_size = 8
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = $bdir/pgbouncer.log
pidfile = $bdir/pgbouncer.pid
INI
    if [ -n "${IDEMPO_PGBOUNCER_LOGIN_RETRY:-}" ]; then
      echo "server_login_retry = $IDEMPO_PGBOUNCER_LOGIN_RETRY" >>"$conf"
    fi
    [ "$(id -u)" -ne 0 ] || chown postgres: "$conf"
    if as_pg pgbouncer -d -q "$conf" >"$dir/pgbouncer.start.log" 2>&1; then
      local i
      for i in $(seq 1 100); do
        if as_pg "$(pg_bindir)/pg_isready" -q -h 127.0.0.1 -p "$port" -t 1 2>/dev/null; then
          echo "$bdir/pgbouncer.pid" >"$dir/pgbouncer.pidfile"
          echo "postgresql://postgres@127.0.0.1:$port/postgres"
          return 0
        fi
        sleep 0.05
      done
    fi
    tries=$((tries + 1))
    [ "$tries" -lt 3 ] || die "PgBouncer did not start, see $bdir/pgbouncer.log"
  done
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

# A free port whose cluster bus port (port + 10000) is free too.
free_cluster_port() {
  python3 -c 'import socket
while True:
    a = socket.socket()
    a.bind(("127.0.0.1", 0))
    port = a.getsockname()[1]
    if port + 10000 > 65535:
        a.close()
        continue
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", port + 10000))
    except OSError:
        a.close()
        continue
    b.close()
    a.close()
    print(port)
    break'
}

# A Redis Cluster of three primaries (no replicas; with argument 1: three primaries and three
# replicas, one each), slots spread by redis-cli, persistence off, noeviction on every node.
# Prints the nodes as host:port,host:port,...
start_redis_cluster() {
  local replicas=${1:-0}
  local ports=() i port nodes tries
  mkdir -p "$dir/redis-cluster"
  for i in $(seq 1 $((3 * (replicas + 1)))); do
    tries=0
    while :; do
      port=$(free_cluster_port)
      if redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --maxmemory-policy noeviction --cluster-enabled yes \
        --cluster-config-file "$dir/redis-cluster/nodes-$port.conf" --cluster-node-timeout 2000 \
        --daemonize yes --pidfile "$dir/redis-cluster/$port.pid" \
        --logfile "$dir/redis-cluster/$port.log" --dir "$dir/redis-cluster" >/dev/null 2>&1; then
        local j
        for j in $(seq 1 100); do
          if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
            break
          fi
          sleep 0.05
        done
        ports+=("$port")
        break
      fi
      tries=$((tries + 1))
      [ "$tries" -lt 3 ] || die "Redis Cluster node did not start, see $dir/redis-cluster/"
    done
  done
  nodes=()
  for port in "${ports[@]}"; do nodes+=("127.0.0.1:$port"); done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas "$replicas" --cluster-yes \
    >"$dir/redis-cluster/create.log" 2>&1 || die "redis-cli --cluster create failed, see $dir/redis-cluster/create.log"
  for i in $(seq 1 200); do
    local ok=1
    for port in "${ports[@]}"; do
      redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
    done
    [ "$ok" -eq 1 ] && break
    sleep 0.05
  done
  [ "$ok" -eq 1 ] || die "Redis Cluster did not reach cluster_state:ok, see $dir/redis-cluster/"
  if [ "$replicas" -gt 0 ]; then
    # Every replica in sync with its primary (a replica that never synced would not take over).
    for i in $(seq 1 400); do
      ok=1
      for port in "${ports[@]}"; do
        local info
        info=$(redis-cli -h 127.0.0.1 -p "$port" info replication 2>/dev/null || true)
        if grep -q 'role:slave' <<<"$info" && ! grep -q 'master_link_status:up' <<<"$info"; then ok=0; fi
      done
      [ "$(redis-cli -h 127.0.0.1 -p "${ports[0]}" cluster nodes 2>/dev/null | grep -c slave)" -eq 3 ] || ok=0
      [ "$ok" -eq 1 ] && break
      sleep 0.05
    done
    [ "$ok" -eq 1 ] || die "the Redis Cluster's replicas did not sync, see $dir/redis-cluster/"
  fi
  (IFS=,; echo "${nodes[*]}")
}

stop_all() {
  local data bindir
  if [ -f "$dir/pgstandby" ]; then
    local sdata
    sdata=$(cat "$dir/pgstandby")
    if [ -f "$sdata/postmaster.pid" ]; then
      as_pg "$(pg_bindir)/pg_ctl" -D "$sdata" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$sdata"
    rm -f "$dir/pgstandby" "$dir/pgstandby.port"
  fi
  if [ -f "$dir/pgbouncer.pidfile" ]; then
    local bpid
    bpid=$(cat "$(cat "$dir/pgbouncer.pidfile")" 2>/dev/null || true)
    if [ -n "$bpid" ] && kill -0 "$bpid" 2>/dev/null; then
      kill "$bpid" 2>/dev/null || true
      local j
      for j in $(seq 1 100); do
        kill -0 "$bpid" 2>/dev/null || break
        sleep 0.05
      done
    fi
    rm -f "$dir/pgbouncer.pidfile"
  fi
  if [ -f "$dir/pgbouncer.dir" ]; then
    rm -rf "$(cat "$dir/pgbouncer.dir")"
    rm -f "$dir/pgbouncer.dir"
  fi
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
  if [ -d "$dir/redis-cluster" ]; then
    local f cpid k
    for f in "$dir"/redis-cluster/*.pid; do
      [ -e "$f" ] || continue
      cpid=$(cat "$f")
      if [ -n "$cpid" ] && kill -0 "$cpid" 2>/dev/null; then
        kill "$cpid" 2>/dev/null || true
        for k in $(seq 1 100); do
          kill -0 "$cpid" 2>/dev/null || break
          sleep 0.05
        done
      fi
      rm -f "$f"
    done
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
  pgbouncer_dsn=$(start_pgbouncer)
  redis_url=$(start_redis)
  redis_cluster=$(start_redis_cluster)
  trap - ERR
  {
    echo "IDEMPO_TEST_PG_DSN=$pg_dsn"
    echo "IDEMPO_TEST_PGBOUNCER_DSN=$pgbouncer_dsn"
    echo "IDEMPO_TEST_REDIS_URL=$redis_url"
    echo "IDEMPO_TEST_REDIS_CLUSTER_NODES=$redis_cluster"
  } >"$dir/env"
  cat "$dir/env"
  ;;
start-pair)
  # A PostgreSQL primary with a synchronous streaming standby, for failover tests.
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ ! -e "$dir/env" ] || die "$dir already holds running services (run: $0 stop $dir)"
  trap 'stop_all' ERR
  primary_dsn=$(start_pg)
  standby_port=$(start_standby)
  trap - ERR
  primary_port=$(cat "$dir/pg.port")
  {
    echo "IDEMPO_TEST_PG_PRIMARY_DSN=$primary_dsn"
    echo "IDEMPO_TEST_PG_STANDBY_DSN=postgresql://postgres@127.0.0.1:$standby_port/postgres"
    echo "IDEMPO_TEST_PG_MULTIHOST_DSN=postgresql://postgres@127.0.0.1:$primary_port,127.0.0.1:$standby_port/postgres?target_session_attrs=read-write"
  } >"$dir/env"
  cat "$dir/env"
  ;;
start-cluster-replicas)
  # A Redis Cluster with a replica per primary, for failover runs (the evidence suite).
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ ! -e "$dir/env" ] || die "$dir already holds running services (run: $0 stop $dir)"
  trap 'stop_all' ERR
  redis_cluster=$(start_redis_cluster 1)
  trap - ERR
  echo "IDEMPO_TEST_REDIS_CLUSTER_NODES=$redis_cluster" >"$dir/env"
  cat "$dir/env"
  ;;
promote)
  [ -f "$dir/pgstandby" ] || die "$dir holds no standby (start it with: $0 start-pair $dir)"
  dir=$(cd "$dir" && pwd)
  promote_standby
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
