#!/usr/bin/env bash
# The whole test suite: unit, property, vector and integration tests, and
# the doc tests (README included). This is the command the README names and
# .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."

# Integration tests start their own redis-server on free loopback ports
# (never the one on 6379), and the TLS tests make certificates with the
# openssl command: find them, or install them where we can.
need() { # command package
    if ! command -v "$1" >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "$1 missing: installing $2 with apt-get"
            apt-get update -qq && apt-get install -y -qq "$2" >/dev/null
        else
            echo "$1 is needed by the tests: install it (e.g. apt-get install $2)" >&2
            exit 1
        fi
    fi
}
need redis-server redis-server
need openssl openssl
# The PostgreSQL tests (and the Synapse deployments) use the server on
# 127.0.0.1:5432; psql drops the databases they create.
need psql postgresql-client

# The interop tests run Synapse's own Python code as a peer: a venv with the
# pinned Synapse, made once and kept in a cache directory between runs. The
# multi-writer deployment runs it on PostgreSQL: the `postgres` extra
# (psycopg2) too.
SYNAPSE_VERSION=1.163.2
SYNAPSE_VENV="${SYNAPSE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/synapse-replication/synapse-$SYNAPSE_VERSION}"
SYNAPSE_REQUIREMENT="matrix-synapse[redis,postgres]==$SYNAPSE_VERSION"
if ! "$SYNAPSE_VENV/bin/python" -c "import synapse, sys; sys.exit(synapse.__version__ != '$SYNAPSE_VERSION')" 2>/dev/null; then
    echo "creating a venv with matrix-synapse $SYNAPSE_VERSION in $SYNAPSE_VENV (once)"
    rm -rf "$SYNAPSE_VENV"
    python3 -m venv "$SYNAPSE_VENV"
    "$SYNAPSE_VENV/bin/pip" install -q "$SYNAPSE_REQUIREMENT"
elif ! "$SYNAPSE_VENV/bin/python" -c "import psycopg2" 2>/dev/null; then
    # A venv made before the deployment tests: add the extra, keep the rest.
    echo "adding the postgres extra (psycopg2) to $SYNAPSE_VENV"
    "$SYNAPSE_VENV/bin/pip" install -q "$SYNAPSE_REQUIREMENT"
fi
export SYNAPSE_PYTHON="$SYNAPSE_VENV/bin/python"

cargo test --locked --all-features "$@"
