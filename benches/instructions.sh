#!/usr/bin/env bash
# The receive path's cost as a number that does not drift: instructions a
# message, counted by callgrind over `benches/instructions/` (20,000
# messages of the flood mix fed to a ready `RedisSession`, events drained),
# against the figure committed in benches/instructions.baseline. CI runs it;
# it fails when the count is more than INSTRUCTIONS_TOLERANCE percent (3)
# above the baseline.
#
#   benches/instructions.sh            # measure and compare
#   benches/instructions.sh --update   # measure and write the baseline
#
# A change that raises the count on purpose updates the baseline in the
# same commit and says why. Counts depend on the compiler: after a
# toolchain update, update the baseline in a commit of its own.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v valgrind >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "valgrind missing: installing it with apt-get"
        apt-get update -qq && apt-get install -y -qq valgrind >/dev/null
    else
        echo "valgrind is needed to count instructions: install it (e.g. apt-get install valgrind)" >&2
        exit 1
    fi
fi

baseline_file=benches/instructions.baseline
tolerance="${INSTRUCTIONS_TOLERANCE:-3}"
target="${CARGO_TARGET_DIR:-$PWD/target}/instructions"
(cd benches/instructions && CARGO_TARGET_DIR="$target" cargo build --release --quiet)

out="$(mktemp)"
trap 'rm -f "$out"' EXIT
printed="$(MESSAGES=20000 valgrind --tool=callgrind --callgrind-out-file="$out" \
    --toggle-collect='*instructions*receive*' \
    "$target/release/synapse-replication-instructions" 2>/dev/null)"
messages="$(sed -n 's/^messages \([0-9]*\) .*/\1/p' <<<"$printed")"
total="$(sed -n 's/^summary: //p' "$out")"
if [ -z "$messages" ] || [ -z "$total" ]; then
    echo "no count: the program printed '$printed'" >&2
    exit 1
fi
figure="$(awk -v t="$total" -v m="$messages" 'BEGIN { printf "%.1f", t / m }')"
echo "receive path: $figure instructions a message ($total over $messages messages)"

if [ "${1:-}" = "--update" ]; then
    printf '# Instructions a message of the receive path: benches/instructions.sh --update\n%s\n' \
        "$figure" >"$baseline_file"
    echo "written to $baseline_file"
    exit 0
fi
baseline="$(grep -v '^#' "$baseline_file" | head -n1)"
verdict="$(awk -v f="$figure" -v b="$baseline" -v tol="$tolerance" 'BEGIN {
    change = (f / b - 1) * 100
    printf "%+.1f%% against the baseline %s (tolerance +%s%%)\n", change, b, tol
    exit (change > tol) ? 1 : 0 }')" && ok=1 || ok=0
echo "$verdict"
if [ "$ok" = 0 ]; then
    echo "the receive path takes more instructions a message than $baseline_file allows:" \
        "find what did it, or update the baseline with --update and say why" >&2
    exit 1
fi
