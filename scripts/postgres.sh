#!/usr/bin/env bash
# Starts a throw-away PostgreSQL server on 127.0.0.1 for the tests and prints its URL.
# Usage: scripts/postgres.sh start DIR PORT | stop DIR | halt DIR | resume DIR
# (halt/resume stop and restart the same server, for database-fault tests)
set -euo pipefail
action=$1 dir=$2
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
as_pg() {
  if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi
}
case "$action" in
  start)
    port=$3
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    as_pg "'$bin/initdb' -D '$dir/data' -A trust -U postgres >/dev/null"
    # Durability settings off: these servers hold test data only. Kept in a file so that
    # "resume" restarts the server exactly as it was.
    echo "-k '$dir' -c listen_addresses=127.0.0.1 -p $port -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" > "$dir/options"
    as_pg "'$bin/pg_ctl' -D '$dir/data' -l '$dir/log' -w -o \"$(cat "$dir/options")\" start >/dev/null"
    echo "postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
    ;;
  halt)
    as_pg "'$bin/pg_ctl' -D '$dir/data' -m fast -w stop >/dev/null"
    ;;
  resume)
    as_pg "'$bin/pg_ctl' -D '$dir/data' -l '$dir/log' -w -o \"$(cat "$dir/options")\" start >/dev/null"
    ;;
  stop)
    as_pg "'$bin/pg_ctl' -D '$dir/data' -m immediate stop >/dev/null" || true
    rm -rf "$dir"
    ;;
esac
