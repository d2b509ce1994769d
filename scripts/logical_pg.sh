#!/usr/bin/env bash
# A throwaway PostgreSQL server with logical decoding on, for the WAL relay's spike, benches and
# tests (docs/relay.md). The machine's server (5432) runs wal_level=replica and must not be
# restarted, so the relay measures on a cluster of its own: loopback only, fsync on (the enqueue
# figures include the commit's flush, as in production), wal_level=logical and room for a few
# slots and walsenders.
#
#   scripts/logical_pg.sh start    # initdb (first time) and start; prints the database URL
#   scripts/logical_pg.sh stop     # fast shutdown
#   scripts/logical_pg.sh status   # running or not, and the settings that matter
#   scripts/logical_pg.sh url      # postgres://postgres@127.0.0.1:$PORT/postgres
#   scripts/logical_pg.sh destroy  # stop and remove the data directory
#
# PORT (default 5499) and DIR (default /tmp/outbox-logical-pg) override the defaults. When run as
# root the server runs as the `postgres` user (PostgreSQL refuses root).
set -euo pipefail
PORT=${PORT:-5499}
DIR=${DIR:-/tmp/outbox-logical-pg}
DATA=$DIR/data
BIN=$(dirname "$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -1)")
if [[ ! -x $BIN/initdb ]]; then
    BIN=$(dirname "$(command -v initdb || true)")
fi
[[ -x $BIN/initdb ]] || { echo "no initdb on PATH or under /usr/lib/postgresql/*/bin" >&2; exit 1; }
URL="postgres://postgres@127.0.0.1:$PORT/postgres"

as_pg() {
    if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case ${1:-} in
start)
    # Test binaries start the server concurrently: one initdb and one start at a time.
    # The server must not inherit the lock's descriptor (it would hold the lock for as long as
    # it runs, and the next start would wait forever): every command below closes fd 9.
    exec 9>"$DIR.lock"
    flock -w 120 9 || { echo "another start of the server on port $PORT holds $DIR.lock for over 120 s" >&2; exit 1; }
    if [[ ! -f $DATA/PG_VERSION ]]; then
        mkdir -p "$DIR"
        [[ $(id -u) == 0 ]] && chown postgres:postgres "$DIR"
        as_pg "$BIN/initdb" -A trust -U postgres -D "$DATA" >/dev/null 9>&-
        # Appended to postgresql.conf (the last setting wins): the relay's requirements, and a
        # bound on the WAL a slot can hold while its relay is down (docs/relay.md).
        cat <<CONF | as_pg tee -a "$DATA/postgresql.conf" >/dev/null
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
fsync = on
synchronous_commit = on
wal_level = logical
max_replication_slots = 4
max_wal_senders = 4
max_slot_wal_keep_size = '1GB'
max_connections = 50
CONF
        # Replication connections (the streaming protocol) from loopback, trusted like the rest.
        echo "host replication postgres 127.0.0.1/32 trust" | as_pg tee -a "$DATA/pg_hba.conf" >/dev/null
    fi
    if as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
        echo "already running: $URL"
        exit 0
    fi
    as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w -t 30 start >/dev/null 9>&-
    echo "$URL"
    ;;
stop)
    as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null && echo stopped
    ;;
status)
    if as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
        echo "running: $URL"
        psql "$URL" -Atc "SELECT name || '=' || setting FROM pg_settings WHERE name IN
            ('wal_level','max_replication_slots','max_wal_senders','fsync','max_slot_wal_keep_size')"
    else
        echo "not running"; exit 1
    fi
    ;;
url)
    echo "$URL"
    ;;
destroy)
    as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$DIR" "$DIR.lock"
    echo destroyed
    ;;
*)
    echo "usage: $0 start|stop|status|url|destroy" >&2; exit 2
    ;;
esac
