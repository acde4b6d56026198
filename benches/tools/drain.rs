//! Drains a Redis replication channel through the crate's whole receive
//! path and counts the messages: the subscriber of `benches/e2e.sh` (see
//! `flood`, its publisher, and `bare_drain`, the floor it is compared to).
//!
//! ```text
//! cargo bench --bench drain -- --port 6390 \
//!     [--channel e2e.example.com] [--sentinel "PING drain-sentinel"] \
//!     [--exact] [--read-buffer BYTES] [--runtime smol|tokio]
//! ```
//!
//! A `RedisClient` (on smol, or with `--runtime tokio` on a current-thread
//! tokio runtime) on 127.0.0.1 with a `RedisSession` whose prefix
//! is `--channel` (subscribing to it and to `<channel>/USER_IP`, as the
//! process that records client IPs does), a `Follower` and a `Writer`
//! named `drain` (registry: Synapse's defaults, with Redis). Every message
//! goes through the socket read, RESP decoding, command decoding and the
//! follower's bookkeeping; the follower's events are taken and dropped
//! (rows are left raw), catch-ups are skipped (answered with an empty page
//! up to their end). The drain publishes nothing but the `REPLICATE` every
//! session sends when its subscription is confirmed.
//!
//! It stops at the first message equal to the sentinel line (not counted)
//! and prints the count on stdout, then a line of figures on stderr:
//!
//! ```text
//! drain count=500010 seconds=0.912 rate=548000 cpu_s=0.301 cpu_us_per_msg=0.602 ended=sentinel
//! ```
//!
//! `cpu_s` is the process's CPU time from its start (every thread); two
//! more fields end the line: `cpu_ns`, the same in ns, and `switches`, the
//! process's context switches (every thread), which `benches/rates.sh`
//! subtracts its own samples from.
//!
//! `seconds` runs from the first message (after the drain's own
//! `REPLICATE`) to the sentinel. `drain: ready` goes to stderr once the
//! session is ready. If the subscriber connection is lost (or cannot be
//! made) first, the count so far is printed and the exit status is 1.
//!
//! The sentinel must be a line the session hands to the application as a
//! command and that decodes to nothing else: `PING`, `ERROR`,
//! `REMOTE_SERVER_UP`, `NEW_ACTIVE_TASK` or `CANCEL_TASK` followed by a
//! space and non-empty text (the text is kept as received, so a message
//! decodes to the sentinel's command exactly when its bytes are the
//! sentinel's).
//!
//! Counting: by default the session's counters (commands decoded, and
//! malformed messages), minus the drain's own echoed `REPLICATE`, minus
//! the sentinel, read when the sentinel's command comes out. That is free,
//! and exact as long as nothing follows the sentinel within one read (the
//! counters also cover the rest of the read the sentinel was in). `--exact`
//! counts the session's `Received` and `Malformed` events instead
//! (`RedisSessionConfig::report_received`), one per message in order, at the
//! price of one event per message.

use std::io::{self, Write};
use std::process::ExitCode;

#[derive(Debug)]
struct Args {
    port: u16,
    channel: String,
    sentinel: String,
    exact: bool,
    read_buffer: Option<usize>,
    tokio: bool,
}

const USAGE: &str = "usage: drain --port PORT [--channel NAME] [--sentinel LINE] [--exact] \
                     [--read-buffer BYTES] [--runtime smol|tokio]";

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut port = None;
    let mut parsed = Args {
        port: 0,
        channel: "e2e.example.com".to_owned(),
        sentinel: "PING drain-sentinel".to_owned(),
        exact: false,
        read_buffer: None,
        tokio: false,
    };
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--port" => {
                port = Some(
                    value("--port")?
                        .parse()
                        .map_err(|e| format!("--port: {e}"))?,
                )
            }
            "--channel" => parsed.channel = value("--channel")?,
            "--sentinel" => parsed.sentinel = value("--sentinel")?,
            "--exact" => parsed.exact = true,
            "--read-buffer" => {
                parsed.read_buffer = Some(
                    value("--read-buffer")?
                        .parse()
                        .map_err(|e| format!("--read-buffer: {e}"))?,
                )
            }
            "--runtime" => {
                parsed.tokio = match value("--runtime")?.as_str() {
                    "smol" => false,
                    "tokio" => true,
                    other => return Err(format!("--runtime: {other:?} is not smol or tokio")),
                }
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    parsed.port = port.ok_or("--port is required")?;
    Ok(parsed)
}

fn main() -> ExitCode {
    // `cargo bench` adds `--bench`. Without other arguments (a plain
    // `cargo bench` runs every bench target) there is nothing to measure.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.is_empty() {
        eprintln!("drain: run by benches/e2e.sh; alone: {USAGE}");
        return ExitCode::SUCCESS;
    }
    let args = match parse_args(args.into_iter()) {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("drain: {message}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    run(&args)
}

/// What was counted, printed at the end.
struct Tally {
    count: u64,
    seconds: f64,
    sentinel: bool,
}

impl Tally {
    fn finish(&self) -> ExitCode {
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "{}", self.count);
        let _ = out.flush();
        let rate = if self.seconds > 0.0 {
            self.count as f64 / self.seconds
        } else {
            0.0
        };
        let cpu = process_cpu();
        eprintln!(
            "drain count={} seconds={:.3} rate={rate:.0} cpu_s={cpu:.3} cpu_us_per_msg={:.3} ended={} \
             cpu_ns={:.0} switches={}",
            self.count,
            self.seconds,
            cpu * 1e6 / self.count.max(1) as f64,
            if self.sentinel { "sentinel" } else { "lost" },
            cpu * 1e9,
            process_switches()
        );
        if self.sentinel {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}

/// The sentinel as the command the session will hand over, if it is one
/// whose decoding keeps its bytes (see the module's documentation).
fn sentinel_command(line: &str) -> Result<synapse_replication::wire::Command, String> {
    use synapse_replication::wire::Command;

    let command = Command::decode(bytes::Bytes::from(line.to_owned()))
        .map_err(|error| format!("--sentinel does not decode: {error}"))?
        .ok_or("--sentinel is blank")?;
    let text = match &command {
        Command::Ping(text)
        | Command::Error(text)
        | Command::RemoteServerUp(text)
        | Command::NewActiveTask(text)
        | Command::CancelTask(text) => text,
        _ => {
            return Err(
                "--sentinel must be PING, ERROR, REMOTE_SERVER_UP, NEW_ACTIVE_TASK or \
                        CANCEL_TASK with text"
                    .to_owned(),
            );
        }
    };
    let encoded = command.to_bytes().map_err(|error| error.to_string())?;
    if text.is_empty() || encoded != line.as_bytes() {
        return Err("--sentinel must be `<COMMAND> <non-empty text>`".to_owned());
    }
    Ok(command)
}

fn run(args: &Args) -> ExitCode {
    use std::sync::Arc;

    use synapse_replication::config::{RedisConfig, StreamWriters};
    use synapse_replication::positions::{Follower, Writer};
    use synapse_replication::session::RedisSession;
    use synapse_replication::transport::{
        RedisClient, RedisClientConfig, SmolRuntime, TokioRuntime,
    };
    use synapse_replication::wire::InstanceName;

    let sentinel = match sentinel_command(&args.sentinel) {
        Ok(command) => command,
        Err(message) => {
            eprintln!("drain: {message}");
            return ExitCode::from(2);
        }
    };
    let config = RedisConfig::tcp("127.0.0.1", args.port);
    let mut options = config.session_config(args.channel.as_str());
    options.extra_channels = vec!["USER_IP".to_owned()];
    options.client_name = Some("drain".to_owned());
    options.report_received = args.exact;
    let registry = Arc::new(StreamWriters::default().with_redis(true));
    let me = InstanceName::from("drain");
    let session = RedisSession::new(
        options,
        Follower::new(me.clone(), registry.clone()),
        Writer::new(me, registry),
    );
    let mut client_options = RedisClientConfig::default();
    if let Some(size) = args.read_buffer {
        client_options.read_buffer = size;
    }
    let tally = if args.tokio {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                eprintln!("drain: cannot start tokio: {error}");
                return ExitCode::from(2);
            }
        };
        let handle = TokioRuntime::new(runtime.handle().clone());
        let mut client = RedisClient::with_config(handle, config, session, client_options);
        runtime.block_on(follow(&mut client, args, &sentinel))
    } else {
        let mut client = RedisClient::with_config(SmolRuntime, config, session, client_options);
        smol::block_on(follow(&mut client, args, &sentinel))
    };
    tally.finish()
}

/// Counts messages until the sentinel (or the subscriber is lost).
async fn follow<R: synapse_replication::transport::Runtime>(
    client: &mut synapse_replication::transport::RedisClient<R>,
    args: &Args,
    sentinel: &synapse_replication::wire::Command,
) -> Tally {
    use std::time::Instant;

    use synapse_replication::positions::{CatchUpPage, FollowerEvent};
    use synapse_replication::session::{RedisEvent, RedisLink, RedisSession};

    // Messages the session counted: commands and malformed lines.
    let seen = |session: &RedisSession| {
        let counters = session.counters();
        counters.received.total() + counters.malformed
    };
    // The drain's own messages, echoed back (its REPLICATE).
    let own = |session: &RedisSession| session.counters().published.total();

    let mut first: Option<Instant> = None;
    let mut events: u64 = 0;
    let mut ready = false;
    let mut sentinel_at: Option<u64> = None;
    while let Some(event) = client.next_event().await {
        if first.is_none() && ready && seen(client.session()) > own(client.session()) {
            first = Some(Instant::now());
        }
        match event {
            RedisEvent::Command(command) if !args.exact && command == *sentinel => {
                sentinel_at = Some(seen(client.session()) - 1);
                break;
            }
            RedisEvent::Received { command, .. } => {
                if *command == *sentinel {
                    sentinel_at = Some(events);
                    break;
                }
                events += 1;
            }
            RedisEvent::Malformed { .. } => events += 1,
            RedisEvent::Follower(FollowerEvent::CatchUp(request)) => {
                // Nothing to fetch from: skip the range.
                let page = CatchUpPage {
                    updates: Vec::new(),
                    upto: request.to,
                    limited: false,
                };
                let _ = client.handle_catch_up(request.id, page);
            }
            RedisEvent::Ready => {
                ready = true;
                eprintln!("drain: ready");
            }
            RedisEvent::Disconnected { link, reason, .. } => {
                eprintln!("drain: {link} lost: {reason}");
                if link == RedisLink::Subscriber {
                    break;
                }
            }
            RedisEvent::ConnectFailed { link, error, .. } => {
                eprintln!("drain: cannot connect the {link}: {error}");
                break;
            }
            _ => {}
        }
    }
    let seconds = first.map_or(0.0, |first| first.elapsed().as_secs_f64());
    let session = client.session();
    let received = match sentinel_at {
        Some(at) => at,
        None if args.exact => events,
        None => seen(session),
    };
    Tally {
        count: received.saturating_sub(own(session)),
        seconds,
        sentinel: sentinel_at.is_some(),
    }
}

/// Context switches of this process so far, every thread (Linux: the sum
/// of `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches` in
/// `/proc/self/task/*/status`; zero elsewhere): each thread's sleeps and
/// wake-ups, which `benches/rates.sh` counts per message.
fn process_switches() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .flat_map(|text| {
            text.lines()
                .filter(|line| line.contains("ctxt_switches:"))
                .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// CPU time of this process so far, every thread (Linux: the sum of
/// `/proc/self/task/*/schedstat`, in ns; zero elsewhere).
fn process_cpu() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let nanos: u64 = tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|text| text.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    nanos as f64 / 1e9
}
