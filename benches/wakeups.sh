#!/usr/bin/env bash
# Where a lone message's time goes (issue #37): one subscriber of
# benches/rates.sh alone, under `strace -c -f` (system calls, every thread),
# `perf stat` (context switches, migrations, CPU) or `perf record` (TOOL=record:
# a profile's top entries by self time), while `flood --rate`
# publishes the realistic mix at a steady rate. Per message: each system
# call, context switches.
#
#     benches/wakeups.sh                      # every subscriber, 50 and 500 msgs/s, strace
#     TOOL=perf RATES=500 WHO="drain-smol" benches/wakeups.sh
#
# Environment: RATES ("50 500"), SECONDS_EACH (10), WHO ("drain-smol
# drain-tokio bare bare-smol bare-tokio", as in rates.sh), TOOL (strace,
# perf or record), EVENTS (with TOOL=perf: `perf stat -e`'s list, such as
# uprobes on the drain's functions added with `perf probe -x`; the default:
# task-clock,context-switches,cpu-migrations), PORT (first free from 16600; never 6379), RATES_BIN=DIR (prebuilt
# drain, bare_drain and flood; otherwise built), KEEP=1.
#
# strace slows every system call down: its CPU figures are not the
# subscriber's; the counts are.

set -euo pipefail

RATES=${RATES:-50 500}
SECONDS_EACH=${SECONDS_EACH:-10}
WHO=${WHO:-drain-smol drain-tokio bare bare-smol bare-tokio}
TOOL=${TOOL:-strace}
EVENTS=${EVENTS:-task-clock,context-switches,cpu-migrations}
CHANNEL=wakeups.example.com
SENTINEL="PING wakeups-sentinel-$$"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/wakeups.XXXXXX")

case $TOOL in
    strace | perf) command -v "$TOOL" >/dev/null || { echo "wakeups.sh: $TOOL is required" >&2; exit 2; } ;;
    record) command -v perf >/dev/null || { echo "wakeups.sh: perf is required" >&2; exit 2; } ;;
    *) echo "wakeups.sh: TOOL is strace, perf or record" >&2; exit 2 ;;
esac

cleanup() {
    local pid
    for pid in $(jobs -p); do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "${KEEP:-0}" = 1 ]; then echo "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if [ -z "${PORT:-}" ]; then
    PORT=16600
    while port_busy "$PORT"; do PORT=$((PORT + 1)); done
fi
if [ "$PORT" = 6379 ] || port_busy "$PORT"; then
    echo "wakeups.sh: port $PORT is taken (or 6379, which this script leaves alone)" >&2
    exit 2
fi

if [ -n "${RATES_BIN:-}" ]; then
    BIN=$RATES_BIN
else
    BIN=$WORK/bin
    mkdir -p "$BIN"
    (cd "$ROOT" && cargo build --quiet --release --message-format=json-render-diagnostics \
        --bench drain --bench bare_drain --bench flood) |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' |
        while read -r exe; do
            cp "$exe" "$BIN/$(basename "$exe" | sed 's/-[0-9a-f]*$//')"
        done
fi

redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize no --logfile "$WORK/redis.log" &
REDIS=$!
for _ in $(seq 100); do
    redis-cli -p "$PORT" PING >/dev/null 2>&1 && break
    sleep 0.05
done

echo "== wakeups: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $TOOL, commit $(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet HEAD || echo ' (with changes)')"
common=(--port "$PORT" --channel "$CHANNEL" --sentinel "$SENTINEL")
for rate in $RATES; do
    for who in $WHO; do
        case $who in
            drain-*) cmd=("$BIN/drain" "${common[@]}" --runtime "${who#drain-}") ;;
            bare) cmd=("$BIN/bare_drain" "${common[@]}" --validate) ;;
            bare-*) cmd=("$BIN/bare_drain" "${common[@]}" --validate --runtime "${who#bare-}") ;;
        esac
        out=$WORK/$who-$rate
        # Counting starts at once (strace -c and perf stat cannot be told
        # when): the subscriber's start-up is in the counts, a few dozen
        # calls, next to thousands of messages.
        if [ "$TOOL" = strace ]; then
            strace -c -f -o "$out.trace" "${cmd[@]}" >"$out.out" 2>"$out.err" &
        elif [ "$TOOL" = record ]; then
            perf record -F 20000 -g -o "$out.perf" "${cmd[@]}" >"$out.out" 2>"$out.err" &
        else
            perf stat -e "$EVENTS" -o "$out.trace" \
                "${cmd[@]}" >"$out.out" 2>"$out.err" &
        fi
        pid=$!
        for _ in $(seq 200); do
            [ "$(redis-cli -p "$PORT" PUBSUB NUMSUB "$CHANNEL" | tail -1)" -ge 1 ] && break
            sleep 0.05
        done
        sleep 0.5
        count=$(awk -v r="$rate" -v s="$SECONDS_EACH" 'BEGIN { printf "%d", r * s }')
        "$BIN/flood" "${common[@]}" --rate "$rate" --count "$count" >"$out.flood"
        wait "$pid" || true
        published=$(sed -n 's/.*published=\([0-9]*\).*/\1/p' "$out.flood")
        echo
        echo "-- $who at $rate msgs/s: $published messages; per message:"
        if [ "$TOOL" = strace ]; then
            # strace -c: % time, seconds, usecs/call, calls, [errors,] name.
            awk -v n="$published" '$1 ~ /^[0-9.]+$/ && NF >= 5 {
                calls = $4; name = $NF; failed = ""
                if (name == "total" || calls / n < 0.01) next
                if (NF == 6 && $5 > 0) failed = sprintf(" (%.3f failed)", $5 / n)
                printf "   %-16s %7.3f calls%s\n", name, calls / n, failed
                total += calls } END { printf "   %-16s %7.3f calls\n", "total", total / n }' \
                "$out.trace"
        elif [ "$TOOL" = record ]; then
            # The top entries by self time, every thread.
            perf report -i "$out.perf" --stdio --no-children --sort dso,symbol 2>/dev/null |
                grep -E '^ +[0-9.]+%' | head -25 | cut -c1-150 || true
        else
            awk -v n="$published" '$1 ~ /^[0-9,]+$/ && NF >= 2 {
                gsub(",", "", $1)
                printf "   %-18s %10.3f\n", $2, $1 / n }' "$out.trace"
        fi
    done
done

kill "$REDIS" 2>/dev/null || true
wait "$REDIS" 2>/dev/null || true
