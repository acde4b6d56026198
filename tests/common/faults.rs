//! Tools for the fault tests (`tests/faults.rs`, `tests/partitions.rs`,
//! `tests/soak.rs`): a raw Redis connection (an admin that outlives a
//! password change, a publisher that is not one of ours), a `tracing`
//! subscriber that keeps the warnings logged on the test's thread, a small
//! seeded random generator, and the process's resident memory.

use std::fmt;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use synapse_replication::resp::{Frame, RespDecoder, encode_command};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::{DefaultGuard, Interest};
use tracing::{Event, Level, Metadata, Subscriber};

/// How long a raw command may wait for its reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// A plain RESP2 connection to Redis that is none of the crate's clients.
pub struct RawRedis {
    stream: TcpStream,
    decoder: RespDecoder,
    input: BytesMut,
    out: BytesMut,
    /// Replies owed for commands sent.
    owed: usize,
}

impl RawRedis {
    /// Connects to `127.0.0.1:port`, with `AUTH password` if given
    /// (panicking if refused).
    pub fn connect(port: u16, password: Option<&str>) -> RawRedis {
        let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .unwrap_or_else(|error| panic!("connecting to Redis on {port}: {error}"));
        stream
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .expect("a read timeout");
        let mut raw = RawRedis {
            stream,
            decoder: RespDecoder::new(),
            input: BytesMut::new(),
            out: BytesMut::new(),
            owed: 0,
        };
        if let Some(password) = password {
            let reply = raw.command(&["AUTH", password]);
            assert_eq!(reply, Frame::SimpleString("OK".into()), "AUTH");
        }
        raw
    }

    /// Sends one command and returns its reply.
    pub fn command(&mut self, args: &[&str]) -> Frame {
        let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
        self.queue(&args);
        self.flush();
        self.replies().pop().expect("one reply for one command")
    }

    /// Queues a command, sent by the next [`RawRedis::flush`].
    pub fn queue(&mut self, args: &[&[u8]]) {
        encode_command(&mut self.out, args);
        self.owed += 1;
    }

    /// Queues `PUBLISH channel message`.
    pub fn queue_publish(&mut self, channel: &str, message: &[u8]) {
        self.queue(&[b"PUBLISH", channel.as_bytes(), message]);
    }

    /// Writes what is queued.
    pub fn flush(&mut self) {
        self.stream.write_all(&self.out).expect("writing to Redis");
        self.out.clear();
    }

    /// Reads the replies owed for every command sent.
    pub fn replies(&mut self) -> Vec<Frame> {
        let mut replies = Vec::with_capacity(self.owed);
        while replies.len() < self.owed {
            match self.decoder.decode(&mut self.input) {
                Ok(Some(frame)) => {
                    replies.push(frame);
                    continue;
                }
                Ok(None) => {}
                Err(error) => panic!("Redis sent something that is not RESP: {error}"),
            }
            let mut chunk = [0; 16 << 10];
            let n = self.stream.read(&mut chunk).expect("reading from Redis");
            assert_ne!(n, 0, "Redis closed the raw connection");
            self.input.extend_from_slice(&chunk[..n]);
        }
        self.owed = 0;
        replies
    }
}

/// The warnings (and errors) logged through `tracing` on the thread that
/// installed it, as `message key=value ...` lines.
#[derive(Clone, Default)]
pub struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    /// Collects the warnings of this thread until the guard is dropped.
    pub fn install() -> (Warnings, DefaultGuard) {
        let warnings = Warnings::default();
        let guard = tracing::subscriber::set_default(warnings.clone());
        (warnings, guard)
    }

    /// Every warning so far.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().expect("warnings").clone()
    }

    /// The warnings that contain `text`.
    pub fn containing(&self, text: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|line| line.contains(text))
            .collect()
    }
}

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        use std::fmt::Write as _;
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl Subscriber for Warnings {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        // Other threads may have no subscriber: ask every time.
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        // WARN and ERROR (less verbose levels compare lower).
        *metadata.level() <= Level::WARN
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut line = Line(String::new());
        event.record(&mut line);
        self.0.lock().expect("warnings").push(line.0);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// xorshift64*: reproducible random choices from a seed (printed by the
/// tests, and taken from `FAULT_SEED` when set).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `FAULT_SEED`, or from the clock; prints the seed.
    pub fn from_env(label: &str) -> Rng {
        let seed = std::env::var("FAULT_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |elapsed| elapsed.as_nanos() as u64)
            });
        eprintln!("{label}: FAULT_SEED={seed}");
        Rng::new(seed)
    }

    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..bound` (0 if `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            0
        } else {
            self.next_u64() % bound
        }
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// The process's resident memory (`VmRSS` of /proc/self/status), in KiB.
pub fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}
