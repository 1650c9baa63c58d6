#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests.
#
#   pg-test-server.sh start DIR   creates DIR, initdb's a cluster in DIR/data,
#                                 starts it on a free TCP port of 127.0.0.1 and
#                                 writes its URL to DIR/url:
#                                   postgresql://postgres@127.0.0.1:PORT/idem_test
#   pg-test-server.sh stop DIR    stops the server (if running) and removes DIR.
#                                 Idempotent: fine if DIR is absent or stopped.
#   pg-test-server.sh restart DIR crashes and restarts the server of DIR
#                                 (pg_ctl restart -m immediate: no shutdown
#                                 checkpoint, crash recovery on start) on the
#                                 same port; DIR/url stays valid. Returns once
#                                 the server accepts connections again.
#
# The server trusts local connections (-A trust), runs with fsync and
# synchronous_commit on (the store's durability assumptions), and keeps its
# unix socket in DIR. PostgreSQL refuses to run as root: as root the binaries
# run as the `postgres` user through runuser; otherwise they run as the caller.
#
# PG_BIN overrides the directory of the PostgreSQL binaries.
set -euo pipefail

usage() {
  echo "usage: $0 start|stop|restart DIR" >&2
  exit 2
}

[[ $# -eq 2 ]] || usage
cmd=$1
dir=$2
[[ -n "$dir" && "$dir" != "/" ]] || usage

find_bin() {
  if [[ -n "${PG_BIN:-}" ]]; then
    echo "$PG_BIN"
    return
  fi
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [[ -x "$d/pg_ctl" ]] && echo "$d"
  done | sort -V | tail -n 1
}

PG_BIN=$(find_bin)
if [[ -z "$PG_BIN" || ! -x "$PG_BIN/pg_ctl" ]]; then
  echo "pg-test-server: no PostgreSQL binaries found (set PG_BIN)" >&2
  exit 1
fi

# Runs a PostgreSQL binary as the server's owner.
as_owner() {
  if [[ $(id -u) -eq 0 ]]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# True if nothing listens on 127.0.0.1:$1 and a bind succeeds.
port_is_free() {
  local port=$1
  if command -v ss >/dev/null 2>&1; then
    if ss -Htln "sport = :$port" 2>/dev/null | grep -q .; then
      return 1
    fi
  fi
  if command -v python3 >/dev/null 2>&1; then
    python3 - "$port" <<'EOF' >/dev/null 2>&1
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.close()
EOF
    return $?
  fi
  # No python: bash's /dev/tcp only tells whether something accepts.
  ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

start() {
  if [[ -f "$dir/data/postmaster.pid" ]]; then
    echo "pg-test-server: a server is already set up in $dir; stopping it first" >&2
    stop
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  if [[ $(id -u) -eq 0 ]]; then
    chown postgres: "$dir"
  fi
  chmod 700 "$dir"

  as_owner "$PG_BIN/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --locale=C \
    >"$dir/initdb.log" 2>&1 || {
    cat "$dir/initdb.log" >&2
    exit 1
  }

  cat >>"$dir/data/postgresql.conf" <<EOF

# ---- pg-test-server.sh (the port is given on the command line)
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
fsync = on
synchronous_commit = on
max_connections = 200
EOF

  local tries=0 port started=0
  while [[ $tries -lt 20 ]]; do
    tries=$((tries + 1))
    port=$((20000 + RANDOM % 30000))
    port_is_free "$port" || continue
    if as_owner "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -o "-p $port" -w -t 60 \
      start >"$dir/pg_ctl.log" 2>&1; then
      started=1
      break
    fi
    # Lost a race for the port (or another failure): show why and try again.
    tail -n 5 "$dir/server.log" >&2 || true
  done
  if [[ $started -ne 1 ]]; then
    echo "pg-test-server: could not start PostgreSQL in $dir" >&2
    cat "$dir/pg_ctl.log" >&2 || true
    exit 1
  fi

  as_owner "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U postgres idem_test
  echo "postgresql://postgres@127.0.0.1:$port/idem_test" >"$dir/url.tmp"
  mv "$dir/url.tmp" "$dir/url"
  echo "pg-test-server: started $(cat "$dir/url") in $dir"
}

stop() {
  if [[ -f "$dir/data/postmaster.pid" ]]; then
    as_owner "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null 2>&1 || true
    if [[ -f "$dir/data/postmaster.pid" ]]; then
      # pg_ctl failed (or the server is wedged): kill the postmaster we started.
      local pid
      pid=$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null || true)
      if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
        kill -QUIT "$pid" 2>/dev/null || true
        sleep 1
      fi
    fi
  fi
  rm -rf "$dir"
  echo "pg-test-server: stopped and removed $dir"
}

# An immediate restart: the postmaster and its backends quit at once (every
# client connection breaks mid-transaction), then the server starts again
# with the options it was started with (postmaster.opts: the same port) and
# replays the WAL. For the tests of reconnection and lost-commit handling.
restart() {
  if [[ ! -f "$dir/data/postmaster.opts" ]]; then
    echo "pg-test-server: no server set up in $dir (run start first)" >&2
    exit 1
  fi
  as_owner "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -m immediate -w -t 60 \
    restart >"$dir/pg_ctl.log" 2>&1 || {
    echo "pg-test-server: could not restart PostgreSQL in $dir" >&2
    cat "$dir/pg_ctl.log" >&2 || true
    tail -n 20 "$dir/server.log" >&2 || true
    exit 1
  }
  echo "pg-test-server: restarted $(cat "$dir/url" 2>/dev/null || echo "the server") in $dir"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  restart) restart ;;
  *) usage ;;
esac
