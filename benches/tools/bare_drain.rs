//! The bare subscriber of `benches/e2e.sh`, for comparison only: a
//! hand-written reader that subscribes, counts pub/sub messages with a
//! minimal RESP parser and stops at the sentinel. No command decoding, no
//! follower: the floor any full receive path is measured against.
//!
//! ```text
//! cargo bench --bench bare_drain -- --port 6390 \
//!     [--channel e2e.example.com] [--sentinel "PING drain-sentinel"] [--read-buffer 262144] \
//!     [--validate] [--runtime std|smol|tokio]
//! redis-cli -p 6390 SUBSCRIBE e2e.example.com e2e.example.com/USER_IP \
//!     | cargo bench --bench bare_drain -- --redis-cli [--sentinel LINE]
//! ```
//!
//! It subscribes to `<channel>` and `<channel>/USER_IP` (where Synapse
//! publishes `USER_IP`) on 127.0.0.1, reads up to `--read-buffer` bytes at a
//! time with a std `TcpStream`, and counts every `message` frame until one
//! whose payload equals the sentinel exactly (not counted).
//!
//! With `--validate` it also checks the row of every `RDATA` with the
//! crate's row validator (`wire::json::validate`, which the receive path
//! runs on every row: a row that is not JSON is a gap to fetch, so this
//! work can never be skipped) and reports how many failed (`invalid=`):
//! the floor with the protocol's one unavoidable per-row cost on top.
//!
//! `--runtime smol` and `--runtime tokio` read the same way through that
//! runtime's socket and executor (`smol::block_on`, a current-thread
//! tokio runtime), as the crate's drain does: what a wake-up costs on
//! each runtime with nothing of the crate's in it (`benches/rates.sh`).
//!
//! With `--redis-cli` it counts `redis-cli SUBSCRIBE`'s output on stdin
//! instead (three lines per message: `message`, the channel, the payload,
//! as redis-cli prints them when stdout is not a terminal), so that
//! redis-cli is measured by the same clock.
//!
//! The count goes to stdout; a line of figures to stderr:
//!
//! ```text
//! bare_drain count=500010 seconds=0.731 rate=684000 cpu_s=0.071 cpu_us_per_msg=0.142 ended=sentinel
//! ```
//!
//! `cpu_s` is the process's CPU time from its start (with `--redis-cli`:
//! the counter's own, not redis-cli's); two more fields end the line:
//! `cpu_ns`, the same in ns, and `switches`, the process's context switches
//! (every thread), which `benches/rates.sh` subtracts its own samples from.
//!
//! `seconds` runs from the first message to the sentinel. Exit status 0 at
//! the sentinel, 1 if the connection (or redis-cli's output) ended first.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::Instant;

struct Args {
    port: Option<u16>,
    channel: String,
    sentinel: Vec<u8>,
    read_buffer: usize,
    redis_cli: bool,
    validate: bool,
    runtime: Runtime,
}

/// What reads the socket (`--runtime`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Runtime {
    /// A blocking std socket: the floor.
    Std,
    /// smol's `Async` socket on `smol::block_on`.
    Smol,
    /// A current-thread tokio runtime.
    Tokio,
}

const USAGE: &str = "usage: bare_drain (--port PORT | --redis-cli) [--channel NAME] \
                     [--sentinel LINE] [--read-buffer BYTES] [--validate] \
                     [--runtime std|smol|tokio]";

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        port: None,
        channel: "e2e.example.com".to_owned(),
        sentinel: b"PING drain-sentinel".to_vec(),
        read_buffer: 256 << 10,
        redis_cli: false,
        validate: false,
        runtime: Runtime::Std,
    };
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--port" => {
                parsed.port = Some(
                    value("--port")?
                        .parse()
                        .map_err(|e| format!("--port: {e}"))?,
                )
            }
            "--channel" => parsed.channel = value("--channel")?,
            "--sentinel" => parsed.sentinel = value("--sentinel")?.into_bytes(),
            "--read-buffer" => {
                parsed.read_buffer = value("--read-buffer")?
                    .parse()
                    .map_err(|e| format!("--read-buffer: {e}"))?
            }
            "--redis-cli" => parsed.redis_cli = true,
            "--validate" => parsed.validate = true,
            "--runtime" => {
                parsed.runtime = match value("--runtime")?.as_str() {
                    "std" => Runtime::Std,
                    "smol" => Runtime::Smol,
                    "tokio" => Runtime::Tokio,
                    other => return Err(format!("--runtime: std, smol or tokio, not {other:?}")),
                }
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if parsed.port.is_none() != parsed.redis_cli {
        return Err("give --port or --redis-cli".to_owned());
    }
    Ok(parsed)
}

/// Counts messages and times them.
struct Counter<'a> {
    sentinel: &'a [u8],
    count: u64,
    first: Option<Instant>,
    done: bool,
    /// With `--validate`: rows checked, and how many were not JSON.
    validate: bool,
    invalid: u64,
}

impl Counter<'_> {
    /// One message; true at the sentinel.
    #[inline]
    fn message(&mut self, payload: &[u8]) -> bool {
        if self.first.is_none() {
            self.first = Some(Instant::now());
        }
        if payload.len() == self.sentinel.len() && payload == self.sentinel {
            self.done = true;
            return true;
        }
        self.count += 1;
        if self.validate {
            self.check_row(payload);
        }
        false
    }

    /// Validates the row of an `RDATA` (`RDATA <stream> <instance>
    /// <token> <row>`), as every row is on the crate's receive path.
    #[inline(never)]
    fn check_row(&mut self, payload: &[u8]) {
        let Some(fields) = payload.strip_prefix(b"RDATA ") else {
            return;
        };
        let row = fields.splitn(4, |&byte| byte == b' ').nth(3);
        if row.is_none_or(|row| synapse_replication::wire::json::validate(row).is_err()) {
            self.invalid += 1;
        }
    }

    fn finish(&self, name: &str) -> ExitCode {
        let seconds = self
            .first
            .map_or(0.0, |first| first.elapsed().as_secs_f64());
        let rate = if seconds > 0.0 {
            self.count as f64 / seconds
        } else {
            0.0
        };
        let ended = if self.done { "sentinel" } else { "lost" };
        let invalid = if self.validate {
            format!(" invalid={}", self.invalid)
        } else {
            String::new()
        };
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "{}", self.count);
        let _ = out.flush();
        let cpu = process_cpu();
        eprintln!(
            "{name} count={} seconds={seconds:.3} rate={rate:.0} cpu_s={cpu:.3} \
             cpu_us_per_msg={:.3} ended={ended}{invalid} cpu_ns={:.0} switches={}",
            self.count,
            cpu * 1e6 / self.count.max(1) as f64,
            cpu * 1e9,
            process_switches()
        );
        if self.done {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    // `cargo bench` adds `--bench`. Without other arguments (a plain
    // `cargo bench` runs every bench target) there is nothing to measure.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.is_empty() {
        eprintln!("bare_drain: run by benches/e2e.sh; alone: {USAGE}");
        return ExitCode::SUCCESS;
    }
    let args = match parse_args(args.into_iter()) {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("bare_drain: {message}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut counter = Counter {
        sentinel: &args.sentinel,
        count: 0,
        first: None,
        done: false,
        validate: args.validate,
        invalid: 0,
    };
    let result = match args.port {
        Some(port) => match args.runtime {
            Runtime::Std => subscribe(&args, port, &mut counter),
            Runtime::Smol => subscribe_smol(&args, port, &mut counter),
            Runtime::Tokio => subscribe_tokio(&args, port, &mut counter),
        },
        None => redis_cli(&args, &mut counter),
    };
    if let Err(error) = result {
        eprintln!("bare_drain: {error}");
    }
    counter.finish(if args.redis_cli {
        "redis-cli"
    } else {
        "bare_drain"
    })
}

/// A RESP bulk string `$<len>\r\n<bytes>\r\n` or integer `:<n>\r\n` at
/// `at`: the bytes (empty for an integer) and where the next value starts;
/// `None` if incomplete.
#[inline]
fn value(buf: &[u8], at: usize) -> io::Result<Option<(&[u8], usize)>> {
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some(cr) = buf[at..].iter().position(|b| *b == b'\r') else {
        return Ok(None);
    };
    let header = &buf[at + 1..at + cr];
    let after = at + cr + 2;
    match kind {
        b':' => Ok((after <= buf.len()).then_some((&buf[at..at], after))),
        b'$' => {
            let len = header
                .iter()
                .try_fold(0usize, |n, b| {
                    b.is_ascii_digit().then(|| n * 10 + usize::from(b - b'0'))
                })
                .ok_or_else(|| io::Error::other("bad bulk length"))?;
            let end = after + len;
            Ok((end + 2 <= buf.len()).then(|| (&buf[after..end], end + 2)))
        }
        other => Err(io::Error::other(format!(
            "unexpected RESP type {:?}",
            other as char
        ))),
    }
}

/// A `*3` push: its kind (`message`, `subscribe`), third element (the
/// payload of a message) and length.
type Push<'a> = (&'a [u8], &'a [u8], usize);

/// One `*3` push at the front of `buf`; `None` if incomplete.
#[inline]
fn frame(buf: &[u8]) -> io::Result<Option<Push<'_>>> {
    if buf.len() < 4 {
        return Ok(None);
    }
    if &buf[..4] != b"*3\r\n" {
        return Err(io::Error::other("expected a pub/sub push (*3)"));
    }
    let Some((kind, at)) = value(buf, 4)? else {
        return Ok(None);
    };
    let Some((_channel, at)) = value(buf, at)? else {
        return Ok(None);
    };
    let Some((payload, end)) = value(buf, at)? else {
        return Ok(None);
    };
    Ok(Some((kind, payload, end)))
}

/// The subscription request: `CLIENT SETNAME` (so that `CLIENT LIST`, and
/// Redis' log, tell this reader apart from the crate's drain and from a
/// validating one beside it) and `SUBSCRIBE` to both channels.
fn subscribe_command(args: &Args) -> io::Result<Vec<u8>> {
    let user_ip = format!("{}/USER_IP", args.channel);
    let name = match (args.validate, args.runtime) {
        (false, Runtime::Std) => "bare_drain",
        (true, Runtime::Std) => "bare_json",
        (false, Runtime::Smol) => "bare_smol",
        (true, Runtime::Smol) => "bare_json_smol",
        (false, Runtime::Tokio) => "bare_tokio",
        (true, Runtime::Tokio) => "bare_json_tokio",
    };
    let mut command = b"*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n".to_vec();
    write!(command, "${}\r\n{name}\r\n", name.len())?;
    write!(command, "*3\r\n$9\r\nSUBSCRIBE\r\n")?;
    for channel in [args.channel.as_str(), user_ip.as_str()] {
        write!(command, "${}\r\n{channel}\r\n", channel.len())?;
    }
    Ok(command)
}

/// What the reader has read and not yet counted: the same for every
/// runtime, so that they differ only in how the bytes arrive.
struct Pushes {
    buf: Vec<u8>,
    filled: usize,
    named: bool,
}

impl Pushes {
    fn new(args: &Args) -> Pushes {
        Pushes {
            buf: vec![0u8; args.read_buffer.max(4096)],
            filled: 0,
            named: false,
        }
    }

    /// Where the next read goes.
    fn space(&mut self) -> &mut [u8] {
        if self.filled == self.buf.len() {
            // One frame larger than the buffer: grow it.
            self.buf.resize(self.buf.len() * 2, 0);
        }
        &mut self.buf[self.filled..]
    }

    /// Counts the messages of `n` bytes just read into `space()`; true at
    /// the sentinel.
    fn read(&mut self, n: usize, counter: &mut Counter<'_>) -> io::Result<bool> {
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        self.filled += n;
        let mut at = 0;
        if !self.named {
            if self.filled < 5 {
                return Ok(false);
            }
            if &self.buf[..5] != b"+OK\r\n" {
                return Err(io::Error::other("CLIENT SETNAME refused"));
            }
            self.named = true;
            at = 5;
        }
        while let Some((kind, payload, end)) = frame(&self.buf[at..self.filled])? {
            if kind == b"message" && counter.message(payload) {
                return Ok(true);
            }
            at += end;
        }
        self.buf.copy_within(at..self.filled, 0);
        self.filled -= at;
        Ok(false)
    }
}

/// The floor: a blocking std socket, one `read` system call per wake-up.
fn subscribe(args: &Args, port: u16, counter: &mut Counter<'_>) -> io::Result<()> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_nodelay(true)?;
    stream.write_all(&subscribe_command(args)?)?;
    let mut pushes = Pushes::new(args);
    loop {
        let n = stream.read(pushes.space())?;
        if pushes.read(n, counter)? {
            return Ok(());
        }
    }
}

/// The same reader on smol: an `Async<TcpStream>` read on `block_on`, as
/// the crate's drain runs on smol (its reactor on the `async-io` thread
/// whenever `block_on` is not polling it itself).
fn subscribe_smol(args: &Args, port: u16, counter: &mut Counter<'_>) -> io::Result<()> {
    use smol::io::{AsyncReadExt, AsyncWriteExt};

    smol::block_on(async {
        let mut stream = smol::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        stream.write_all(&subscribe_command(args)?).await?;
        let mut pushes = Pushes::new(args);
        loop {
            let n = stream.read(pushes.space()).await?;
            if pushes.read(n, counter)? {
                return Ok(());
            }
        }
    })
}

/// The same reader on tokio: a `tokio::net::TcpStream` on a current-thread
/// runtime, as the crate's drain runs on tokio.
fn subscribe_tokio(args: &Args, port: u16, counter: &mut Counter<'_>) -> io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        stream.write_all(&subscribe_command(args)?).await?;
        let mut pushes = Pushes::new(args);
        loop {
            let n = stream.read(pushes.space()).await?;
            if pushes.read(n, counter)? {
                return Ok(());
            }
        }
    })
}

fn redis_cli(args: &Args, counter: &mut Counter<'_>) -> io::Result<()> {
    let mut stdin = io::stdin().lock();
    let mut buf = vec![0u8; args.read_buffer.max(4096)];
    let mut filled = 0;
    // The line's place in its triple, and whether the triple is a message.
    let mut index = 0;
    let mut message = false;
    loop {
        if filled == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let n = stdin.read(&mut buf[filled..])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "redis-cli's output ended",
            ));
        }
        filled += n;
        let mut at = 0;
        while let Some(newline) = buf[at..filled].iter().position(|b| *b == b'\n') {
            let line = &buf[at..at + newline];
            at += newline + 1;
            match index {
                0 => message = line == b"message",
                2 if message && counter.message(line) => return Ok(()),
                _ => {}
            }
            index = (index + 1) % 3;
        }
        buf.copy_within(at..filled, 0);
        filled -= at;
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
