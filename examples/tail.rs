//! Follows a replication server and prints what it receives, one line per
//! item. Runs on smol (build with `--features runtime-smol`).
//!
//! ```text
//! cargo run --features runtime-smol --example tail -- \
//!     --redis redis://127.0.0.1:6379 --server-name example.com [--name tail] \
//!     [--wire] [--events] [--writers config.json]
//! cargo run --features runtime-smol --example tail -- \
//!     --tcp 127.0.0.1:9092 --server-name example.com [...]
//! ```
//!
//! Options:
//!
//! - `--redis URL`: follow a deployment through its Redis (`redis://`,
//!   `rediss://` with the `tls` feature, `unix://`, or behind Redis
//!   Sentinel `redis+sentinel://host1,host2/service_name`; see
//!   `RedisConfig`):
//!   subscribe to the server name's channels, publish `REPLICATE`, print
//!   what arrives; reconnects forever with backoff. Nothing is published but
//!   `REPLICATE` (tail writes no stream).
//! - `--tcp HOST:PORT`: follow a direct TCP replication server (Synapse's
//!   `replication` listener before 1.67, or this crate's `TcpServer`);
//!   reconnects forever with backoff.
//! - `--server-name NAME`: the deployment's server name: the Redis channel
//!   prefix, or the name a TCP server must announce (`SERVER NAME`);
//!   required.
//! - `--name NAME`: this follower's instance name, sent as `NAME` (default
//!   `tail`).
//! - `--writers FILE`: a JSON file with Synapse's `stream_writers` and
//!   `instance_map` (and `redis`, `federation_sender_instances`...): who may
//!   write which stream. Default: `master` writes everything.
//! - `--wire`: print each command received as its wire line, re-encoded.
//! - `--events`: print what the follower hands the application.
//!
//! With neither `--wire` nor `--events`, each command received is printed
//! decoded (Rust `Debug` form). With `--events` alone only events are
//! printed; with both, each command's wire line comes before the events it
//! caused.
//!
//! Event lines (stable; fields separated by one space; `<rows>` is a JSON
//! array of the rows, as received):
//!
//! ```text
//! connected <host:port>             (TCP; Redis: connected <subscriber|publisher>)
//! ready <server_name>
//! rows <stream> <writer> <token> <live|catch-up> <count> <rows>
//! position <stream> <writer> <token>
//! started <stream> <writer> <token>  (a writer first heard of; nothing before <token> fetched)
//! catch-up <id> <stream> <writer> <from> <to>
//! reset <stream> <writer> <previous> <new>
//! rejected <RDATA|POSITION> <stream> <instance> <reason>
//! command <wire line>
//! error <message>
//! closing <reason>
//! disconnected <reason>; retry in <ms> ms
//! connect-failed <error>; retry in <ms> ms
//! malformed <channel> <error>                 (Redis only)
//! publish-failed <command> <error>            (Redis only)
//! sentinel <what the sentinels said>          (Redis Sentinel only)
//! ```
//!
//! `command` is a command for the application (`REMOTE_SERVER_UP`,
//! `LOCK_RELEASED`); `error` an `ERROR` the server sent; `closing` why
//! `tail` closes the connection. `tail` cannot fetch missed rows (that needs
//! the writer's catch-up endpoint): after printing a `catch-up` line it skips
//! the range, and the next line is the `position` reached.

use std::io;
use std::path::PathBuf;
use std::process::ExitCode;

/// What to follow.
#[derive(Debug)]
#[cfg_attr(not(feature = "runtime-smol"), allow(dead_code))]
enum Source {
    Tcp { addr: String },
    Redis { url: String },
}

#[derive(Debug)]
#[cfg_attr(not(feature = "runtime-smol"), allow(dead_code))]
struct Args {
    source: Source,
    server_name: String,
    name: String,
    writers: Option<PathBuf>,
    wire: bool,
    events: bool,
}

const USAGE: &str = "usage: tail (--redis URL | --tcp HOST:PORT) --server-name NAME [--name NAME] \
                     [--writers FILE] [--wire] [--events]";

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut source = None;
    let mut server_name = None;
    let mut name = None;
    let mut writers = None;
    let mut wire = false;
    let mut events = false;
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--tcp" => {
                if source.is_some() {
                    return Err("give one source".into());
                }
                source = Some(Source::Tcp {
                    addr: value("--tcp")?,
                });
            }
            "--redis" => {
                if source.is_some() {
                    return Err("give one source".into());
                }
                source = Some(Source::Redis {
                    url: value("--redis")?,
                });
            }
            "--server-name" => server_name = Some(value("--server-name")?),
            "--name" => name = Some(value("--name")?),
            "--writers" => writers = Some(PathBuf::from(value("--writers")?)),
            "--wire" => wire = true,
            "--events" => events = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args {
        source: source.ok_or("--redis or --tcp is required")?,
        server_name: server_name.ok_or("--server-name is required")?,
        name: name.unwrap_or_else(|| "tail".to_owned()),
        writers,
        wire,
        events,
    })
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("tail: {message}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        // `tail ... | head` ends quietly.
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tail: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "runtime-smol"))]
fn run(_args: Args) -> io::Result<()> {
    Err(io::Error::other(
        "built without smol: run with `--features runtime-smol`",
    ))
}

#[cfg(feature = "runtime-smol")]
fn run(args: Args) -> io::Result<()> {
    use std::sync::Arc;

    use synapse_replication::config::StreamWriters;

    let registry = match &args.writers {
        Some(path) => StreamWriters::from_json(&std::fs::read_to_string(path)?)
            .map_err(|error| io::Error::other(format!("{}: {error}", path.display())))?,
        None => StreamWriters::default(),
    };
    match &args.source {
        Source::Tcp { addr } => run_tcp(&args, addr, Arc::new(registry)),
        Source::Redis { url } => run_redis(&args, url, Arc::new(registry.with_redis(true))),
    }
}

/// A command as its wire line.
#[cfg(feature = "runtime-smol")]
fn wire(command: &synapse_replication::wire::Command) -> String {
    match command.to_bytes() {
        Ok(line) => String::from_utf8_lossy(&line).into_owned(),
        Err(error) => format!("<cannot encode: {error}>"),
    }
}

/// A command received, as `--wire` or the default prints it.
#[cfg(feature = "runtime-smol")]
fn received(args: &Args, command: &synapse_replication::wire::Command) -> String {
    if args.wire {
        wire(command)
    } else {
        format!("{command:?}")
    }
}

/// A follower event's line; a catch-up is answered by skipping the range
/// (`skip` gets the request id and the page).
#[cfg(feature = "runtime-smol")]
fn follower_line(
    event: synapse_replication::positions::FollowerEvent,
    mut skip: impl FnMut(
        synapse_replication::positions::CatchUpId,
        synapse_replication::positions::CatchUpPage,
    ),
) -> String {
    use synapse_replication::positions::{CatchUpPage, FollowerEvent, RowOrigin};

    match event {
        FollowerEvent::Rows {
            stream,
            writer,
            token,
            rows,
            source,
        } => {
            let source = match source {
                RowOrigin::Live => "live",
                RowOrigin::CatchUp => "catch-up",
            };
            let json: Vec<&str> = rows.iter().map(|row| row.as_str()).collect();
            format!(
                "rows {stream} {writer} {token} {source} {} [{}]",
                rows.len(),
                json.join(",")
            )
        }
        FollowerEvent::Position {
            stream,
            writer,
            token,
        } => format!("position {stream} {writer} {token}"),
        FollowerEvent::Started {
            stream,
            writer,
            token,
        } => format!("started {stream} {writer} {token}"),
        FollowerEvent::CatchUp(request) => {
            // Nothing to fetch from: skip the range.
            let page = CatchUpPage {
                updates: Vec::new(),
                upto: request.to,
                limited: false,
            };
            skip(request.id, page);
            format!(
                "catch-up {} {} {} {} {}",
                request.id.get(),
                request.stream,
                request.writer,
                request.from,
                request.to
            )
        }
        FollowerEvent::Reset {
            stream,
            writer,
            previous,
            new,
        } => format!("reset {stream} {writer} {previous} {new}"),
        FollowerEvent::Rejected {
            stream,
            instance,
            command,
            reason,
        } => format!("rejected {command} {stream} {instance} {reason}"),
        other => format!("{other}"),
    }
}

#[cfg(feature = "runtime-smol")]
fn run_tcp(
    args: &Args,
    addr: &str,
    registry: std::sync::Arc<synapse_replication::config::StreamWriters>,
) -> io::Result<()> {
    use std::io::Write;

    use synapse_replication::positions::Follower;
    use synapse_replication::session::{TcpClientEvent, TcpClientSession, TcpSessionConfig};
    use synapse_replication::transport::{SmolRuntime, TcpClient};
    use synapse_replication::wire::InstanceName;

    let follower = Follower::new(InstanceName::from(args.name.as_str()), registry);
    let mut config = TcpSessionConfig::default();
    config.report_received = args.wire || !args.events;
    let session = TcpClientSession::with_config(args.server_name.as_str(), follower, config)
        .map_err(io::Error::other)?;
    let mut client = TcpClient::new(SmolRuntime, addr, session);
    let mut out = io::stdout().lock();
    smol::block_on(async {
        while let Some(event) = client.next_event().await {
            let event = match event {
                TcpClientEvent::Follower(event) if args.events => {
                    let line = follower_line(event, |id, page| {
                        let _ = client.handle_catch_up(id, page);
                    });
                    writeln!(out, "{line}")?;
                    continue;
                }
                TcpClientEvent::Follower(_) => continue,
                event => event,
            };
            let line = match event {
                TcpClientEvent::Received(command) => received(args, &command),
                _ if !args.events => continue,
                TcpClientEvent::Connected => format!("connected {addr}"),
                TcpClientEvent::ConnectFailed { error, retry_in } => {
                    format!(
                        "connect-failed {error}; retry in {} ms",
                        retry_in.as_millis()
                    )
                }
                TcpClientEvent::Disconnected { reason, retry_in } => {
                    format!(
                        "disconnected {reason}; retry in {} ms",
                        retry_in.as_millis()
                    )
                }
                TcpClientEvent::Ready { server_name } => format!("ready {server_name}"),
                TcpClientEvent::Command(command) => format!("command {}", wire(&command)),
                TcpClientEvent::PeerError(message) => {
                    format!("error {message}")
                }
                other => format!("{other:?}"),
            };
            writeln!(out, "{line}")?;
        }
        Ok(())
    })
}

#[cfg(feature = "runtime-smol")]
fn run_redis(
    args: &Args,
    url: &str,
    registry: std::sync::Arc<synapse_replication::config::StreamWriters>,
) -> io::Result<()> {
    use std::io::Write;

    use synapse_replication::config::RedisConfig;
    use synapse_replication::positions::{Follower, Writer};
    use synapse_replication::session::{RedisEvent, RedisSession};
    use synapse_replication::transport::{RedisClient, SmolRuntime};
    use synapse_replication::wire::InstanceName;

    let config = RedisConfig::from_url(url).map_err(io::Error::other)?;
    let me = InstanceName::from(args.name.as_str());
    let mut options = config.session_config(args.server_name.as_str());
    options.report_received = args.wire || !args.events;
    options.client_name = Some(args.name.clone());
    let session = RedisSession::new(
        options,
        Follower::new(me.clone(), registry.clone()),
        Writer::new(me, registry),
    );
    let mut client = RedisClient::new(SmolRuntime, config, session);
    let mut out = io::stdout().lock();
    smol::block_on(async {
        while let Some(event) = client.next_event().await {
            let event = match event {
                RedisEvent::Follower(event) if args.events => {
                    let line = follower_line(event, |id, page| {
                        let _ = client.handle_catch_up(id, page);
                    });
                    writeln!(out, "{line}")?;
                    continue;
                }
                RedisEvent::Follower(_) => continue,
                event => event,
            };
            let line = match event {
                RedisEvent::Received { command, .. } => received(args, &command),
                _ if !args.events => continue,
                RedisEvent::Connected { link } => format!("connected {link}"),
                RedisEvent::ConnectFailed {
                    error, retry_in, ..
                } => {
                    format!(
                        "connect-failed {error}; retry in {} ms",
                        retry_in.as_millis()
                    )
                }
                RedisEvent::Disconnected {
                    reason, retry_in, ..
                } => {
                    format!(
                        "disconnected {reason}; retry in {} ms",
                        retry_in.as_millis()
                    )
                }
                RedisEvent::Ready => format!("ready {}", args.server_name),
                RedisEvent::Command(command) => format!("command {}", wire(&command)),
                RedisEvent::Malformed { channel, error } => {
                    format!("malformed {} {error}", String::from_utf8_lossy(&channel))
                }
                RedisEvent::PublishFailed { command, error } => {
                    format!("publish-failed {command} {error}")
                }
                RedisEvent::Sentinel(event) => format!("sentinel {event}"),
                other => format!("{other:?}"),
            };
            writeln!(out, "{line}")?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn arguments() {
        let args = parse(&["--tcp", "h:1", "--server-name", "x.org", "--wire"]).unwrap();
        assert!(matches!(args.source, Source::Tcp { ref addr } if addr == "h:1"));
        assert_eq!(args.name, "tail");
        assert!(args.wire && !args.events);
        assert!(parse(&["--server-name", "x"]).is_err());
        assert!(parse(&["--tcp", "h:1"]).is_err());
        assert!(parse(&["--tcp"]).is_err());
        let args = parse(&["--redis", "redis://h", "--server-name", "x", "--events"]).unwrap();
        assert!(matches!(args.source, Source::Redis { ref url } if url == "redis://h"));
        assert!(parse(&["--redis", "redis://h", "--tcp", "h:1", "--server-name", "x"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
    }
}
