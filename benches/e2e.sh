#!/usr/bin/env bash
# End-to-end Redis benchmark (issue #8): how fast subscribers drain a burst
# of replication traffic, and how fast the crate publishes it.
#
# Needs, on a fresh machine: redis-server and redis-cli (any Redis >= 6; the
# figures in the README are Redis 7.0), GNU time at /usr/bin/time (Debian:
# `apt-get install redis-server redis-tools time`), bash, awk, procps
# (pgrep, pkill), coreutils, a Rust toolchain. Nothing else: the script
# starts its own redis-server on a free loopback port, with Redis' default
# limits (a pub/sub client is cut past a 32 MiB output buffer, or 8 MiB for
# 60 s), and stops it at the end. It never touches another Redis.
#
#     benches/e2e.sh                    # 3 repetitions of 500,000 messages
#     REPS=5 COUNT=200000 benches/e2e.sh
#
# Environment: REPS (3), COUNT (500000), BACKLOG (150000; 0 skips the
# backlog runs), SOLO (1; 0 skips the solo runs), JSON (1; 0 leaves
# bare-json out of the solo and backlog runs), RUNTIME (smol or tokio: the drain's;
# smol), PORT (first free port from 16400),
# CHANNEL (e2e.example.com), WRITER=0 skips the writer-side runs, KEEP=1
# keeps the work directory (logs, per-process outputs, and bin/: the tools
# as built), E2E_BIN=DIR uses drain, bare_drain and flood from DIR (such a
# bin/) instead of building them (to compare builds).
#
# Drain runs: three subscribers side by side, each subscribed to CHANNEL
# and CHANNEL/USER_IP before anything is published:
#   redis-cli   `redis-cli SUBSCRIBE` (hiredis), its output counted by
#               `bare_drain --redis-cli` (CPU and RSS are redis-cli's own);
#   drain       benches/tools/drain.rs: RedisClient + RedisSession, the
#               crate's whole receive path (read, RESP, command decode,
#               follower), on RUNTIME (smol, or a current-thread tokio);
#   bare        benches/tools/bare_drain.rs: a std TcpStream and a minimal
#               RESP counter, no decoding (the floor).
#   bare-json   (solo and backlog runs; JSON=0 leaves it out) bare_drain --validate:
#               the floor plus the crate's row validator on every RDATA row,
#               the one per-row cost no receive path may skip (a row that
#               is not JSON is a gap to fetch).
# - burst runs (REPS): `flood --via bare` publishes COUNT messages of the mix
#   (plus its 10-line preamble) pipelined at full speed while they read,
#   then the sentinel line: who keeps up, who is cut, what it costs. A
#   subscriber that keeps up reads at the publisher's rate.
# - solo runs (REPS times each; SOLO=0 skips them): the same burst with one
#   subscriber at a time, as in issue #8's own table (redis-server, the
#   publisher and one subscriber sharing the cores): with nobody else to
#   fan out to, Redis and the publisher run faster, and a subscriber that
#   cannot keep up falls behind and is cut. Ratios are taken between the
#   solo runs of one repetition.
# - backlog runs (REPS): the three (and bare-json) are stopped (SIGSTOP) while BACKLOG
#   messages (about 28 MB each, under the 32 MiB cut) are published, then
#   continued together (SIGCONT): each reads as fast as it can, whatever the
#   publisher's speed. These rates are the subscribers' capacities.
# Per subscriber: messages counted, lost (published - counted), cut (ended
# without the sentinel), seconds from its first message to the sentinel,
# msgs/s, CPU us/msg (user+sys of the whole process: the process's own
# figure for drain and bare, GNU time's for redis-cli), peak RSS, and its
# peak Redis output buffer (`omem` in CLIENT LIST, sampled every 100 ms: how
# close it came to the 32 MiB cut). Then medians over the repetitions, and
# the ratios within each run, medians too.
#
# Writer runs (REPS times each, alternating): `flood --via crate` (RedisClient:
# RedisSession::write/send; its session also subscribes and decodes its own
# echoes, as every Synapse process) and `flood --via bare` (a hand-written
# pipelined PUBLISH loop), each with one bare_drain checking delivery. The
# bare loop gets a second bare_drain standing in for the crate's own
# subscription, so that Redis fans every message out to two subscribers in
# both cases. Rate: published / seconds from the first PUBLISH to the reply
# to the sentinel (bare) or the sentinel's echo (crate).
#
# Both write runs and drain runs share the machine with redis-server: on a
# small machine the figures depend on what else runs (the load average is
# printed before each run).

set -euo pipefail

REPS=${REPS:-3}
COUNT=${COUNT:-500000}
BACKLOG=${BACKLOG:-150000}
CHANNEL=${CHANNEL:-e2e.example.com}
WRITER=${WRITER:-1}
SOLO=${SOLO:-1}
JSON=${JSON:-1}
RUNTIME=${RUNTIME:-smol}
case $RUNTIME in
    smol | tokio) ;;
    *) echo "e2e.sh: RUNTIME must be smol or tokio" >&2; exit 2 ;;
esac
SENTINEL="PING drain-sentinel-$$"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/e2e.XXXXXX")
TIME=/usr/bin/time

for tool in redis-server redis-cli cargo awk pgrep pkill mkfifo; do
    command -v "$tool" >/dev/null || { echo "e2e.sh: $tool is required" >&2; exit 2; }
done
[ -x "$TIME" ] || { echo "e2e.sh: GNU time is required at $TIME" >&2; exit 2; }

cleanup() {
    # Only this shell's own jobs still running (and their children, e.g.
    # the program GNU time runs), by pid.
    local pid
    for pid in $(jobs -p); do
        pkill -TERM -P "$pid" 2>/dev/null || true
        kill "$pid" 2>/dev/null || true
    done
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
    PORT=16400
    while port_busy "$PORT"; do PORT=$((PORT + 1)); done
fi
if port_busy "$PORT"; then
    echo "e2e.sh: port $PORT is taken" >&2
    exit 2
fi

echo "== e2e: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) cores, load average $(loadavg)"
echo "   $(uname -srm); $(redis-server --version | cut -d' ' -f1-3); $(rustc --version)"
echo "   $REPS repetitions of $COUNT messages; redis-server on 127.0.0.1:$PORT; drain on $RUNTIME"

if [ -n "${E2E_BIN:-}" ]; then
    BIN=$E2E_BIN
    echo "== prebuilt binaries from $BIN"
else
    echo "== building (release)"
    # The tools are bench targets (benches/tools/), whose executables cargo
    # names with a hash: copied into the work directory under their names.
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
    [ -x "$BIN/$bin" ] || { echo "e2e.sh: $BIN/$bin missing" >&2; exit 2; }
done

# Redis with its defaults, no persistence, loopback only.
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize no --logfile "$WORK/redis.log" &
REDIS=$!
for _ in $(seq 100); do
    redis-cli -p "$PORT" PING >/dev/null 2>&1 && break
    sleep 0.05
done
redis-cli -p "$PORT" PING >/dev/null
echo "   client-output-buffer-limit: $(redis-cli -p "$PORT" CONFIG GET client-output-buffer-limit | tail -1)"

# Waits until `$1` clients are subscribed to CHANNEL (10 s at most).
wait_subscribers() {
    local n
    for _ in $(seq 200); do
        n=$(redis-cli -p "$PORT" PUBSUB NUMSUB "$CHANNEL" | tail -1)
        [ "$n" -ge "$1" ] && return 0
        sleep 0.05
    done
    echo "e2e.sh: only $n of $1 subscribers after 10 s" >&2
    return 1
}

# Waits for pid $1 at most $2 seconds; kills it then.
wait_for() {
    local pid=$1 limit=$2
    for _ in $(seq $((limit * 20))); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
        sleep 0.05
    done
    echo "e2e.sh: pid $pid still running after ${limit} s, killed" >&2
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# redis-server's CPU seconds so far (user + sys).
redis_cpu() {
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$REDIS/stat"
}

# Samples CLIENT LIST every 100 ms into $1 until $2 exists.
sample_clients() {
    while [ ! -e "$2" ]; do
        redis-cli -p "$PORT" CLIENT LIST >>"$1" 2>/dev/null || true
        sleep 0.1
    done
}

# The peak omem (MiB) of clients matching an awk condition on name and cmd.
peak_omem() {
    awk -v want="$2" '{
        name = ""; cmd = ""; omem = 0
        for (i = 1; i <= NF; i++) {
            split($i, kv, "=")
            if (kv[1] == "name") name = kv[2]
            if (kv[1] == "cmd") cmd = kv[2]
            if (kv[1] == "omem") omem = kv[2]
        }
        who = name != "" ? name : (cmd == "subscribe" ? "redis-cli" : "other")
        if (who == want && omem > peak) peak = omem
    } END { printf "%.1f", peak / 1048576 }' "$1"
}

# `key=value` from a figures line.
field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" "$2" | tail -1; }

# user sys maxrss(KiB) elapsed from a GNU time output file.
times() { tail -1 "$1"; }

# One subscriber's row, appended to RESULTS: RESULTS rep name published
# figures-file time-file omem [own]: with `own`, the CPU time the process
# printed itself (ns precision) rather than GNU time's (10 ms).
record() {
    local results=$1
    shift
    local rep=$1 name=$2 published=$3 figures=$4 timefile=$5 omem=$6 own=${7:-}
    local count seconds rate ended user sys rss cpu
    count=$(field count "$figures")
    seconds=$(field seconds "$figures")
    rate=$(field rate "$figures")
    ended=$(field ended "$figures")
    read -r user sys rss _ < <(times "$timefile")
    cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')
    if [ -n "$own" ] && [ -n "$(field cpu_s "$figures")" ]; then
        cpu=$(field cpu_s "$figures")
    fi
    awk -v rep="$rep" -v name="$name" -v pub="$published" -v count="${count:-0}" \
        -v seconds="${seconds:-0}" -v rate="${rate:-0}" -v ended="${ended:-lost}" \
        -v cpus="$cpu" -v rss="$rss" -v omem="$omem" 'BEGIN {
        cpu = count > 0 ? cpus * 1e6 / count : 0
        printf "%s %s %d %d %d %.3f %.0f %.3f %.1f %.1f\n", rep, name, count, pub - count,
            ended == "sentinel" ? 0 : 1, seconds, rate, cpu, rss / 1024, omem
    }' >>"$results"
}

# One drain run: `drain_run REP burst|backlog|solo SUBSCRIBER...` with
# some of redis-cli, drain and bare. A burst: the subscribers read while
# COUNT messages are published. A backlog: they are stopped (SIGSTOP) while
# BACKLOG messages are published, then continued (SIGCONT) together, so
# that each reads as fast as it can, whatever the publisher's speed. Solo:
# a burst with one subscriber.
drain_run() {
    local rep=$1 mode=$2 count=$COUNT
    shift 2
    local dir=$WORK/$mode$rep${1:+-$1}
    [ "$mode" = backlog ] && count=$BACKLOG
    [ "$mode" != solo ] && dir=$WORK/$mode$rep
    mkdir -p "$dir"
    echo "-- $mode run $rep ($count messages; $*): load average $(loadavg)"
    local want=" $* " drain="" cli="" counter="" bare="" json="" programs=""
    if [[ $want == *" drain "* ]]; then
        # The crate's drain first: its REPLICATE (sent once subscribed)
        # must reach no other subscriber.
        $TIME -f "%U %S %M %e" -o "$dir/drain.time" \
            "$BIN/drain" --port "$PORT" --channel "$CHANNEL" --sentinel "$SENTINEL" \
            --runtime "$RUNTIME" >"$dir/drain.out" 2>"$dir/drain.err" &
        drain=$!
        for _ in $(seq 200); do
            grep -q "ready" "$dir/drain.err" 2>/dev/null && break
            sleep 0.05
        done
        grep -q "ready" "$dir/drain.err" || { cat "$dir/drain.err" >&2; return 1; }
        sleep 0.2
    fi
    if [[ $want == *" redis-cli "* ]]; then
        mkfifo "$dir/cli.fifo"
        $TIME -f "%U %S %M %e" -o "$dir/cli.time" \
            redis-cli -p "$PORT" SUBSCRIBE "$CHANNEL" "$CHANNEL/USER_IP" >"$dir/cli.fifo" \
            2>"$dir/cli.stderr" &
        cli=$!
        "$BIN/bare_drain" --redis-cli --sentinel "$SENTINEL" <"$dir/cli.fifo" \
            >"$dir/cli.out" 2>"$dir/cli.err" &
        counter=$!
    fi
    if [[ $want == *" bare "* ]]; then
        $TIME -f "%U %S %M %e" -o "$dir/bare.time" \
            "$BIN/bare_drain" --port "$PORT" --channel "$CHANNEL" --sentinel "$SENTINEL" \
            >"$dir/bare.out" 2>"$dir/bare.err" &
        bare=$!
    fi
    if [[ $want == *" bare-json "* ]]; then
        $TIME -f "%U %S %M %e" -o "$dir/json.time" \
            "$BIN/bare_drain" --port "$PORT" --channel "$CHANNEL" --sentinel "$SENTINEL" \
            --validate >"$dir/json.out" 2>"$dir/json.err" &
        json=$!
    fi
    wait_subscribers $#
    local cut_before cpu_before cpu_after
    cut_before=$(grep -c "output buffer limits" "$WORK/redis.log" || true)
    cpu_before=$(redis_cpu)
    sample_clients "$dir/clients.txt" "$dir/done" &
    local sampler=$!
    # The programs themselves (children of GNU time), by pid.
    local pid
    for pid in $drain $cli $bare $json; do programs="$programs $(pgrep -P "$pid")"; done
    # shellcheck disable=SC2086
    [ "$mode" = backlog ] && kill -STOP $programs
    "$BIN/flood" --port "$PORT" --channel "$CHANNEL" --count "$count" \
        --sentinel "$SENTINEL" --via bare >"$dir/flood.out" 2>"$dir/flood.err" || true
    # shellcheck disable=SC2086
    [ "$mode" = backlog ] && kill -CONT $programs
    for pid in $drain $bare $json $counter; do wait_for "$pid" 60; done
    if [ -n "$cli" ]; then
        # redis-cli never stops by itself: end it (GNU time still reports it).
        pkill -TERM -P "$cli" 2>/dev/null || true
        wait_for "$cli" 10
    fi
    touch "$dir/done"
    wait "$sampler" 2>/dev/null || true
    cpu_after=$(redis_cpu)
    local published cut
    published=$(field published "$dir/flood.out")
    cut=$(( $(grep -c "output buffer limits" "$WORK/redis.log" || true) - cut_before ))
    echo "   $(cat "$dir/flood.out" 2>/dev/null)"
    echo "   redis-server CPU $(awk -v a="$cpu_before" -v b="$cpu_after" 'BEGIN { printf "%.2f", b - a }') s; clients cut by Redis (output buffer limit): $cut$(
        [ -s "$dir/cli.stderr" ] && echo "; redis-cli said: $(head -1 "$dir/cli.stderr")")"
    local results=$WORK/$mode.txt
    [ -n "$cli" ] && record "$results" "$rep" redis-cli "${published:-0}" "$dir/cli.err" \
        "$dir/cli.time" "$(peak_omem "$dir/clients.txt" redis-cli)"
    [ -n "$drain" ] && record "$results" "$rep" drain "${published:-0}" "$dir/drain.err" \
        "$dir/drain.time" "$(peak_omem "$dir/clients.txt" drain-sub)" own
    [ -n "$bare" ] && record "$results" "$rep" bare "${published:-0}" \
        "$dir/bare.err" "$dir/bare.time" "$(peak_omem "$dir/clients.txt" bare_drain)" own
    [ -n "$json" ] && record "$results" "$rep" bare-json "${published:-0}" \
        "$dir/json.err" "$dir/json.time" "$(peak_omem "$dir/clients.txt" bare_json)" own
    return 0
}

WRITES=$WORK/writes.txt
: >"$WRITES"

writer_run() {
    local rep=$1 via=$2 dir=$WORK/write$1-$2
    mkdir -p "$dir"
    echo "-- writer run $rep, flood --via $via: load average $(loadavg)"
    local subs=1 pids=() i
    [ "$via" = bare ] && subs=2
    for i in $(seq "$subs"); do
        "$BIN/bare_drain" --port "$PORT" --channel "$CHANNEL" --sentinel "$SENTINEL" \
            >"$dir/bare$i.out" 2>"$dir/bare$i.err" &
        pids+=($!)
    done
    wait_subscribers "$subs"
    $TIME -f "%U %S %M %e" -o "$dir/flood.time" \
        "$BIN/flood" --port "$PORT" --channel "$CHANNEL" --count "$COUNT" \
        --sentinel "$SENTINEL" --via "$via" >"$dir/flood.out" 2>"$dir/flood.err" || true
    for i in "${pids[@]}"; do wait_for "$i" 60; done
    local published rate seconds received lost cpu rss
    published=$(field published "$dir/flood.out")
    rate=$(field rate "$dir/flood.out")
    seconds=$(field seconds "$dir/flood.out")
    cpu=$(field cpu_us_per_msg "$dir/flood.out")
    received=$(cat "$dir/bare1.out" 2>/dev/null || echo 0)
    read -r _ _ rss _ < <(times "$dir/flood.time")
    lost=$(( ${published:-0} - ${received:-0} ))
    echo "   $(cat "$dir/flood.out" 2>/dev/null)$(sed 's/^/ /' "$dir/flood.err" | head -3) ; received $received, lost $lost"
    echo "$rep $via ${published:-0} ${seconds:-0} ${rate:-0} $lost ${cpu:-0} $rss" >>"$WRITES"
}

for rep in $(seq "$REPS"); do
    drain_run "$rep" burst redis-cli drain bare
done
if [ "$SOLO" = 1 ]; then
    for rep in $(seq "$REPS"); do
        # A different one first each time, so a drift in load hits all.
        case $((rep % 3)) in
            1) order="drain redis-cli bare" ;;
            2) order="redis-cli bare drain" ;;
            0) order="bare drain redis-cli" ;;
        esac
        # bare-json right after bare, so that the two see the same load.
        [ "$JSON" = 1 ] && order=${order/bare/bare bare-json}
        for who in $order; do
            drain_run "$rep" solo "$who"
        done
    done
fi
if [ "$BACKLOG" -gt 0 ]; then
    for rep in $(seq "$REPS"); do
        if [ "$JSON" = 1 ]; then
            drain_run "$rep" backlog redis-cli drain bare bare-json
        else
            drain_run "$rep" backlog redis-cli drain bare
        fi
    done
fi
if [ "$WRITER" = 1 ]; then
    for rep in $(seq "$REPS"); do
        # Alternate which goes first, so a drift in load hits both.
        if [ $((rep % 2)) = 1 ]; then
            writer_run "$rep" crate
            writer_run "$rep" bare
        else
            writer_run "$rep" bare
            writer_run "$rep" crate
        fi
    done
fi

# The median of the numbers on stdin; nan without any (a ratio to a CPU
# time GNU time measured as 0, on a short run), which printf prints as nan.
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) { print "nan"; exit }
    if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# The tables of one kind of drain run: `summary FILE TITLE`.
summary() {
    local results=$1 title=$2 name pair
    echo
    echo "== $title: per run"
    printf "%-4s %-10s %9s %6s %4s %8s %9s %8s %8s %8s\n" \
        run subscriber count lost cut seconds "msgs/s" "us/msg" "RSS MiB" "omem MiB"
    while read -r rep name count lost cut seconds rate cpu rss omem; do
        printf "%-4s %-10s %9d %6d %4d %8.3f %9.0f %8.3f %8.1f %8.1f\n" \
            "$rep" "$name" "$count" "$lost" "$cut" "$seconds" "$rate" "$cpu" "$rss" "$omem"
    done <"$results"
    echo
    echo "== $title: medians over $REPS runs"
    printf "%-10s %9s %6s %4s %8s %9s %8s %8s %8s\n" \
        subscriber count lost cut seconds "msgs/s" "us/msg" "RSS MiB" "omem MiB"
    for name in redis-cli drain bare bare-json; do
        grep -q " $name " "$results" || continue
        col() { awk -v n="$name" -v c="$1" '$2 == n { print $c }' "$results" | median; }
        sumcol() { awk -v n="$name" -v c="$1" '$2 == n { m += $c } END { print m + 0 }' "$results"; }
        printf "%-10s %9.0f %6.0f %4d %8.3f %9.0f %8.3f %8.1f %8.1f\n" "$name" "$(col 3)" \
            "$(col 4)" "$(sumcol 5)" "$(col 6)" "$(col 7)" "$(col 8)" "$(col 9)" "$(col 10)"
    done
    echo "(cut: in how many runs the subscriber lost its connection before the sentinel;"
    echo " us/msg: CPU (user+sys) per message, the whole process; omem: its peak Redis"
    echo " output buffer, sampled every 100 ms)"
    echo
    echo "== $title: ratios within each run, then their median"
    for pair in "drain redis-cli" "drain bare" "bare redis-cli" "drain bare-json" "bare-json bare"; do
        # shellcheck disable=SC2086
        set -- $pair
        grep -q " $1 " "$results" && grep -q " $2 " "$results" || continue
        printf "%-22s rate %5.3f   CPU/msg %6.3f   (rate, per run: %s)\n" "$1 / $2" \
            "$(ratio "$results" "$1" "$2" 7 | median)" "$(ratio "$results" "$1" "$2" 8 | median)" \
            "$(ratio "$results" "$1" "$2" 7 | sort -g | tr '\n' ' ')"
    done
}

ratio() {
    awk -v a="$2" -v b="$3" -v c="$4" '
        $2 == a { x[$1] = $c } $2 == b { y[$1] = $c }
        END { for (r in x) if (y[r] > 0) printf "%.3f\n", x[r] / y[r] }' "$1"
}

summary "$WORK/burst.txt" "burst ($COUNT messages, subscribers reading as they come)"
if [ "$SOLO" = 1 ]; then
    summary "$WORK/solo.txt" "solo bursts ($COUNT messages, one subscriber at a time)"
fi
if [ "$BACKLOG" -gt 0 ]; then
    summary "$WORK/backlog.txt" "backlog ($BACKLOG messages queued, then read at full speed)"
fi

if [ "$WRITER" = 1 ]; then
    echo
    echo "== writer: per run (rate: published / first PUBLISH to the sentinel's reply or echo;"
    echo "   us/msg: the publisher's CPU over the same span; RSS includes the pregenerated mix)"
    printf "%-4s %-6s %9s %8s %9s %6s %8s %8s\n" run via published seconds "msgs/s" lost "us/msg" "RSS MiB"
    while read -r rep via published seconds rate lost cpu rss; do
        printf "%-4s %-6s %9d %8.3f %9.0f %6d %8.3f %8.1f\n" "$rep" "$via" "$published" \
            "$seconds" "$rate" "$lost" "$cpu" "$(awk -v r="$rss" 'BEGIN { print r / 1024 }')"
    done <"$WRITES"
    echo
    echo "== writer: medians"
    for via in crate bare; do
        printf "%-6s %9.0f msgs/s %8.3f us/msg\n" "$via" \
            "$(awk -v v="$via" '$2 == v { print $5 }' "$WRITES" | median)" \
            "$(awk -v v="$via" '$2 == v { print $7 }' "$WRITES" | median)"
    done
    printf "crate / bare rate: %s (per run: %s)\n" \
        "$(awk '$2 == "crate" { c[$1] = $5 } $2 == "bare" { b[$1] = $5 }
            END { for (r in c) if (b[r] > 0) printf "%.3f\n", c[r] / b[r] }' "$WRITES" | median)" \
        "$(awk '$2 == "crate" { c[$1] = $5 } $2 == "bare" { b[$1] = $5 }
            END { for (r in c) if (b[r] > 0) printf "%.3f\n", c[r] / b[r] }' "$WRITES" | sort -g | tr '\n' ' ')"
fi

echo
echo "== done: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average $(loadavg)"
