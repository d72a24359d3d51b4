#!/usr/bin/env bash
# A private PostgreSQL server on 127.0.0.1 for the multi-worker tests and local trials of the
# multi-worker recipe. Needs Debian's `postgresql` package (its binaries and `postgres` user).
#
#   scripts/postgres.sh start|stop|restart|url
#
# TUNER_PGDATA (default /tmp/tuner-postgres) holds the cluster, TUNER_PGPORT (default 55432) is
# its port; authentication is `trust` for local connections only, which is fine for a test
# server bound to loopback and never for a shared one (see the README's recipe).
set -euo pipefail

PGDATA="${TUNER_PGDATA:-/tmp/tuner-postgres}"
PORT="${TUNER_PGPORT:-55432}"
BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
if [ -z "$BIN" ]; then
  echo "PostgreSQL is not installed: apt-get install postgresql" >&2
  exit 1
fi

# The server refuses to run as root; as root, run its tools as the package's `postgres` user.
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    su postgres -s /bin/bash -c "$*"
  else
    bash -c "$*"
  fi
}

pg_ctl() {
  as_owner "'$BIN/pg_ctl' -D '$PGDATA' -l '$PGDATA/server.log' -w -t 60 $*"
}

case "${1:-}" in
  start)
    if [ ! -f "$PGDATA/PG_VERSION" ]; then
      mkdir -p "$PGDATA"
      [ "$(id -u)" = 0 ] && chown postgres:postgres "$PGDATA"
      as_owner "'$BIN/initdb' -D '$PGDATA' -U postgres --auth=trust -E UTF8 >/dev/null"
      {
        echo "listen_addresses = '127.0.0.1'"
        echo "port = $PORT"
        echo "unix_socket_directories = '$PGDATA'"
        echo "max_connections = 200"
      } >> "$PGDATA/postgresql.conf"
    fi
    if ! pg_ctl status >/dev/null 2>&1; then
      pg_ctl start >/dev/null
    fi
    ;;
  stop) pg_ctl stop -m fast >/dev/null ;;
  restart) pg_ctl restart -m fast >/dev/null ;;
  url) echo "postgresql+psycopg://postgres@127.0.0.1:$PORT" ;;
  *)
    echo "usage: $0 start|stop|restart|url" >&2
    exit 2
    ;;
esac
