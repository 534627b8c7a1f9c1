#!/usr/bin/env bash
# A private PostgreSQL cluster for tests: listens on 127.0.0.1:PORT only (trust auth), keeps its
# unix socket, data and log inside DIR, and runs with fsync off (test data, not durable).
#
#   tests/services/postgres.sh start DIR PORT   # create if needed, start, create db minions_test
#   tests/services/postgres.sh restart DIR      # fast restart (clients see their connections drop)
#   tests/services/postgres.sh stop DIR         # stop (the data stays in DIR)
#
# All three are idempotent. As root the cluster runs as the `postgres` user (initdb refuses root);
# otherwise as the calling user. Needs the server binaries (Debian: apt-get install postgresql).
# Then connect with: postgresql://postgres@127.0.0.1:PORT/minions_test
set -euo pipefail

die() { echo "postgres.sh: $*" >&2; exit 1; }
usage() { die "usage: postgres.sh start DIR PORT | restart DIR | stop DIR"; }

find_bin() {
  local dir
  if [[ -n "${PG_BINDIR:-}" ]]; then echo "$PG_BINDIR"; return; fi
  if command -v pg_config >/dev/null 2>&1; then
    dir=$(pg_config --bindir 2>/dev/null || true)
    if [[ -x "$dir/initdb" ]]; then echo "$dir"; return; fi
  fi
  # Homebrew's versioned postgresql@N formulas are keg-only: their binaries stay under opt/.
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) /usr/local/bin /opt/homebrew/bin \
             $(ls -d /opt/homebrew/opt/postgresql@*/bin /usr/local/opt/postgresql@*/bin 2>/dev/null | sort -V -r); do
    if [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then echo "$dir"; return; fi
  done
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
  die "no PostgreSQL server binaries (initdb, pg_ctl) found; on Debian: apt-get install postgresql (or set PG_BINDIR)"
}

# Runs a command as the cluster's owner.
as_owner() {
  if [[ $(id -u) -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || die "running as root needs a 'postgres' user to own the cluster"
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

is_running() { as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }

wait_ready() {
  local port=$1
  for _ in $(seq 1 100); do
    if as_owner "$BIN/pg_isready" -q -h 127.0.0.1 -p "$port" -d postgres; then return 0; fi
    sleep 0.1
  done
  die "the server in $DIR does not accept connections on 127.0.0.1:$port; see $DIR/log"
}

# Starts the cluster on $PORT, or restarts it when it runs: `when` "always", or "if-moved" (only
# when it listens on another port); then waits until it answers. `where` and `hint` go into the
# failure's message.
bring_up() {
  local when=$1 where=$2 hint=$3
  if is_running; then
    if [[ "$when" == always || "$(sed -n 4p "$DATA/postmaster.pid" 2>/dev/null || true)" != "$PORT" ]]; then
      as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w restart -l "$DIR/log" >/dev/null \
        || die "could not restart the cluster in $DIR$where; see $DIR/log"
    fi
  else
    as_owner "$BIN/pg_ctl" -D "$DATA" -w -t 30 start -l "$DIR/log" >/dev/null \
      || die "could not start the cluster in $DIR$where$hint; see $DIR/log"
  fi
  wait_ready "$PORT"
}

[[ $# -ge 2 ]] || usage
CMD=$1
DIR=$2
[[ "$DIR" = /* ]] || DIR="$(pwd)/$DIR"
DATA="$DIR/data"
BIN=$(find_bin)

case "$CMD" in
  start)
    [[ $# -eq 3 ]] || usage
    PORT=$3
    [[ "$PORT" =~ ^[0-9]+$ ]] || die "PORT must be a number, not '$PORT'"
    mkdir -p "$DIR/sock"
    if [[ $(id -u) -eq 0 ]]; then chown postgres: "$DIR" "$DIR/sock"; fi
    as_owner test -w "$DIR" || die "$DIR is not writable by $( [[ $(id -u) -eq 0 ]] && echo postgres || id -un) (is a parent folder closed to it?)"
    if [[ ! -f "$DATA/PG_VERSION" ]]; then
      rm -rf "$DATA"
      as_owner "$BIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --no-locale --no-sync >"$DIR/initdb.log" 2>&1 \
        || die "initdb failed; see $DIR/initdb.log"
    fi
    # Settings are rewritten on every start, so a changed PORT (or DIR moved) takes effect.
    cat >"$DATA/postgresql.auto.conf" <<EOF
# Written by tests/services/postgres.sh: a throwaway test cluster.
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR/sock'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 300
shared_buffers = '64MB'
EOF
    if [[ $(id -u) -eq 0 ]]; then chown postgres: "$DATA/postgresql.auto.conf"; fi
    bring_up if-moved " on port $PORT" " (port in use?)"
    exists=$(as_owner "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -Atqc \
      "SELECT 1 FROM pg_database WHERE datname = 'minions_test'") || die "cannot query the server on port $PORT"
    if [[ "$exists" != 1 ]]; then
      as_owner "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -qc "CREATE DATABASE minions_test" >/dev/null \
        || die "could not create database minions_test"
    fi
    ;;
  restart)
    [[ $# -eq 2 ]] || usage
    [[ -f "$DATA/PG_VERSION" ]] || die "no cluster in $DIR; run: postgres.sh start $DIR PORT"
    PORT=$(sed -n "s/^port = \([0-9]*\)$/\1/p" "$DATA/postgresql.auto.conf")
    bring_up always "" ""
    ;;
  stop)
    [[ $# -eq 2 ]] || usage
    if [[ -f "$DATA/PG_VERSION" ]] && is_running; then
      as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null || die "could not stop the cluster in $DIR"
    fi
    ;;
  *)
    usage
    ;;
esac
