#!/usr/bin/env bash
# The cost of a wake-up (issue #37): CPU per message of the receive path at
# the steady rates a live deployment runs at, where most messages arrive
# alone, rather than in the bursts of e2e.sh where hundreds share a read.
#
# Needs redis-server, redis-cli, bash, awk, coreutils and a Rust toolchain.
# The script starts its own redis-server on a free loopback port (from
# 16500; never 6379), with no persistence, and stops it at the end.
#
#     benches/rates.sh                          # 5 x (50 .. 50,000 msgs/s, 20 s each)
#     REPS=1 SECONDS_EACH=3 benches/rates.sh    # a quick check
#
# Environment: REPS (5), SECONDS_EACH (20: how long each rate is
# published), RATES ("50 500 5000 50000", msgs/s), PORT (first free from
# 16500), CHANNEL (rates.example.com), KEEP=1 keeps the work directory
# (per-process outputs, results.txt, and bin/: the tools as built),
# RATES_BIN=DIR uses drain, bare_drain and flood from DIR instead of
# building them (to compare builds), OUT=FILE copies the per-run results
# there (the input of benches/rates_plot.py), B_BIN=DIR adds the drains of
# another build (DIR/drain, such as a KEEP=1 run's bin/) beside this one's:
# drain-smol-b and drain-tokio-b, an A/B comparison within each run, under
# the same traffic and the same load.
#
# Each run: five subscribers side by side (seven with B_BIN), all subscribed to CHANNEL and
# CHANNEL/USER_IP before anything is published:
#   drain-smol    benches/tools/drain.rs on smol: the crate's whole receive
#                 path (RedisClient, RedisSession, the follower);
#   drain-tokio   the same on a current-thread tokio runtime;
#   bare          bare_drain --validate: a blocking std socket, a minimal
#                 RESP reader and the crate's row validator on every RDATA
#                 row (the floor with the one per-row check the protocol
#                 requires);
#   bare-smol     the same reader on smol (`bare_drain --runtime smol`);
#   bare-tokio    the same reader on tokio (`bare_drain --runtime tokio`):
#                 what a wake-up costs each runtime with nothing of the
#                 crate's in it.
# Then `flood --rate R` publishes the realistic mix (benches/tools/mix.rs)
# at R messages a second for SECONDS_EACH seconds, each line in a write of
# its own when it is due, then the sentinel. The order of the rates, and
# the order the subscribers subscribe in (the drains first), turn from one
# repetition to the next, so that neither a drift in the machine's load nor
# a place in Redis' fan-out falls on one of them.
#
# Per subscriber and run: its CPU time (user + system, every thread: the
# sum of /proc/PID/task/*/schedstat, ns) and its context switches (every
# thread: voluntary + involuntary, from /proc/PID/task/*/status) from just
# before the first message to the sentinel, divided by the messages
# published. The script samples both before publishing; each subscriber
# reports both when it sees the sentinel, just before it exits. CPU time
# is each process's own, not wall time: on a shared machine the figures
# hold as long as the subscribers are not starved (each must reach the
# sentinel, or its run is marked lost; the messages each counted are
# printed beside those published).
#
# Output: per run, then per rate the median and range over the repetitions
# of CPU us/msg and context switches per message, and the ratios of the
# drains to the floors, taken within each run (median, range).

set -euo pipefail

REPS=${REPS:-5}
SECONDS_EACH=${SECONDS_EACH:-20}
RATES=${RATES:-50 500 5000 50000}
CHANNEL=${CHANNEL:-rates.example.com}
SENTINEL="PING rates-sentinel-$$"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rates.XXXXXX")
SUBSCRIBERS="drain-smol drain-tokio bare bare-smol bare-tokio"
DRAINS="drain-smol drain-tokio"
if [ -n "${B_BIN:-}" ]; then
    [ -x "$B_BIN/drain" ] || { echo "rates.sh: $B_BIN/drain missing" >&2; exit 2; }
    SUBSCRIBERS="$SUBSCRIBERS drain-smol-b drain-tokio-b"
    DRAINS="$DRAINS drain-smol-b drain-tokio-b"
fi

for tool in redis-server redis-cli cargo awk; do
    command -v "$tool" >/dev/null || { echo "rates.sh: $tool is required" >&2; exit 2; }
done

cleanup() {
    # Only this shell's own jobs, by pid.
    local pid
    for pid in $(jobs -p); do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "${KEEP:-0}" = 1 ]; then
        echo "work directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if [ -z "${PORT:-}" ]; then
    PORT=16500
    while port_busy "$PORT"; do PORT=$((PORT + 1)); done
fi
if [ "$PORT" = 6379 ] || port_busy "$PORT"; then
    echo "rates.sh: port $PORT is taken (or 6379, which this script leaves alone)" >&2
    exit 2
fi

echo "== rates: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) cores, load average $(loadavg)"
echo "   $(uname -srm); $(redis-server --version | cut -d' ' -f1-3); $(rustc --version)"
echo "   commit $(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet HEAD || echo ' (with changes)')"
[ -n "${B_BIN:-}" ] && echo "   drain-smol-b, drain-tokio-b: $B_BIN/drain"
echo "   $REPS repetitions of rates $RATES msgs/s, ${SECONDS_EACH} s each; redis-server on 127.0.0.1:$PORT"

if [ -n "${RATES_BIN:-}" ]; then
    BIN=$RATES_BIN
    echo "== prebuilt binaries from $BIN"
else
    echo "== building (release)"
    # Bench targets (benches/tools/), whose executables cargo names with a
    # hash: copied into the work directory under their names.
    BIN=$WORK/bin
    mkdir -p "$BIN"
    (cd "$ROOT" && cargo build --quiet --release --message-format=json-render-diagnostics \
        --bench drain --bench bare_drain --bench flood) |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' |
        while read -r exe; do
            cp "$exe" "$BIN/$(basename "$exe" | sed 's/-[0-9a-f]*$//')"
        done
fi
for bin in drain bare_drain flood; do
    [ -x "$BIN/$bin" ] || { echo "rates.sh: $BIN/$bin missing" >&2; exit 2; }
done

redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize no --logfile "$WORK/redis.log" &
REDIS=$!
for _ in $(seq 100); do
    redis-cli -p "$PORT" PING >/dev/null 2>&1 && break
    sleep 0.05
done
redis-cli -p "$PORT" PING >/dev/null

# Waits until `$1` clients are subscribed to CHANNEL (10 s at most).
wait_subscribers() {
    local n=0
    for _ in $(seq 200); do
        n=$(redis-cli -p "$PORT" PUBSUB NUMSUB "$CHANNEL" | tail -1)
        [ "$n" -ge "$1" ] && return 0
        sleep 0.05
    done
    echo "rates.sh: only $n of $1 subscribers after 10 s" >&2
    return 1
}

# Waits until the file $1 says `ready` (the drain's session is up).
wait_ready() {
    for _ in $(seq 200); do
        grep -q "ready" "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    cat "$1" >&2
    return 1
}

# A process's CPU time so far, every thread, in ns.
cpu_ns() { cat /proc/"$1"/task/*/schedstat | awk '{ n += $1 } END { printf "%.0f", n }'; }

# A process's context switches so far, every thread.
switches() { cat /proc/"$1"/task/*/status | awk '/ctxt_switches:/ { n += $2 } END { print n + 0 }'; }

# `key=value` from a figures line.
field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" "$2" | tail -1; }

# `rotate N WORD...`: the words, starting from the Nth (turning round).
rotate() {
    local n=$1
    shift
    local words=("$@") i
    for i in $(seq 0 $(($# - 1))); do
        echo "${words[$(((i + n - 1) % $#))]}"
    done
}

RESULTS=$WORK/results.txt
: >"$RESULTS"

# One run: `run REP RATE`.
run() {
    local rep=$1 rate=$2 dir=$WORK/run$1-$2 count
    count=$(awk -v r="$rate" -v s="$SECONDS_EACH" 'BEGIN { printf "%d", r * s }')
    mkdir -p "$dir"
    echo "-- run $rep, $rate msgs/s for ${SECONDS_EACH} s: load average $(loadavg)"
    local -A pid
    local common=(--port "$PORT" --channel "$CHANNEL" --sentinel "$SENTINEL")
    # The drains first, one at a time: the REPLICATE each sends once
    # subscribed must not reach the bare readers (the drains before it
    # count it as one message more, which the figures ignore: they divide
    # by the messages published).
    # The order they subscribe in (the order Redis writes each message to
    # them) turns from one repetition to the next, among the drains and
    # among the bare readers: a subscriber later in that order was
    # measured to pay more for its wake-ups (up to a third, on smol).
    local who bin runtime
    for who in $(rotate "$rep" $DRAINS); do
        bin=$BIN
        if [ "${who%-b}" != "$who" ]; then bin=$B_BIN; fi
        runtime=${who#drain-}
        "$bin/drain" "${common[@]}" --runtime "${runtime%-b}" >"$dir/$who.out" 2>"$dir/$who.err" &
        pid[$who]=$!
        wait_ready "$dir/$who.err"
    done
    sleep 0.2
    for who in $(rotate "$rep" bare bare-smol bare-tokio); do
        runtime=${who#bare-}
        [ "$who" = bare ] && runtime=std
        "$BIN/bare_drain" "${common[@]}" --validate --runtime "$runtime" \
            >"$dir/$who.out" 2>"$dir/$who.err" &
        pid[$who]=$!
    done
    wait_subscribers "$(echo "$SUBSCRIBERS" | wc -w)"
    sleep 0.2
    local -A cpu0 sw0
    for who in $SUBSCRIBERS; do
        cpu0[$who]=$(cpu_ns "${pid[$who]}")
        sw0[$who]=$(switches "${pid[$who]}")
    done
    "$BIN/flood" "${common[@]}" --rate "$rate" --count "$count" --via bare \
        >"$dir/flood.out" 2>"$dir/flood.err" || true
    local published
    published=$(field published "$dir/flood.out")
    echo "   $(cat "$dir/flood.out") $(head -3 "$dir/flood.err")"
    for who in $SUBSCRIBERS; do
        # A subscriber still running 30 s after the sentinel was sent is
        # stuck: killed, and its run recorded as lost.
        for _ in $(seq 600); do
            kill -0 "${pid[$who]}" 2>/dev/null || break
            sleep 0.05
        done
        kill "${pid[$who]}" 2>/dev/null || true
        wait "${pid[$who]}" 2>/dev/null || true
        local err=$dir/$who.err ended cpu sw seen
        ended=$(field ended "$err")
        seen=$(field count "$err")
        cpu=$(field cpu_ns "$err")
        sw=$(field switches "$err")
        awk -v rep="$rep" -v rate="$rate" -v who="$who" -v pub="${published:-0}" \
            -v seen="${seen:-0}" -v ended="${ended:-lost}" -v cpu="${cpu:-0}" \
            -v cpu0="${cpu0[$who]}" -v sw="${sw:-0}" -v sw0="${sw0[$who]}" 'BEGIN {
            n = pub > 0 ? pub : 1
            printf "%s %s %s %d %d %s %.3f %.3f\n", rep, rate, who, pub, seen,
                ended == "sentinel" ? "ok" : "lost", (cpu - cpu0) / 1e3 / n, (sw - sw0) / n
        }' >>"$RESULTS"
    done
}

read -r -a rates <<<"$RATES"
for rep in $(seq "$REPS"); do
    # The rates in turn, starting one further each repetition.
    for i in $(seq 0 $((${#rates[@]} - 1))); do
        run "$rep" "${rates[$(((i + rep - 1) % ${#rates[@]}))]}"
    done
done

kill "$REDIS" 2>/dev/null || true
wait "$REDIS" 2>/dev/null || true

[ -n "${OUT:-}" ] && cp "$RESULTS" "$OUT"

# Median and range of the numbers on stdin: `median (min-max)`.
stats() {
    sort -g | awk '{ v[NR] = $1 } END {
        if (NR == 0) { print "-"; exit }
        m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.2f (%.2f-%.2f)", m, v[1], v[NR] }'
}

echo
echo "== per run (us/msg: CPU per message published; sw/msg: context switches per message)"
printf "%-4s %7s %-12s %9s %9s %5s %8s %7s\n" run "msgs/s" subscriber published counted end us/msg sw/msg
while read -r rep rate who pub seen ended cpu sw; do
    printf "%-4s %7s %-12s %9d %9d %5s %8.3f %7.3f\n" "$rep" "$rate" "$who" "$pub" "$seen" "$ended" "$cpu" "$sw"
done <"$RESULTS"

echo
echo "== CPU us/msg, median (range) of $REPS runs"
printf "%-7s" "msgs/s"
for who in $SUBSCRIBERS; do printf " %-22s" "$who"; done
echo
for rate in $RATES; do
    printf "%-7s" "$rate"
    for who in $SUBSCRIBERS; do
        printf " %-22s" "$(awk -v r="$rate" -v w="$who" '$2 == r && $3 == w { print $7 }' "$RESULTS" | stats)"
    done
    echo
done

echo
echo "== context switches per message, median (range) of $REPS runs"
printf "%-7s" "msgs/s"
for who in $SUBSCRIBERS; do printf " %-22s" "$who"; done
echo
for rate in $RATES; do
    printf "%-7s" "$rate"
    for who in $SUBSCRIBERS; do
        printf " %-22s" "$(awk -v r="$rate" -v w="$who" '$2 == r && $3 == w { print $8 }' "$RESULTS" | stats)"
    done
    echo
done

echo
echo "== CPU ratios within each run, median (range) of $REPS runs"
pairs="drain-smol/bare drain-tokio/bare drain-smol/bare-smol drain-tokio/bare-tokio bare-smol/bare bare-tokio/bare"
[ -n "${B_BIN:-}" ] && pairs="$pairs drain-smol-b/drain-smol drain-tokio-b/drain-tokio"
printf "%-7s" "msgs/s"
for pair in $pairs; do printf " %-24s" "$pair"; done
echo
for rate in $RATES; do
    printf "%-7s" "$rate"
    for pair in $pairs; do
        printf " %-24s" "$(awk -v r="$rate" -v a="${pair%/*}" -v b="${pair#*/}" '
            $2 == r && $3 == a { x[$1] = $7 } $2 == r && $3 == b { y[$1] = $7 }
            END { for (k in x) if (y[k] > 0) print x[k] / y[k] }' "$RESULTS" | stats)"
    done
    echo
done

lost=$(awk '$6 != "ok"' "$RESULTS" | wc -l)
echo
echo "== runs where a subscriber missed the sentinel: $lost"
echo "== done: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average $(loadavg)"
