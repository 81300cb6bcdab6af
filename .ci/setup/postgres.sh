# Sourced by .ci/run (as root, under `set -euo pipefail`): install Debian's PostgreSQL
# server, start a throwaway cluster on 127.0.0.1 (its own data directory and port, so a
# cluster the machine already runs is left alone), create a user and a database, and
# export STICKSAT_TEST_PG_URL for the store's PostgreSQL tests (tests/test_store_*.py,
# tests/test_reoptimize*.py). Anything that fails only skips those tests (they say why);
# it never fails the run. Idempotent: a cluster already answering on the port is reused.
_sticksat_pg_setup() {
    local port=${STICKSAT_PG_PORT:-54329}
    local data=${STICKSAT_PG_DATA:-/tmp/sticksat-pg/data}
    local log=${STICKSAT_PG_LOG:-/tmp/sticksat-pg/server.log}
    local url="postgresql://sticksat:sticksat@127.0.0.1:${port}/sticksat_test"
    if [ "$(id -u)" != 0 ]; then
        echo "postgres store tests skipped: .ci/setup/postgres.sh needs root to install and start PostgreSQL"
        return 1
    fi
    if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
        echo "== postgres: apt-get install postgresql"
        if ! { DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
               && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
                    postgresql >/dev/null; }; then
            echo "postgres store tests skipped: apt-get install postgresql failed"
            return 1
        fi
    fi
    local bin
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    if ! id postgres >/dev/null 2>&1; then
        echo "postgres store tests skipped: no postgres system user after the install"
        return 1
    fi
    local as_pg=(runuser -u postgres --)
    if ! "${as_pg[@]}" "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" 2>/dev/null; then
        echo "== postgres: initdb + start on 127.0.0.1:$port (data $data, log $log)"
        rm -rf "$data"
        mkdir -p "$data" "$(dirname "$log")"
        chown -R postgres:postgres "$(dirname "$data")" "$(dirname "$log")"
        if ! "${as_pg[@]}" "$bin/initdb" -D "$data" -A trust -U postgres -E UTF8 >/dev/null; then
            echo "postgres store tests skipped: initdb failed"
            return 1
        fi
        # setsid: its own session, so the CI shell's job control never signals it.
        if ! setsid "${as_pg[@]}" "$bin/pg_ctl" -D "$data" -l "$log" -w -t 60 \
                -o "-c listen_addresses=127.0.0.1 -p $port -k /tmp/sticksat-pg" start >/dev/null </dev/null; then
            echo "postgres store tests skipped: the server did not start (see $log)"
            return 1
        fi
    fi
    local psql=("${as_pg[@]}" "$bin/psql" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1)
    if ! "${psql[@]}" -tAc "SELECT 1 FROM pg_roles WHERE rolname = 'sticksat'" | grep -q 1; then
        "${psql[@]}" -c "CREATE ROLE sticksat LOGIN PASSWORD 'sticksat'" >/dev/null || {
            echo "postgres store tests skipped: could not create the role"; return 1; }
    fi
    if ! "${psql[@]}" -tAc "SELECT 1 FROM pg_database WHERE datname = 'sticksat_test'" | grep -q 1; then
        "${psql[@]}" -c "CREATE DATABASE sticksat_test OWNER sticksat" >/dev/null || {
            echo "postgres store tests skipped: could not create the database"; return 1; }
    fi
    export STICKSAT_TEST_PG_URL="$url"
    echo "== postgres: ready, STICKSAT_TEST_PG_URL=$url"
}
_sticksat_pg_setup || true
