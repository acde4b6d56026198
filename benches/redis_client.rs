//! The whole client path, runtime included, without redis-server's noise:
//! a `RedisClient` (smol, then tokio) against a loopback server thread that
//! answers the handshake as Redis does and then writes what a subscriber's
//! socket carries during a burst, as fast as the client reads it.
//!
//! `cargo bench --bench redis_client`
//!
//! `REDIS_CLIENT_RUNS` (5) sets the runs per runtime and
//! `REDIS_CLIENT_RUNTIMES` (`smol,tokio`) which runtimes run: one smol run
//! (`REDIS_CLIENT_RUNS=1 REDIS_CLIENT_RUNTIMES=smol`) is what to count
//! instructions of under callgrind, a tenth of the whole.
//!
//! The input is the mix of `benches/redis_session.rs` (500,000 messages of
//! `benches/tools/flood.rs`'s mix, 184 bytes of RESP each), then a sentinel
//! `PING`. Each run is a fresh client and connection; the figure is the
//! client thread's CPU time from the session's `Ready` to the sentinel
//! (socket reads, RESP, command decoding, the follower, event delivery,
//! the runtime's reactor), per message: best and median of 5 runs, with
//! the wall-clock rate of the median run. Compare it with the `session`
//! line of `redis_session` (the same work without socket or runtime).
//!
//! The server is not Redis: it stands in only so that the figure does not
//! move with redis-server's and a publisher's share of the cores (see
//! `benches/e2e.sh` for the real thing).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};
use synapse_replication::session::RedisEvent;

use bytes::{Bytes, BytesMut};
use synapse_replication::config::{RedisConfig, StreamWriters};
use synapse_replication::positions::{Follower, Writer};
use synapse_replication::resp::{Frame, RespDecoder};
use synapse_replication::session::RedisSession;
use synapse_replication::transport::{RedisClient, Runtime, SmolRuntime, TokioRuntime};
use synapse_replication::wire::{Command, InstanceName};

/// The traffic `benches/e2e.sh` publishes (`tools/flood.rs`).
#[path = "tools/mix.rs"]
mod mix;

/// Messages of the mix (its 10-line preamble comes on top).
const MESSAGES: usize = 500_000;
const CHANNEL: &str = "e2e.example.com";
const SENTINEL: &str = "PING redis-client-bench";
const RUNS: usize = 5;

fn main() {
    let runs: usize = std::env::var("REDIS_CLIENT_RUNS")
        .ok()
        .and_then(|runs| runs.parse().ok())
        .filter(|&runs| runs > 0)
        .unwrap_or(RUNS);
    let runtimes = std::env::var("REDIS_CLIENT_RUNTIMES").unwrap_or_else(|_| "smol,tokio".into());
    let wire = Arc::new(messages());
    let port = serve(wire.clone());
    let messages = MESSAGES + 10;
    println!(
        "input: {messages} messages, {} bytes of RESP, from a loopback server thread",
        wire.len()
    );
    for runtime in runtimes
        .split(',')
        .filter(|r| ["smol", "tokio"].contains(r))
    {
        let count = runs;
        let mut runs: Vec<(Duration, Duration)> = (0..count).map(|_| run(runtime, port)).collect();
        runs.sort();
        let (best, _) = runs[0];
        let (median, wall) = runs[count / 2];
        let per_message = |cpu: Duration| cpu.as_nanos() as f64 / messages as f64;
        println!(
            "{runtime:<6} {:>6.1} CPU ns/message (best of {count}), median {:>6.1}; {:>5.2} M messages/s",
            per_message(best),
            per_message(median),
            messages as f64 / wall.as_secs_f64() / 1e6
        );
    }
}

/// What Redis writes to the subscriber once both channels are confirmed:
/// the mix as `message`s, then the sentinel.
fn messages() -> Vec<u8> {
    let mut lines = mix::lines(&mix::items(MESSAGES, 42));
    lines.push((false, Bytes::from_static(SENTINEL.as_bytes())));
    mix::messages(&lines, CHANNEL)
}

/// A loopback server: each connection gets Redis' answers to what it
/// sends, and a connection whose subscriptions are all confirmed gets
/// `wire`. Returns its port.
fn serve(wire: Arc<Vec<u8>>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { break };
            let wire = wire.clone();
            std::thread::spawn(move || answer(stream, &wire));
        }
    });
    port
}

fn answer(mut stream: TcpStream, wire: &[u8]) {
    let mut decoder = RespDecoder::new();
    let mut input = BytesMut::new();
    let mut buf = vec![0; 64 << 10];
    let mut subscribed = 0;
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        input.extend_from_slice(&buf[..n]);
        let mut out = BytesMut::new();
        let mut send_wire = false;
        while let Ok(Some(Frame::Array(args))) = decoder.decode(&mut input) {
            let args: Vec<Bytes> = args
                .into_iter()
                .filter_map(|arg| match arg {
                    Frame::BulkString(bytes) => Some(bytes),
                    _ => None,
                })
                .collect();
            let name = args.first().map(|name| name.to_ascii_uppercase());
            let reply = match name.as_deref() {
                Some(b"SUBSCRIBE") => {
                    for channel in &args[1..] {
                        subscribed += 1;
                        Frame::Array(vec![
                            Frame::bulk("subscribe"),
                            Frame::BulkString(channel.clone()),
                            Frame::Integer(subscribed),
                        ])
                        .encode(&mut out)
                        .expect("encodes");
                    }
                    send_wire = subscribed == 2;
                    continue;
                }
                Some(b"PUBLISH") => Frame::Integer(1),
                Some(b"PING") => Frame::SimpleString(Bytes::from_static(b"PONG")),
                _ => Frame::SimpleString(Bytes::from_static(b"OK")),
            };
            reply.encode(&mut out).expect("encodes");
        }
        if stream.write_all(&out).is_err() {
            return;
        }
        if send_wire && stream.write_all(wire).is_err() {
            return;
        }
    }
}

/// One client on `runtime` until the sentinel: its thread's CPU time and
/// the wall time from `Ready` to the sentinel.
fn run(runtime: &str, port: u16) -> (Duration, Duration) {
    let config = RedisConfig::tcp("127.0.0.1", port);
    let mut options = config.session_config(CHANNEL);
    options.extra_channels = vec!["USER_IP".to_owned()];
    options.client_name = Some("bench".to_owned());
    let registry = Arc::new(StreamWriters::default().with_redis(true));
    let me = InstanceName::from("bench");
    let session = RedisSession::new(
        options,
        Follower::new(me.clone(), registry.clone()),
        Writer::new(me, registry),
    );
    if runtime == "tokio" {
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let mut client =
            RedisClient::new(TokioRuntime::new(tokio.handle().clone()), config, session);
        tokio.block_on(follow(&mut client))
    } else {
        let mut client = RedisClient::new(SmolRuntime, config, session);
        smol::block_on(follow(&mut client))
    }
}

async fn follow<R: Runtime>(client: &mut RedisClient<R>) -> (Duration, Duration) {
    let sentinel = Command::decode(Bytes::from_static(SENTINEL.as_bytes()))
        .expect("the sentinel decodes")
        .expect("the sentinel is a command");
    let mut start = None;
    while let Some(event) = client.next_event().await {
        match event {
            RedisEvent::Ready => start = Some((cpu_time(), Instant::now())),
            RedisEvent::Command(command) if command == sentinel => {
                let (cpu, wall) = start.expect("ready before the sentinel");
                return (cpu_time().saturating_sub(cpu), wall.elapsed());
            }
            RedisEvent::Disconnected { reason, .. } => panic!("disconnected: {reason}"),
            _ => {}
        }
    }
    panic!("the client stopped")
}

/// CPU time of this thread so far (`/proc/thread-self/schedstat`, in ns).
fn cpu_time() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .map(Duration::from_nanos)
        .expect("Linux's /proc/thread-self/schedstat")
}
