//! A follower on tokio: joins a deployment through its Redis, keeps the
//! position of every stream and writer it hears of, and prints its
//! progress once a second.
//!
//! ```text
//! cargo run --features runtime-tokio --example worker_tokio -- \
//!     --redis redis://127.0.0.1:6379 --server-name example.com \
//!     [--name worker_tokio] [--writers config.json]
//! ```
//!
//! - `--redis URL`: the deployment's Redis (`redis://`, `unix://`;
//!   `rediss://` with the `tls` feature; see `RedisConfig::from_url`).
//! - `--server-name NAME`: the deployment's server name, the channel
//!   prefix; required.
//! - `--name NAME`: this process's instance name (default `worker_tokio`);
//!   its Redis connections are named `NAME-sub` and `NAME-pub`.
//! - `--writers FILE`: Synapse's `stream_writers` (and `instance_map`...)
//!   as JSON: who may write which stream. Default: `master` writes
//!   everything (and, over Redis, every process writes `caches`).
//!
//! It prints connection changes as they happen, and once a second a line
//! for each stream and writer that moved:
//!
//! ```text
//! connected subscriber
//! connected publisher
//! ready: subscribed to example.com, asked for positions (REPLICATE)
//! events master 57 (+52 rows, 52.0 rows/s)
//! typing master 3 (+0 rows, 0.0 rows/s)
//! missed typing master (3, 9]: skipped (no catch-up source)
//! disconnected subscriber: closed by the peer; retry in 71 ms
//! ```
//!
//! This example has no catch-up source, so rows missed while disconnected
//! are skipped (and said so). A real worker fetches them: from Synapse with
//! `HttpCatchUp` (feature `http-catch-up`), or from whatever holds the
//! writer's log, with `RedisClient::with_catch_up`.
//!
//! Try it without Synapse, against a redis-server of your own:
//!
//! ```text
//! redis-server --port 6400 --save "" --appendonly no &
//! cargo run --features runtime-tokio --example worker_tokio -- \
//!     --redis redis://127.0.0.1:6400 --server-name example.com &
//! redis-cli -p 6400 publish example.com 'POSITION events master 5 5'
//! redis-cli -p 6400 publish example.com \
//!     'RDATA events master 6 ["ev",["$e6","!r:example.com","m.room.message",null,null,null,null,false,false]]'
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use synapse_replication::positions::{
    CatchUpPage, CatchUpRequest, Follower, FollowerEvent, Writer,
};
use synapse_replication::session::{RedisEvent, RedisSession};
use synapse_replication::transport::{RedisClient, RedisClientEvent, RedisConfig, TokioRuntime};
use synapse_replication::wire::{InstanceName, StreamName, Token};
use synapse_replication::writers::StreamWriters;

const USAGE: &str = "usage: worker_tokio --redis URL --server-name NAME [--name NAME] \
                     [--writers FILE]";

struct Args {
    redis: String,
    server_name: String,
    name: String,
    writers: Option<PathBuf>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut redis, mut server_name, mut name, mut writers) = (None, None, None, None);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--redis" => redis = Some(value()?),
            "--server-name" => server_name = Some(value()?),
            "--name" => name = Some(value()?),
            "--writers" => writers = Some(PathBuf::from(value()?)),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args {
        redis: redis.ok_or("--redis is required")?,
        server_name: server_name.ok_or("--server-name is required")?,
        name: name.unwrap_or_else(|| "worker_tokio".to_owned()),
        writers,
    })
}

/// Where one writer of one stream is, and how many rows it brought since
/// the last report.
#[derive(Default)]
struct Progress {
    token: Option<Token>,
    rows: u64,
    moved: bool,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("worker_tokio: {message}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("worker_tokio: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let registry = match &args.writers {
        Some(path) => StreamWriters::from_json(&std::fs::read_to_string(path)?)
            .map_err(|error| format!("{}: {error}", path.display()))?,
        None => StreamWriters::default(),
    };
    let registry = Arc::new(registry.with_redis(true));
    let config = RedisConfig::from_url(&args.redis)?;
    let mut options = config.session_config(args.server_name.as_str());
    options.client_name = Some(args.name.clone());
    let me = InstanceName::from(args.name.as_str());
    let session = RedisSession::new(
        options,
        Follower::new(me.clone(), registry.clone()),
        Writer::new(me, registry),
    );
    let runtime = TokioRuntime::current().ok_or("not inside a tokio runtime")?;
    let mut client = RedisClient::new(runtime, config, session);

    let mut progress: BTreeMap<(StreamName, InstanceName), Progress> = BTreeMap::new();
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    let mut last_tick = Instant::now();
    loop {
        tokio::select! {
            event = client.next_event() => {
                let Some(event) = event else { return Ok(()) };
                match event {
                    RedisClientEvent::Connected { link } => println!("connected {link}"),
                    RedisClientEvent::Disconnected { link, reason, retry_in } => println!(
                        "disconnected {link}: {reason}; retry in {} ms",
                        retry_in.as_millis()
                    ),
                    RedisClientEvent::ConnectFailed { link, error, retry_in } => println!(
                        "connecting {link} failed: {error}; retry in {} ms",
                        retry_in.as_millis()
                    ),
                    RedisClientEvent::Ready => {
                        let prefix = &args.server_name;
                        println!("ready: subscribed to {prefix}, asked for positions (REPLICATE)");
                    }
                    RedisClientEvent::Rows { stream, writer, token, rows, .. } => {
                        moved(&mut progress, stream, writer, token, rows.len());
                    }
                    RedisClientEvent::Position { stream, writer, token }
                    | RedisClientEvent::Started { stream, writer, token } => {
                        moved(&mut progress, stream, writer, token, 0);
                    }
                    RedisClientEvent::Session(RedisEvent::Follower(FollowerEvent::CatchUp(
                        request,
                    ))) => skip(request, &mut client),
                    RedisClientEvent::Command(_) => {}
                    RedisClientEvent::Session(RedisEvent::Closing { link, error }) => {
                        println!("closing {link}: {error}");
                    }
                    other => println!("{other:?}"),
                }
            }
            _ = ticks.tick() => {
                let elapsed = last_tick.elapsed().as_secs_f64().max(0.001);
                last_tick = Instant::now();
                for ((stream, writer), p) in progress.iter_mut().filter(|(_, p)| p.moved) {
                    let token = p.token.map_or("-".to_owned(), |t| t.to_string());
                    let rate = p.rows as f64 / elapsed;
                    println!("{stream} {writer} {token} (+{} rows, {rate:.1} rows/s)", p.rows);
                    *p = Progress { token: p.token, ..Progress::default() };
                }
            }
        }
    }
}

/// Records that a writer moved.
fn moved(
    progress: &mut BTreeMap<(StreamName, InstanceName), Progress>,
    stream: StreamName,
    writer: InstanceName,
    token: Token,
    rows: usize,
) {
    let p = progress.entry((stream, writer)).or_default();
    p.token = Some(token);
    p.rows += rows as u64;
    p.moved = true;
}

/// Skips a range of missed rows: this example has no catch-up source.
fn skip(request: CatchUpRequest, client: &mut RedisClient<TokioRuntime>) {
    println!(
        "missed {} {} ({}, {}]: skipped (no catch-up source)",
        request.stream, request.writer, request.from, request.to
    );
    let skip = CatchUpPage {
        updates: Vec::new(),
        upto: request.to,
        limited: false,
    };
    if let Err(error) = client.handle_catch_up(request.id, skip) {
        println!("catch-up {}: {error}", request.id);
    }
}
