//! Publishes a burst of replication traffic to a Redis channel, as fast as
//! Redis takes it, then a sentinel line; prints the rate. The publisher of
//! `benches/e2e.sh` (see `drain` and `bare_drain`, its subscribers).
//!
//! ```text
//! cargo bench --bench flood -- \
//!     --port 6390 [--channel e2e.example.com] [--count 500000] \
//!     [--sentinel "PING drain-sentinel"] [--via bare|crate] [--seed 42] [--stats] \
//!     [--rate MSGS_PER_S]
//! ```
//!
//! The traffic is a busy deployment's mix, one writer (`master`) for every
//! stream, built from the real Synapse lines of `tests/vectors/commands.jsonl`
//! with varying ids and growing tokens: `RDATA` of `events` (some batches of
//! state rows), `caches`, `receipts`, `typing`, `presence`, `to_device`,
//! `device_lists`, `account_data`, `push_rules`, the `POSITION`s a writer
//! sends when its token moves past its last row, and `USER_SYNC`, `USER_IP`
//! (on `<channel>/USER_IP`, as Synapse), `FEDERATION_ACK`, `REMOTE_SERVER_UP`,
//! `LOCK_RELEASED`; mean line length about 137 bytes (`--stats` prints it).
//!
//! - `--via bare` (the default): a hand-written pipelined `PUBLISH` loop on
//!   one std `TcpStream` (commands encoded with `resp::encode_publish` into
//!   64 KiB writes; a second thread counts the replies). The lines are
//!   exactly what the crate's `Writer` would send: `REPLICATE`, the
//!   announcement of every stream (`POSITION t t`), then the mix.
//! - `--via crate`: through a `RedisClient` (smol): `RedisSession::write`
//!   for the streams, `RedisSession::send` for the other commands, at most
//!   `--queue` bytes (64 KiB) queued in the session before the client must
//!   write some out. Like every Synapse process
//!   the session also subscribes to the channel and decodes its own
//!   echoes (its follower ignores them); its writer answers its own
//!   `REPLICATE` with one more announcement.
//!
//! - `--rate N` (with `--via bare` only): paced rather than a burst, the
//!   way a live deployment's traffic comes: line `i` is written at `i / N`
//!   seconds from the start, each in a write of its own once it is due (the
//!   publisher sleeps in between), lines already late together. At tens
//!   or hundreds a second nearly every message is a wake-up of its own for
//!   a subscriber, as on a live bus (`benches/rates.sh`).
//!
//! The sentinel (default `PING drain-sentinel`) goes last, after `--count`
//! messages of the mix and the preamble. Timing runs from the first
//! `PUBLISH` written to the reply to the sentinel's (bare) or the echo of
//! the sentinel (crate). One line on stdout:
//!
//! ```text
//! flood via=bare published=500010 seconds=0.812 rate=615783 cpu_s=0.301 cpu_us_per_msg=0.602 mean_len=137.1
//! ```
//!
//! `cpu_s` is this process's CPU time (every thread) over the same span.
//!
//! `published` counts every message before the sentinel (what a subscriber
//! that was there from the start must count). Exit status 1 if the
//! connection is lost.

use std::io;
use std::process::ExitCode;

/// The traffic, shared with the Redis benchmarks.
mod mix;

#[derive(Debug)]
struct Args {
    port: u16,
    channel: String,
    count: usize,
    sentinel: String,
    crate_path: bool,
    seed: u64,
    stats: bool,
    queue: usize,
    /// Messages a second; `None`: as fast as Redis takes them.
    rate: Option<f64>,
}

const USAGE: &str = "usage: flood --port PORT [--channel NAME] [--count N] [--sentinel LINE] \
                     [--via bare|crate] [--queue BYTES] [--seed N] [--stats] \
                     [--rate MSGS_PER_S]";

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        port: 0,
        channel: "e2e.example.com".to_owned(),
        count: 500_000,
        sentinel: "PING drain-sentinel".to_owned(),
        crate_path: false,
        seed: 42,
        stats: false,
        queue: 64 << 10,
        rate: None,
    };
    let mut port = None;
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
            "--count" => {
                parsed.count = value("--count")?
                    .replace('_', "")
                    .parse()
                    .map_err(|e| format!("--count: {e}"))?
            }
            "--sentinel" => parsed.sentinel = value("--sentinel")?,
            "--seed" => {
                parsed.seed = value("--seed")?
                    .parse()
                    .map_err(|e| format!("--seed: {e}"))?
            }
            "--via" => {
                parsed.crate_path = match value("--via")?.as_str() {
                    "crate" => true,
                    "bare" => false,
                    other => return Err(format!("--via: crate or bare, not {other:?}")),
                }
            }
            "--stats" => parsed.stats = true,
            "--queue" => {
                parsed.queue = value("--queue")?
                    .parse()
                    .map_err(|e| format!("--queue: {e}"))?
            }
            "--rate" => {
                let rate: f64 = value("--rate")?
                    .replace('_', "")
                    .parse()
                    .map_err(|e| format!("--rate: {e}"))?;
                if !(rate > 0.0 && rate.is_finite()) {
                    return Err("--rate must be a positive number".to_owned());
                }
                parsed.rate = Some(rate);
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if parsed.rate.is_some() && parsed.crate_path {
        return Err("--rate paces the bare publisher only (--via bare)".to_owned());
    }
    match port {
        Some(port) => parsed.port = port,
        None if parsed.stats => {}
        None => return Err("--port is required".to_owned()),
    }
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
        eprintln!("flood: run by benches/e2e.sh; alone: {USAGE}");
        return ExitCode::SUCCESS;
    }
    let args = match parse_args(args.into_iter()) {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("flood: {message}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let items = mix::items(args.count, args.seed);
    if args.stats {
        stats(&items);
        return ExitCode::SUCCESS;
    }
    let result = if args.crate_path {
        run_crate(&args, items)
    } else {
        let lines = mix::lines(&items);
        drop(items);
        run_bare(&args, lines)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("flood: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Prints what the mix is made of.
fn stats(items: &[mix::Item]) {
    use std::collections::BTreeMap;

    let lines = mix::lines(items);
    let mut kinds: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (_, line) in &lines {
        let text = String::from_utf8_lossy(line);
        let mut words = text.split(' ');
        let name = words.next().unwrap_or_default();
        let key = match name {
            "RDATA" | "POSITION" => format!("{name} {}", words.next().unwrap_or_default()),
            _ => name.to_owned(),
        };
        let entry = kinds.entry(key).or_default();
        entry.0 += 1;
        entry.1 += line.len();
    }
    let total: usize = lines.iter().map(|(_, l)| l.len()).sum();
    println!(
        "{} lines (with the preamble), mean {:.1} bytes, {} bytes in all",
        lines.len(),
        total as f64 / lines.len() as f64,
        total
    );
    for (kind, (n, bytes)) in kinds {
        println!(
            "{kind:<24} {n:>8} {:>5.1}%  mean {:>6.1} bytes",
            100.0 * n as f64 / lines.len() as f64,
            bytes as f64 / n as f64
        );
    }
    for (user_ip, line) in lines.iter().step_by(lines.len() / 12 + 1) {
        let channel = if *user_ip { "/USER_IP" } else { "" };
        println!("{channel:<8} {}", String::from_utf8_lossy(line));
    }
}

/// The bare loop: pipelined PUBLISHes on a std socket, replies counted by
/// a second thread.
fn run_bare(args: &Args, lines: Vec<(bool, bytes::Bytes)>) -> io::Result<()> {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    use bytes::BytesMut;
    use synapse_replication::resp::encode_publish;

    let mean = lines.iter().map(|(_, l)| l.len()).sum::<usize>() as f64 / lines.len() as f64;
    let channel = args.channel.as_bytes();
    let user_ip = format!("{}/USER_IP", args.channel).into_bytes();
    let mut stream = TcpStream::connect(("127.0.0.1", args.port))?;
    stream.set_nodelay(true)?;
    let expected = lines.len() + 1;
    let mut replies = stream.try_clone()?;
    let reader = std::thread::spawn(move || -> io::Result<(usize, usize)> {
        let mut buf = vec![0u8; 64 << 10];
        let (mut seen, mut errors) = (0, 0);
        // Replies are `:<n>\r\n` (or `-ERR ...\r\n`): count line ends.
        let mut at_line_start = true;
        while seen < expected {
            let n = replies.read(&mut buf)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("connection closed after {seen} replies"),
                ));
            }
            for &byte in &buf[..n] {
                if at_line_start && byte == b'-' {
                    errors += 1;
                }
                at_line_start = byte == b'\n';
                seen += usize::from(byte == b'\n');
            }
        }
        Ok((seen, errors))
    });
    let start = Instant::now();
    let cpu = process_cpu();
    let mut out = BytesMut::with_capacity(80 << 10);
    for (index, (is_user_ip, line)) in lines.iter().enumerate() {
        if let Some(rate) = args.rate {
            // Paced: what is due goes out now, then sleep until the next
            // line is due (a sleep that overshoots leaves several due,
            // written together).
            let due = start + Duration::from_secs_f64(index as f64 / rate);
            let now = Instant::now();
            if due > now {
                if !out.is_empty() {
                    stream.write_all(&out)?;
                    out.clear();
                }
                std::thread::sleep(due - now);
            }
        }
        let channel = if *is_user_ip { &user_ip[..] } else { channel };
        encode_publish(&mut out, channel, line);
        if out.len() >= 64 << 10 {
            stream.write_all(&out)?;
            out.clear();
        }
    }
    encode_publish(&mut out, channel, args.sentinel.as_bytes());
    stream.write_all(&out)?;
    let (_, errors) = reader
        .join()
        .map_err(|_| io::Error::other("the reply reader panicked"))??;
    let seconds = start.elapsed().as_secs_f64();
    let cpu = process_cpu() - cpu;
    if errors > 0 {
        return Err(io::Error::other(format!("{errors} PUBLISH errors")));
    }
    report("bare", lines.len(), seconds, cpu, mean)
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

fn report(via: &str, published: usize, seconds: f64, cpu: f64, mean: f64) -> io::Result<()> {
    use std::io::Write;

    let mut out = io::stdout().lock();
    writeln!(
        out,
        "flood via={via} published={published} seconds={seconds:.3} rate={:.0} \
         cpu_s={cpu:.3} cpu_us_per_msg={:.3} mean_len={mean:.1}",
        published as f64 / seconds,
        cpu * 1e6 / published as f64
    )?;
    out.flush()
}

/// The crate's writer: a `RedisClient` publishing through its session.
fn run_crate(args: &Args, items: Vec<mix::Item>) -> io::Result<()> {
    use std::time::Instant;

    use synapse_replication::config::RedisConfig;
    use synapse_replication::positions::{Follower, Writer};
    use synapse_replication::session::{RedisLink, RedisSession};
    use synapse_replication::transport::{RedisClient, SmolRuntime};
    use synapse_replication::wire::{Command, InstanceName, Token};

    // The mean line length, for the report (computed before the items are
    // consumed, outside the timed part).
    let mean = {
        let lines = mix::lines(&items);
        lines.iter().map(|(_, l)| l.len()).sum::<usize>() as f64 / lines.len() as f64
    };
    let sentinel = Command::decode(bytes::Bytes::from(args.sentinel.clone()))
        .map_err(io::Error::other)?
        .ok_or_else(|| io::Error::other("the sentinel is blank"))?;
    let config = RedisConfig::tcp("127.0.0.1", args.port);
    let mut options = config.session_config(args.channel.as_str());
    options.client_name = Some("flood".to_owned());
    let registry = mix::registry();
    let me = InstanceName::master();
    let mut session = RedisSession::new(
        options,
        Follower::new(me.clone(), registry.clone()),
        Writer::new(me, registry),
    );
    for stream in mix::streams() {
        session
            .advance(&stream, Token(mix::START))
            .map_err(io::Error::other)?;
    }
    let mut client = RedisClient::new(SmolRuntime, config, session);

    smol::block_on(async {
        let mut seen = false;
        drive(&mut client, &mut seen, &sentinel, |client, _| {
            client.is_ready()
        })
        .await?;
        let start = Instant::now();
        let cpu = process_cpu();
        for item in items {
            if client.session().unsent_bytes(RedisLink::Publisher) >= args.queue {
                drive(&mut client, &mut seen, &sentinel, |client, _| {
                    client.session().unsent_bytes(RedisLink::Publisher) < args.queue
                })
                .await?;
            }
            let session = client.session_mut();
            match item {
                mix::Item::Write {
                    stream,
                    token,
                    current,
                    rows,
                } => session
                    .write(&stream, current, rows.into_iter().map(|row| (token, row)))
                    .map_err(io::Error::other)?,
                mix::Item::Send(command) => session.send(command).map_err(io::Error::other)?,
            }
        }
        let published = client.session().counters().published.total() as usize;
        client
            .session_mut()
            .send(sentinel.clone())
            .map_err(io::Error::other)?;
        drive(&mut client, &mut seen, &sentinel, |_, seen| seen).await?;
        let seconds = start.elapsed().as_secs_f64();
        let cpu = process_cpu() - cpu;
        report("crate", published, seconds, cpu, mean)
    })
}

/// Drives `client` until `done` (given whether the sentinel's echo came
/// back); fails on a lost connection.
async fn drive(
    client: &mut synapse_replication::transport::RedisClient<
        synapse_replication::transport::SmolRuntime,
    >,
    seen: &mut bool,
    sentinel: &synapse_replication::wire::Command,
    done: impl Fn(
        &synapse_replication::transport::RedisClient<synapse_replication::transport::SmolRuntime>,
        bool,
    ) -> bool,
) -> io::Result<()> {
    use std::future::poll_fn;
    use std::task::Poll;

    use synapse_replication::session::RedisEvent;

    poll_fn(|cx| {
        loop {
            if done(client, *seen) {
                return Poll::Ready(Ok(()));
            }
            let event = match client.poll_next_event(cx) {
                Poll::Ready(Some(event)) => event,
                Poll::Ready(None) => return Poll::Ready(Err(io::Error::other("closed"))),
                Poll::Pending if done(client, *seen) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            };
            let error = match event {
                RedisEvent::Command(command) => {
                    *seen |= command == *sentinel;
                    continue;
                }
                RedisEvent::Disconnected { link, reason, .. } => {
                    format!("{link} lost: {reason}")
                }
                RedisEvent::ConnectFailed { link, error, .. } => {
                    format!("{link} cannot connect: {error}")
                }
                _ => continue,
            };
            return Poll::Ready(Err(io::Error::other(error)));
        }
    })
    .await
}
