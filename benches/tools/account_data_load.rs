//! The caller of `benches/account_data.sh`: account-data changes sent to
//! a deployment's account-data writer the way Synapse's main sends them,
//! through the crate's `ReplicationClient::account_data` (the endpoint's
//! path and canonical JSON body, the replication secret, `Host:
//! <instance>`, one connection a call), `--concurrency` calls in flight.
//!
//! ```text
//! account_data_load --config homeserver.json --count 3000 --concurrency 8 \
//!     [--warmup 100] [--users 50] [--rooms 20] [--offset N] \
//!     [--pid PID] [--db-pids PID,PID,...]
//! ```
//!
//! `--config` is Synapse's configuration as JSON; the calls go to the
//! first instance of its `stream_writers.account_data` at its
//! `instance_map` address. The workload is a fixed mix, change `i` of
//! `--offset + i`: a global account-data event of one of eight types
//! (`AddUserAccountData`), a room's `m.fully_read`-like event
//! (`AddRoomAccountData`) or a tag (`AddTag`), in turn, for one of
//! `--users` users of the config's `server_name` and one of `--rooms`
//! rooms, each content carrying the change's number (so every call
//! changes its row). `--warmup` calls go first, unmeasured.
//!
//! Then it prints one line of `key=value`: `calls`, `errors`, `seconds`
//! (wall time of the measured calls), `p50_ms`, `p99_ms` (each call's
//! time), and with `--pid`, `server_cpu_ns`: the CPU time of process PID
//! (user and system, every thread: the sum of
//! `/proc/PID/task/*/schedstat`) over the measured calls, with
//! `--db-pids`, `db_cpu_ns`: the same summed over those processes (the
//! PostgreSQL backends), and `load_cpu_ns`, this process's own.
//!
//! Without arguments (a plain `cargo bench`) it says so and exits.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use synapse_replication::config::SynapseConfig;
use synapse_replication::http::AccountDataRequest;
use synapse_replication::transport::{ReplicationClient, SmolRuntime};

const USAGE: &str = "usage: account_data_load --config FILE.json --count N --concurrency C \
                     [--warmup N] [--users N] [--rooms N] [--offset N] [--pid PID] [--db-pids PID,...]";

struct Args {
    config: String,
    count: usize,
    concurrency: usize,
    warmup: usize,
    users: usize,
    rooms: usize,
    pid: Option<u32>,
    db_pids: Vec<u32>,
    offset: usize,
}

fn parse(mut raw: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        config: String::new(),
        count: 0,
        concurrency: 8,
        warmup: 100,
        users: 50,
        rooms: 20,
        pid: None,
        db_pids: Vec::new(),
        offset: 0,
    };
    while let Some(flag) = raw.next() {
        // `cargo bench` passes `--bench`; it takes no value.
        if flag == "--bench" {
            continue;
        }
        let value = raw.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag}: not a number: {value}"))
        };
        match flag.as_str() {
            "--config" => args.config = value.clone(),
            "--count" => args.count = number()?,
            "--concurrency" => args.concurrency = number()?.max(1),
            "--warmup" => args.warmup = number()?,
            "--users" => args.users = number()?.max(1),
            "--rooms" => args.rooms = number()?.max(1),
            "--offset" => args.offset = number()?,
            "--pid" => {
                args.pid = Some(
                    value
                        .parse()
                        .map_err(|_| format!("--pid: not a pid: {value}"))?,
                )
            }
            "--db-pids" => {
                args.db_pids = value
                    .split(',')
                    .filter(|pid| !pid.is_empty())
                    .map(|pid| {
                        pid.parse()
                            .map_err(|_| format!("--db-pids: not a pid: {pid}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if args.config.is_empty() || args.count == 0 {
        return Err("--config and --count are required".into());
    }
    Ok(args)
}

/// Change number `n` of the mix.
fn change(n: usize, server: &str, users: usize, rooms: usize) -> AccountDataRequest {
    let user_id = format!("@bench{}:{server}", n % users);
    let room_id = format!("!benchroom{}:{server}", (n / 3) % rooms);
    let content =
        |value: Value| -> Map<String, Value> { value.as_object().cloned().unwrap_or_default() };
    match n % 3 {
        0 => AccountDataRequest::AddUserAccountData {
            user_id,
            account_data_type: format!("org.example.bench.{}", (n / 3) % 8),
            content: content(json!({"n": n, "text": "a change of global account data"})),
        },
        1 => AccountDataRequest::AddRoomAccountData {
            user_id,
            room_id,
            account_data_type: "org.example.bench.read".into(),
            content: content(json!({"event_id": format!("$event{n}:{server}")})),
        },
        _ => AccountDataRequest::AddTag {
            user_id,
            room_id,
            tag: format!("u.bench{}", (n / 3) % 4),
            content: content(json!({"order": (n % 1000) as f64 / 1000.0})),
        },
    }
}

/// CPU time of process `pid` so far, every thread, in ns.
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Sends changes `from..from + count` on `concurrency` callers; each
/// call's time, and the errors.
fn drive(
    client: &ReplicationClient<SmolRuntime>,
    server: &str,
    args: &Args,
    from: usize,
    count: usize,
) -> (Vec<Duration>, usize) {
    let next = AtomicUsize::new(0);
    let times = Mutex::new(Vec::with_capacity(count));
    let errors = AtomicUsize::new(0);
    let caller = || async {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= count {
                break;
            }
            let request = change(from + i, server, args.users, args.rooms);
            let started = Instant::now();
            match client.account_data(&request).await {
                Ok(_) => times.lock().expect("times").push(started.elapsed()),
                Err(error) => {
                    if errors.fetch_add(1, Ordering::Relaxed) < 5 {
                        eprintln!("account_data_load: {error}");
                    }
                }
            }
        }
    };
    smol::block_on(futures::future::join_all(
        (0..args.concurrency).map(|_| caller()),
    ));
    (
        times.into_inner().expect("times"),
        errors.load(Ordering::Relaxed),
    )
}

fn main() {
    if std::env::args().len() <= 2 {
        eprintln!("account_data_load: run by benches/account_data.sh\n{USAGE}");
        return;
    }
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("account_data_load: {error}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let text = std::fs::read_to_string(&args.config).unwrap_or_else(|error| {
        eprintln!("account_data_load: reading {}: {error}", args.config);
        std::process::exit(2);
    });
    let value: Value = serde_json::from_str(&text).unwrap_or_else(|error| {
        eprintln!("account_data_load: {}: not JSON: {error}", args.config);
        std::process::exit(2);
    });
    let server = value["server_name"].as_str().unwrap_or("").to_owned();
    let synapse = SynapseConfig::from_value(value).unwrap_or_else(|error| {
        eprintln!("account_data_load: {}: {error}", args.config);
        std::process::exit(2);
    });
    // As main: `master` calls, with no positions of its own to wait for.
    let client = ReplicationClient::from_synapse(SmolRuntime, &synapse, "master");

    let (_, warmup_errors) = drive(&client, &server, &args, args.offset, args.warmup);
    if warmup_errors > 0 {
        eprintln!("account_data_load: {warmup_errors} warm-up calls failed");
        std::process::exit(1);
    }
    let from = args.offset + args.warmup;
    let server_before = args.pid.map(cpu_ns);
    let db_cpu = || args.db_pids.iter().map(|pid| cpu_ns(*pid)).sum::<u64>();
    let db_before = db_cpu();
    let own_before = cpu_ns(std::process::id());
    let started = Instant::now();
    let (mut times, errors) = drive(&client, &server, &args, from, args.count);
    let seconds = started.elapsed().as_secs_f64();
    let own = cpu_ns(std::process::id()) - own_before;
    let db = db_cpu().saturating_sub(db_before);
    let server_cpu = args
        .pid
        .zip(server_before)
        .map(|(pid, before)| cpu_ns(pid).saturating_sub(before));
    times.sort();
    let quantile = |q: f64| {
        times
            .get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1)))
            .map_or(0.0, |time| time.as_secs_f64() * 1e3)
    };
    let mut line = format!(
        "calls={} errors={errors} seconds={seconds:.3} p50_ms={:.2} p99_ms={:.2} load_cpu_ns={own}",
        times.len(),
        quantile(0.5),
        quantile(0.99),
    );
    if let Some(cpu) = server_cpu {
        line.push_str(&format!(" server_cpu_ns={cpu}"));
    }
    if !args.db_pids.is_empty() {
        line.push_str(&format!(" db_cpu_ns={db}"));
    }
    println!("{line}");
}
