#!/usr/bin/env bash
# The whole test suite: unit, property, vector and integration tests, and
# the doc tests (README included). This is the command the README names and
# .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."

# Integration tests start their own redis-server on free loopback ports
# (never the one on 6379): find it, or install it where we can.
if ! command -v redis-server >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "redis-server missing: installing it with apt-get"
        apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
    else
        echo "redis-server is needed by the tests: install it (e.g. apt-get install redis-server)" >&2
        exit 1
    fi
fi

cargo test --locked --all-features "$@"
