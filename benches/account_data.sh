#!/usr/bin/env bash
# Account-data changes served by the Rust account-data writer
# (examples/account_data_writer) and by Synapse's own (a generic worker
# owning the `account_data` stream), side by side in one run, over the same
# database, called as Synapse's main calls them (issue #36).
#
# Needs the Synapse 1.163.2 venv that scripts/test.sh creates
# (SYNAPSE_PYTHON, else ~/.cache/synapse-replication/synapse-1.163.2),
# redis-server, PostgreSQL on 127.0.0.1:5432 (user postgres, trust auth),
# psql, bash, awk and a Rust toolchain.
#
#     benches/account_data.sh                              # 5 x 2 runs of 1,500 changes, 8 callers
#     REPS=1 COUNT=300 benches/account_data.sh             # a quick check
#
# Environment: REPS (5), COUNT (1500: changes per run), CONCURRENCY (8:
# calls in flight), WARMUP (100: unmeasured calls before each run), USERS
# (50), ROOMS (20), KEEP=1 keeps the work directory (the deployment's logs,
# the writer's, results.txt), BENCH_BIN=DIR takes account_data_writer and
# account_data_load from DIR instead of building them, OUT=FILE copies the
# per-run lines (results.txt) there.
#
# What it starts (tests/synapse/deployment.py, as the interop tests do): a
# PostgreSQL database of its own (synrep_bench_*, Synapse's schema, dropped
# at the end), a redis-server of its own on a free loopback port (never
# 6379), Synapse's main, one event persister and `worker1`, a generic
# worker with `stream_writers.account_data: [worker1]`; then the Rust
# writer, `rust_account_data`, on the same database and Redis, with a
# configuration of its own naming it as the account-data writer. Both write
# the same tables with ids from the same `account_data_sequence`, each
# under its own instance name, and publish their rows on the same Redis.
#
# Each repetition runs both, one after the other, the order turning from
# one repetition to the next. A run: benches/tools/account_data_load.rs
# sends WARMUP changes (unmeasured), then COUNT changes, a third each of
# `add_user_account_data`, `add_room_account_data` and `add_tag`, with
# CONCURRENCY calls in flight, through the crate's
# `ReplicationClient::account_data`: what main sends (path, canonical
# JSON body, the replication secret), one connection a call. Measured over
# the COUNT changes: changes a second (wall time), each call's time (p50,
# p99), and CPU per change: the writer process's own CPU time (user +
# system, every thread, /proc/PID/task/*/schedstat; for Synapse, the
# worker's process), and that of every PostgreSQL backend of the bench
# database at the start of the run (the writers' and Synapse's other
# processes'), divided by the changes.
#
# Output: per run, then per writer the median and range over the
# repetitions, and the ratios Synapse / Rust within each repetition.

set -euo pipefail

REPS=${REPS:-5}
COUNT=${COUNT:-1500}
CONCURRENCY=${CONCURRENCY:-8}
WARMUP=${WARMUP:-100}
USERS=${USERS:-50}
ROOMS=${ROOMS:-20}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${SYNAPSE_PYTHON:-$HOME/.cache/synapse-replication/synapse-1.163.2/bin/python}
DEPLOYMENT=$ROOT/tests/synapse/deployment.py
RUST=rust_account_data
SYNAPSE=worker1

for tool in redis-server psql cargo awk; do
    command -v "$tool" >/dev/null || { echo "account_data.sh: $tool is required" >&2; exit 2; }
done
[ -x "$PYTHON" ] || {
    echo "account_data.sh: no Synapse venv at $PYTHON: run scripts/test.sh or set SYNAPSE_PYTHON" >&2
    exit 2
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/account_data_bench.XXXXXX")
WRITER_PID=
cleanup() {
    if [ -n "$WRITER_PID" ]; then
        kill "$WRITER_PID" 2>/dev/null || true
        wait "$WRITER_PID" 2>/dev/null || true
    fi
    # Stops Synapse's processes and Redis, drops the database.
    if [ -f "$WORK/dep/deployment.json" ]; then
        "$PYTHON" "$DEPLOYMENT" stop --dir "$WORK/dep" || true
    fi
    if [ "${KEEP:-0}" = 1 ]; then
        echo "work directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

echo "== account data: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) cores, load average $(loadavg)"
echo "   $(uname -srm); $(rustc --version); Synapse $("$PYTHON" -c 'import synapse; print(synapse.__version__)')"
echo "   commit $(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet HEAD || echo ' (with changes)')"
echo "   $REPS repetitions x (Rust, Synapse): $COUNT changes each after $WARMUP unmeasured, $CONCURRENCY in flight, $USERS users, $ROOMS rooms"

if [ -n "${BENCH_BIN:-}" ]; then
    BIN=$BENCH_BIN
    echo "== prebuilt binaries from $BIN"
else
    echo "== building (release)"
    BIN=$WORK/bin
    mkdir -p "$BIN"
    # The example and the bench target (whose executable cargo names with
    # a hash), copied into the work directory under their names.
    (cd "$ROOT" && cargo build --quiet --release --message-format=json-render-diagnostics \
        --features runtime-smol,postgres,http-server,http-catch-up \
        --example account_data_writer --bench account_data_load) |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' |
        while read -r exe; do
            cp "$exe" "$BIN/$(basename "$exe" | sed 's/-[0-9a-f]*$//')"
        done
fi
for bin in account_data_writer account_data_load; do
    [ -x "$BIN/$bin" ] || { echo "account_data.sh: $BIN/$bin missing" >&2; exit 2; }
done

echo "== starting Synapse (main, persister1, worker1 writing account_data)"
"$PYTHON" "$DEPLOYMENT" start --dir "$WORK/dep" --persisters 1 --owner-pid $$ \
    --database-prefix synrep_bench_ \
    --config-json "{\"stream_writers\": {\"account_data\": [\"$SYNAPSE\"]}}" >"$WORK/state.json"

# The Rust writer's configuration: the deployment's, naming it as the
# account-data writer (at a free port of its own); the load's for Synapse:
# the deployment's own homeserver.yaml (JSON), naming worker1.
WRITER_PORT=$("$PYTHON" - "$WORK" "$RUST" <<'EOF'
import json, socket, sys
work, name = sys.argv[1], sys.argv[2]
state = json.load(open(f"{work}/state.json"))
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
port = sock.getsockname()[1]
sock.close()
config = state["config"]
config["instance_map"][name] = {"host": "127.0.0.1", "port": port}
config["stream_writers"]["account_data"] = [name]
json.dump(config, open(f"{work}/rust.json", "w"), indent=2)
with open(f"{work}/facts", "w") as facts:
    facts.write(f"DATABASE={state['database']}\n")
    facts.write(f"SYNAPSE_PID={state['instances']['worker1']['pid']}\n")
    facts.write(f"REDIS_PORT={state['redis_port']}\n")
print(port)
EOF
)
# shellcheck disable=SC1091
. "$WORK/facts"
echo "   database $DATABASE, redis-server on 127.0.0.1:$REDIS_PORT, worker1 pid $SYNAPSE_PID"

"$BIN/account_data_writer" --config "$WORK/rust.json" --instance "$RUST" \
    --listen "127.0.0.1:$WRITER_PORT" 2>"$WORK/rust_writer.log" &
WRITER_PID=$!
for _ in $(seq 600); do
    grep -q "redis ready" "$WORK/rust_writer.log" && break
    kill -0 "$WRITER_PID" 2>/dev/null || { cat "$WORK/rust_writer.log" >&2; exit 1; }
    sleep 0.05
done
grep -q "redis ready" "$WORK/rust_writer.log" || { cat "$WORK/rust_writer.log" >&2; exit 1; }
echo "   $RUST on 127.0.0.1:$WRITER_PORT, pid $WRITER_PID"

# The PostgreSQL backends of the bench database, comma-separated.
backends() {
    psql -h 127.0.0.1 -U postgres -d "$DATABASE" -At -c \
        "SELECT string_agg(pid::text, ',') FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()"
}

# `key=value` from a figures line.
field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$2"; }

RESULTS=$WORK/results.txt
: >"$RESULTS"
OFFSET=0

# One run: `run REP WHO` (rust or synapse).
run() {
    local rep=$1 who=$2 config pid line
    if [ "$who" = rust ]; then
        config=$WORK/rust.json pid=$WRITER_PID
    else
        config=$WORK/dep/homeserver.yaml pid=$SYNAPSE_PID
    fi
    "$BIN/account_data_load" --config "$config" --count "$WARMUP" --warmup 0 \
        --concurrency "$CONCURRENCY" --users "$USERS" --rooms "$ROOMS" --offset "$OFFSET" >/dev/null
    OFFSET=$((OFFSET + WARMUP))
    line=$("$BIN/account_data_load" --config "$config" --count "$COUNT" --warmup 0 \
        --concurrency "$CONCURRENCY" --users "$USERS" --rooms "$ROOMS" --offset "$OFFSET" \
        --pid "$pid" --db-pids "$(backends)")
    OFFSET=$((OFFSET + COUNT))
    local calls seconds cpu db
    calls=$(field calls "$line")
    seconds=$(field seconds "$line")
    cpu=$(field server_cpu_ns "$line")
    db=$(field db_cpu_ns "$line")
    [ "$(field errors "$line")" = 0 ] || echo "   !! $who: $(field errors "$line") calls failed" >&2
    awk -v rep="$rep" -v who="$who" -v calls="$calls" -v s="$seconds" -v cpu="$cpu" -v db="$db" \
        -v p50="$(field p50_ms "$line")" -v p99="$(field p99_ms "$line")" -v la="$(loadavg)" '
        BEGIN {
            printf "   rep %d %-8s %6.0f changes/s  CPU %7.1f us/change  db %6.1f us/change  p50 %6.2f ms  p99 %6.2f ms  (load %s)\n",
                rep, who, calls / s, cpu / calls / 1e3, db / calls / 1e3, p50, p99, la
        }'
    echo "rep=$rep who=$who $line" >>"$RESULTS"
}

echo "== runs"
for rep in $(seq "$REPS"); do
    if [ $((rep % 2)) = 1 ]; then
        run "$rep" rust
        run "$rep" synapse
    else
        run "$rep" synapse
        run "$rep" rust
    fi
done

# What the two wrote: rows per table and instance (both take their ids from
# account_data_sequence), and the position each keeps in stream_positions.
echo "== database"
psql -h 127.0.0.1 -U postgres -d "$DATABASE" -At -F ' ' -c "
    SELECT tab, coalesce(instance_name, '(none)'), count(*), max(stream_id) FROM (
        SELECT 'account_data' AS tab, instance_name, stream_id FROM account_data UNION ALL
        SELECT 'room_account_data', instance_name, stream_id FROM room_account_data UNION ALL
        SELECT 'room_tags_revisions', instance_name, stream_id FROM room_tags_revisions) t
    GROUP BY 1, 2 ORDER BY 1, 2" | awk '{ printf "   %-20s %-18s %6d rows, last id %d\n", $1, $2, $3, $4 }'
psql -h 127.0.0.1 -U postgres -d "$DATABASE" -At -F ' ' -c "
    SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = 'account_data'
    ORDER BY 1" | awk '{ printf "   stream_positions: account_data %s at %d\n", $1, $2 }'

echo "== summary: median (range) over $REPS repetitions"
awk '
    function val(key,   i, kv) {
        for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == key) return kv[2] }
        return ""
    }
    function sortn(a, n,   i, j, t) {
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    }
    function stat(name, a, n, fmt,   m) {
        sortn(a, n)
        m = (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        printf "   %-34s " fmt " (" fmt "-" fmt ")\n", name, m, a[1], a[n]
    }
    {
        who = val("who"); rep = val("rep"); calls = val("calls")
        n[who]++
        rate[who, n[who]] = calls / val("seconds")
        cpu[who, n[who]] = val("server_cpu_ns") / calls / 1e3
        db[who, n[who]] = val("db_cpu_ns") / calls / 1e3
        p50[who, n[who]] = val("p50_ms")
        cpu_rep[who, rep] = cpu[who, n[who]]
        rate_rep[who, rep] = rate[who, n[who]]
        db_rep[who, rep] = db[who, n[who]]
        reps[rep] = 1
    }
    END {
        split("rust synapse", whos, " ")
        for (w = 1; w <= 2; w++) {
            who = whos[w]
            print "  " (who == "rust" ? "Rust writer (rust_account_data)" : "Synapse worker1 (generic worker)")
            delete a; for (i = 1; i <= n[who]; i++) a[i] = rate[who, i]; stat("changes/s", a, n[who], "%.0f")
            delete a; for (i = 1; i <= n[who]; i++) a[i] = cpu[who, i]; stat("writer CPU us/change", a, n[who], "%.1f")
            delete a; for (i = 1; i <= n[who]; i++) a[i] = db[who, i]; stat("PostgreSQL backends CPU us/change", a, n[who], "%.1f")
            delete a; for (i = 1; i <= n[who]; i++) a[i] = p50[who, i]; stat("p50 call ms", a, n[who], "%.2f")
        }
        print "  Synapse / Rust, within each repetition"
        k = 0; delete a; delete b; delete c
        for (r in reps) if ((("rust", r) in cpu_rep) && (("synapse", r) in cpu_rep)) {
            k++
            a[k] = cpu_rep["synapse", r] / cpu_rep["rust", r]
            b[k] = rate_rep["rust", r] / rate_rep["synapse", r]
            c[k] = db_rep["synapse", r] / db_rep["rust", r]
        }
        stat("writer CPU per change", a, k, "%.1fx")
        stat("changes/s (Rust / Synapse)", b, k, "%.2fx")
        stat("PostgreSQL CPU per change", c, k, "%.2fx")
    }' "$RESULTS"

if [ -n "${OUT:-}" ]; then cp "$RESULTS" "$OUT"; fi
