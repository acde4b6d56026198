//! Publishes a burst of replication traffic to a Redis channel, as fast as
//! Redis takes it, then a sentinel line; prints the rate. The publisher of
//! `benches/e2e.sh` (see `drain` and `bare_drain`, its subscribers).
//!
//! ```text
//! cargo run --release --features runtime-smol --example flood -- \
//!     --port 6390 [--channel e2e.example.com] [--count 500000] \
//!     [--sentinel "PING drain-sentinel"] [--via bare|crate] [--seed 42] [--stats]
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

/// The mix: deterministic, from a seed.
#[allow(dead_code)]
pub mod mix {
    use std::sync::Arc;
    use std::time::Instant;

    use bytes::{Bytes, BytesMut};
    use synapse_replication::positions::Writer;
    use synapse_replication::resp::Frame;
    use synapse_replication::wire::{
        Command, FederationAck, InstanceName, LockReleased, RawRow, StreamName, Token, UserIp,
        UserSync,
    };
    use synapse_replication::writers::StreamWriters;

    /// The token every stream starts at.
    pub const START: i64 = 1_000_000;

    /// The streams of the mix, written by `master`.
    pub fn streams() -> Vec<StreamName> {
        [
            "events",
            "caches",
            "receipts",
            "typing",
            "presence",
            "to_device",
            "device_lists",
            "account_data",
            "push_rules",
        ]
        .into_iter()
        .map(StreamName::from)
        .collect()
    }

    /// One thing the deployment does.
    #[derive(Clone, Debug)]
    pub enum Item {
        /// Rows of one token (several: a batch), and the stream's current
        /// token (above the rows' when other rows were not ours to send:
        /// a `POSITION` follows).
        Write {
            /// The stream.
            stream: StreamName,
            /// The rows' token.
            token: Token,
            /// The stream's token after the write.
            current: Token,
            /// The rows.
            rows: Vec<RawRow>,
        },
        /// A command for the application.
        Send(Command),
    }

    impl Item {
        /// The messages this item publishes.
        pub fn messages(&self) -> usize {
            match self {
                Item::Write {
                    token,
                    current,
                    rows,
                    ..
                } => rows.len() + usize::from(current > token),
                Item::Send(_) => 1,
            }
        }
    }

    /// A deterministic pseudo-random sequence.
    pub struct Lcg(pub u64);

    impl Lcg {
        pub fn next_u64(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }

        pub fn below(&mut self, n: u64) -> u64 {
            self.next_u64() % n
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[self.below(items.len() as u64) as usize]
        }

        /// `len` characters of URL-safe base64, as Synapse's event ids.
        fn b64(&mut self, len: usize) -> String {
            const ALPHABET: &[u8] =
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
            (0..len)
                .map(|_| ALPHABET[self.below(64) as usize] as char)
                .collect()
        }
    }

    const USERS: &[&str] = &[
        "@alice:example.com",
        "@bob:example.com",
        "@carol.smith:example.com",
        "@dave:matrix.org",
        "@erin_1984:example.com",
        "@frank:remote.example.net",
        "@grace:example.com",
        "@heidi-bot:example.com",
    ];
    const ROOMS: &[&str] = &[
        "!OGEhHVWSdvArJzumhm:matrix.org",
        "!cURbafjkfsMDVwdRDQ:example.com",
        "!kKLfCWPzZRkMhBJsvp:example.com",
        "!YTvKGNlinIzlPMQhIx:remote.example.net",
        "!hsZBSpnMrcmzwSDVPA:example.com",
    ];
    const MSGTYPES: &[&str] = &[
        "m.room.message",
        "m.room.message",
        "m.reaction",
        "m.room.encrypted",
    ];
    const CACHES: &[&str] = &[
        "get_user_by_id",
        "_get_state_group_for_events",
        "get_e2e_unused_fallback_key_types",
        "get_room_summary",
        "get_users_in_room",
    ];
    const STATUS: &[&str] = &[
        "at lunch \\ud83c\\udf54",
        "In a meeting until 3pm",
        "On holiday \\u2014 back on Monday",
    ];
    const AGENTS: &[&str] = &[
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Element/1.11.50 Chrome/120.0 Electron/28.0 Safari/537.36",
        "Element/1.11.50 (iPhone; iOS 17.1; Scale/3.00)",
        "curl/8.4.0",
    ];

    fn row(text: String) -> RawRow {
        RawRow::new(Bytes::from(text)).expect("the mix's rows are JSON")
    }

    fn event_id(rng: &mut Lcg) -> String {
        format!("${}", rng.b64(43))
    }

    /// `count` messages of the mix (exactly), as items.
    pub fn items(count: usize, seed: u64) -> Vec<Item> {
        let mut rng = Lcg(seed);
        let mut tokens: Vec<(StreamName, i64)> =
            streams().into_iter().map(|s| (s, START)).collect();
        let mut items = Vec::new();
        let mut left = count;
        let ts = 1_732_900_000_000_i64;
        while left > 0 {
            let roll = rng.below(1000);
            let now_ms = ts + (count - left) as i64;
            let item = match roll {
                // Application commands: one message each.
                0..40 => Item::Send(Command::UserSync(UserSync {
                    instance_id: InstanceName::from(rng.pick(&["synchrotron1", "synchrotron2"])),
                    user_id: rng.pick(USERS).into(),
                    device_id: Some(rng.b64(10).to_uppercase().into()),
                    is_syncing: rng.below(2) == 0,
                    last_sync_ms: now_ms,
                })),
                40..75 => Item::Send(Command::UserIp(Box::new(UserIp {
                    user_id: rng.pick(USERS).into(),
                    access_token: format!("syt_{}_{}", rng.b64(8), rng.b64(20)).into(),
                    ip: format!("203.0.113.{}", rng.below(250)).into(),
                    user_agent: rng.pick(AGENTS).into(),
                    device_id: Some(rng.b64(10).to_uppercase().into()),
                    last_seen: now_ms,
                }))),
                75..85 => Item::Send(Command::FederationAck(FederationAck {
                    instance: InstanceName::from("federation_sender1"),
                    token: Token(START + (count - left) as i64),
                })),
                85..90 => Item::Send(Command::RemoteServerUp(
                    rng.pick(&[
                        "matrix.org",
                        "remote.example.net:8448",
                        "xn--e1afmkfd.xn--p1ai",
                    ])
                    .into(),
                )),
                90..95 => Item::Send(Command::LockReleased(LockReleased {
                    instance: InstanceName::from("event_persister1"),
                    lock_name: "new_event_during_purge_lock".into(),
                    lock_key: rng.pick(ROOMS).into(),
                })),
                // Stream writes.
                _ => {
                    let (stream, rows) = stream_rows(&mut rng, roll, now_ms);
                    // A batch must fit what is left (plus its POSITION).
                    let rows = if rows.len() + 1 > left {
                        rows.into_iter().take(1).collect()
                    } else {
                        rows
                    };
                    let entry = tokens
                        .iter_mut()
                        .find(|(s, _)| *s == stream)
                        .expect("a stream of the mix");
                    let token = entry.1 + 1;
                    // Now and then other rows took tokens: POSITION follows.
                    let current = if left > rows.len() && rng.below(20) == 0 {
                        token + 1 + rng.below(3) as i64
                    } else {
                        token
                    };
                    entry.1 = current;
                    Item::Write {
                        stream,
                        token: Token(token),
                        current: Token(current),
                        rows,
                    }
                }
            };
            left -= item.messages();
            items.push(item);
        }
        items
    }

    fn stream_rows(rng: &mut Lcg, roll: u64, now_ms: i64) -> (StreamName, Vec<RawRow>) {
        let room = rng.pick(ROOMS);
        let user = rng.pick(USERS);
        match roll {
            95..515 => {
                let mut rows = Vec::new();
                // One event in ten is a state event: its state row first.
                if rng.below(10) == 0 {
                    let id = event_id(rng);
                    rows.push(row(format!(
                        r#"["state",["{room}","m.room.member","{user}","{id}"]]"#
                    )));
                    rows.push(row(format!(
                        r#"["ev",["{id}","{room}","m.room.member","{user}",null,null,"join",false,false]]"#
                    )));
                } else {
                    let id = event_id(rng);
                    let kind = rng.pick(MSGTYPES);
                    let text = match rng.below(8) {
                        0 => format!(
                            r#"["ev",["{id}","{room}","m.room.redaction",null,"{}",null,null,false,false]]"#,
                            event_id(rng)
                        ),
                        1 => format!(
                            r#"["ev",["{id}","{room}","{kind}",null,null,"{}",null,false,false]]"#,
                            event_id(rng)
                        ),
                        _ => format!(
                            r#"["ev",["{id}","{room}","{kind}",null,null,null,null,false,false]]"#
                        ),
                    };
                    rows.push(row(text));
                }
                (StreamName::Events, rows)
            }
            515..700 => {
                let cache = rng.pick(CACHES);
                let text = match rng.below(4) {
                    0 => format!(r#"["cs_cache_fake",["{room}","{user}"],{now_ms}]"#),
                    1 => format!(r#"["{cache}",["{room}"],{now_ms}]"#),
                    _ => format!(r#"["{cache}",["{user}"],{now_ms}]"#),
                };
                // Cache invalidations often come several at once.
                let n = if rng.below(6) == 0 { 2 } else { 1 };
                (StreamName::Caches, vec![row(text); n])
            }
            700..800 => {
                let id = event_id(rng);
                let text = if rng.below(4) == 0 {
                    format!(
                        r#"["{room}","m.read.private","{user}","{id}","main",{{"ts":{now_ms},"thread_id":"main"}}]"#
                    )
                } else {
                    format!(r#"["{room}","m.read","{user}",["{id}"],null,{{"ts":{now_ms}}}]"#)
                };
                (StreamName::Receipts, vec![row(text)])
            }
            800..850 => {
                let other = rng.pick(USERS);
                (
                    StreamName::Typing,
                    vec![row(format!(r#"["{room}",["{user}","{other}"]]"#))],
                )
            }
            850..920 => {
                let status = if rng.below(3) == 0 {
                    format!("\"{}\"", rng.pick(STATUS))
                } else {
                    "null".to_owned()
                };
                let state = rng.pick(&["online", "unavailable", "offline"]);
                (
                    StreamName::Presence,
                    vec![row(format!(
                        r#"["{user}","{state}",{now_ms},{},{},{status},true]"#,
                        now_ms - 1000,
                        now_ms - 5,
                    ))],
                )
            }
            920..950 => (StreamName::ToDevice, vec![row(format!(r#"["{user}"]"#))]),
            950..975 => (
                StreamName::DeviceLists,
                vec![row(format!(r#"["{user}",false,true]"#))],
            ),
            975..990 => (
                StreamName::AccountData,
                vec![row(format!(r#"["{user}","{room}","m.tag"]"#))],
            ),
            _ => (StreamName::PushRules, vec![row(format!(r#"["{user}"]"#))]),
        }
    }

    /// The registry of the mix: `master` writes every stream; everyone
    /// writes `caches` (Redis).
    pub fn registry() -> Arc<StreamWriters> {
        Arc::new(StreamWriters::default().with_redis(true))
    }

    /// What a crate writer named `master` publishes for `items`, as
    /// (is `USER_IP`, line): `REPLICATE`, the announcement of every stream,
    /// then the items. Built with an offline `Writer`.
    pub fn lines(items: &[Item]) -> Vec<(bool, Bytes)> {
        let mut writer = Writer::new(InstanceName::master(), registry());
        for stream in streams() {
            writer
                .advance(&stream, Token(START))
                .expect("master writes the mix's streams");
        }
        // Every line in one buffer (then sliced): no allocation per line.
        let mut all = BytesMut::new();
        let mut spans = Vec::new();
        let mut add = |command: &Command| {
            let start = all.len();
            command.encode(&mut all).expect("the mix's commands encode");
            spans.push((matches!(command, Command::UserIp(_)), start, all.len()));
        };
        add(&Command::Replicate);
        writer.connected(Instant::now());
        for item in std::iter::once(None).chain(items.iter().map(Some)) {
            match item {
                Some(Item::Write {
                    stream,
                    token,
                    current,
                    rows,
                }) => writer
                    .write(stream, *current, rows.iter().map(|r| (*token, r.clone())))
                    .expect("the mix's writes are consistent"),
                Some(Item::Send(command)) => add(command),
                // The announcement, first.
                None => {}
            }
            while let Some(command) = writer.poll_command() {
                add(&command);
            }
        }
        let all = all.freeze();
        spans
            .into_iter()
            .map(|(user_ip, start, end)| (user_ip, all.slice(start..end)))
            .collect()
    }

    /// `lines` as Redis delivers them to a RESP2 subscriber of `channel`
    /// and `channel/USER_IP`: one pub/sub `message` each.
    pub fn messages(lines: &[(bool, Bytes)], channel: &str) -> Vec<u8> {
        let user_ip = format!("{channel}/USER_IP");
        let mut buf = BytesMut::new();
        for (is_user_ip, line) in lines {
            let channel = if *is_user_ip { &user_ip } else { channel };
            Frame::Array(vec![
                Frame::bulk("message"),
                Frame::bulk(channel.to_owned()),
                Frame::bulk(line.clone()),
            ])
            .encode(&mut buf)
            .expect("messages encode");
        }
        buf.to_vec()
    }

    pub fn encode(command: &Command) -> Bytes {
        let mut out = BytesMut::new();
        command.encode(&mut out).expect("the mix's commands encode");
        out.freeze()
    }
}

#[derive(Debug)]
#[cfg_attr(not(feature = "runtime-smol"), allow(dead_code))]
struct Args {
    port: u16,
    channel: String,
    count: usize,
    sentinel: String,
    crate_path: bool,
    seed: u64,
    stats: bool,
    queue: usize,
}

const USAGE: &str = "usage: flood --port PORT [--channel NAME] [--count N] [--sentinel LINE] \
                     [--via bare|crate] [--queue BYTES] [--seed N] [--stats]";

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
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    match port {
        Some(port) => parsed.port = port,
        None if parsed.stats => {}
        None => return Err("--port is required".to_owned()),
    }
    Ok(parsed)
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
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
    use std::time::Instant;

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
    for (is_user_ip, line) in &lines {
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

#[cfg(not(feature = "runtime-smol"))]
fn run_crate(_args: &Args, _items: Vec<mix::Item>) -> io::Result<()> {
    Err(io::Error::other(
        "built without smol: run with `--features runtime-smol`",
    ))
}

/// The crate's writer: a `RedisClient` publishing through its session.
#[cfg(feature = "runtime-smol")]
fn run_crate(args: &Args, items: Vec<mix::Item>) -> io::Result<()> {
    use std::time::Instant;

    use synapse_replication::positions::{Follower, Writer};
    use synapse_replication::session::{RedisLink, RedisSession};
    use synapse_replication::transport::{RedisClient, RedisConfig, SmolRuntime};
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
#[cfg(feature = "runtime-smol")]
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
    use synapse_replication::transport::RedisClientEvent;

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
                RedisClientEvent::Command(command) => {
                    *seen |= command == *sentinel;
                    continue;
                }
                RedisClientEvent::Session(RedisEvent::Closing { link, error }) => {
                    format!("{link} closing: {error}")
                }
                RedisClientEvent::Disconnected { link, reason, .. } => {
                    format!("{link} lost: {reason}")
                }
                RedisClientEvent::ConnectFailed { link, error, .. } => {
                    format!("{link} cannot connect: {error}")
                }
                _ => continue,
            };
            return Poll::Ready(Err(io::Error::other(error)));
        }
    })
    .await
}
