#!/usr/bin/env bash
# A throw-away PostgreSQL server for the ledger tests, on loopback only.
#
#   eval "$(bash .ci/postgres.sh)"     # installs (Debian package) if needed, starts, exports the URL
#   bash .ci/postgres.sh stop          # stops it
#
# Prints one line, `export SWARMRL_TEST_POSTGRES_URL=postgresql://...`, on stdout; progress on stderr.
# SWARMRL_PG_DIR (default /tmp/swarmrl-postgres) holds the cluster; SWARMRL_PG_PORT (default 55432).
set -euo pipefail
dir="${SWARMRL_PG_DIR:-/tmp/swarmrl-postgres}"
port="${SWARMRL_PG_PORT:-55432}"
db=swarmrl_test

bindir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
as_postgres() { runuser -u postgres -- "$@"; }

if [[ "${1:-start}" == stop ]]; then
    [[ -d "$dir/data" ]] && as_postgres "$(bindir)/pg_ctl" -D "$dir/data" -m fast stop >&2 || true
    exit 0
fi

if [[ -z "$(bindir)" ]]; then
    echo "installing PostgreSQL (Debian package postgresql)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q postgresql >&2 || { apt-get update -q >&2 && apt-get install -y -q postgresql >&2; }
fi
bin="$(bindir)"
[[ -n "$bin" ]] || { echo "PostgreSQL binaries not found under /usr/lib/postgresql after install" >&2; exit 1; }

mkdir -p "$dir"
chown postgres: "$dir"
if [[ ! -f "$dir/data/PG_VERSION" ]]; then
    as_postgres "$bin/initdb" -D "$dir/data" --auth=trust --username=postgres -E UTF8 >&2
fi
if ! as_postgres "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
    # Loopback only, socket in the cluster folder (the system's socket folder may not exist).
    as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c fsync=off" start >&2
fi
if ! as_postgres "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname='$db'" | grep -q 1; then
    as_postgres "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres "$db" >&2
fi
echo "export SWARMRL_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:$port/$db"
