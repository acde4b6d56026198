#!/usr/bin/env bash
# The whole test suite: unit, property, vector and integration tests, and
# the doc tests (README included). This is the command the README names and
# .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --locked --all-features "$@"
