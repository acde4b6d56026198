//! Redis Sentinel, sans-IO: finding the master a deployment's sentinels
//! name ([`SentinelDiscovery`]), and hearing of their failovers
//! ([`SentinelWatch`]).
//!
//! What this module does not do: open sockets, read clocks, or sleep. A
//! driver (the transport's `RedisClient` with a sentinel
//! [`RedisConfig`](crate::config::RedisConfig), or your own)
//! opens the connections a [`DiscoveryStep`] asks for, moves their bytes,
//! and spaces rounds out with a backoff.
//!
//! # Discovery
//!
//! One round asks the sentinels in turn, starting with the one that
//! answered last time: `SENTINEL get-master-addr-by-name <service>` on a
//! connection to the sentinel (after `AUTH` with the sentinels'
//! credentials). A node outside the [`AllowedMasters`] (by default: any
//! address outside the private ranges, and any host name) is refused
//! there, and never connected to. Otherwise `ROLE` is asked on a
//! connection to the node it names, *before* `AUTH`; only when the node
//! refuses it without credentials (`NOAUTH`, `NOPERM`: a Redis with
//! `requirepass` does) are the data nodes' credentials sent, and `ROLE`
//! asked again. So a node that answers `ROLE` unauthenticated (a Redis
//! whose `default` user may run it) and is not the master never sees the
//! password; against one that demands the password first, only the allow
//! list (and, with TLS, the certificate) protects it.
//!
//! Only a node that says `master` is taken, and the connection that asked
//! it is the one to use: no other connection is opened between the check
//! and its use. A sentinel that is down, does not know the service,
//! answers nonsense or names a node that is not allowed, is down or is a
//! replica is noted, and the next one is asked. When none is left the
//! round fails with every sentinel's reason ([`DiscoveryError`]).
//!
//! ```
//! use synapse_replication::session::sentinel::{
//!     DiscoveryStep, MasterAddr, SentinelDiscovery, SentinelTarget,
//! };
//!
//! let mut round = SentinelDiscovery::new("mymaster", 2, 0, None, None);
//! assert_eq!(round.poll_step(), Some(DiscoveryStep::Connect(SentinelTarget::Sentinel(0))));
//! round.connected();
//! let asked = round.poll_transmit().expect("a question");
//! assert!(asked.ends_with(b"$8\r\nmymaster\r\n"));
//! round.handle_input(b"*2\r\n$8\r\n10.0.0.7\r\n$4\r\n6379\r\n");
//! let master = MasterAddr { host: "10.0.0.7".into(), port: 6379 };
//! assert_eq!(round.poll_step(), Some(DiscoveryStep::Connect(SentinelTarget::Master(master.clone()))));
//! round.connected();
//! assert_eq!(round.poll_transmit().as_deref(), Some(&b"*1\r\n$4\r\nROLE\r\n"[..]));
//! round.handle_input(b"*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n");
//! assert_eq!(round.poll_step(), Some(DiscoveryStep::Found { master, sentinel: 0 }));
//! ```
//!
//! # Failovers
//!
//! A [`SentinelWatch`] subscribes to a sentinel's `+switch-master`
//! channel; each switch of the service is reported at once, so that a
//! failover is acted on within a round trip of the sentinel's announcement
//! rather than at the next keep-alive. A switch to a node outside the
//! [`AllowedMasters`] fails the watch ([`SentinelError::NotAllowed`]):
//! that sentinel is not listened to any more. (Spacing out the reaction
//! to a storm of switches is the driver's part: the transport's
//! `RedisClient` acts on the first at
//! once and on the last of those that follow within a second.) It pings
//! every
//! [`SentinelWatch::PING_INTERVAL`] and gives the connection up when a
//! reply is [`SentinelWatch::PING_TIMEOUT`] late.
//!
//! `discovery` finds the master; `watch` hears the failovers.

mod discovery;
mod events;
mod watch;

pub use discovery::SentinelDiscovery;
pub use events::SentinelEvent;
pub use watch::{SentinelWatch, WatchEvent};

use std::collections::VecDeque;
use std::fmt;

use bytes::{Bytes, BytesMut};

use crate::resp::{
    Credentials, Frame, Incoming, Limits, RespDecoder, RespError, encode_auth, encode_command,
};

use super::RedisErrorReply;
use crate::config::{AllowedMasters, RedisAuth};

/// The channel sentinels announce failovers on.
pub const SWITCH_MASTER_CHANNEL: &str = "+switch-master";

/// Caps on what a sentinel or a node may answer: nothing here is longer
/// than a few hundred bytes (a master's `ROLE` lists its replicas).
const LIMITS: Limits = Limits::new()
    .with_max_bulk_len(4 << 10)
    .with_max_line_len(4 << 10)
    .with_max_elements(1024)
    .with_max_depth(4)
    .with_max_frame_len(256 << 10);

/// Longest host name taken from an answer.
const MAX_HOST_LEN: usize = 255;

/// A data node's address, as a sentinel names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MasterAddr {
    /// The host (usually an IP address; IPv6 without brackets).
    pub host: String,
    /// The port.
    pub port: u16,
}

impl fmt::Display for MasterAddr {
    /// `host:port`, `[v6]:port`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// What a node said it is, in answer to `ROLE`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeRole {
    /// A master: it takes writes.
    Master,
    /// A replica (`slave`), of the master it names.
    Replica,
    /// A sentinel.
    Sentinel,
    /// Something else (the word it answered, truncated).
    Other(String),
}

impl fmt::Display for NodeRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeRole::Master => f.write_str("master"),
            NodeRole::Replica => f.write_str("replica"),
            NodeRole::Sentinel => f.write_str("sentinel"),
            NodeRole::Other(role) => write!(f, "{role:?}"),
        }
    }
}

/// Why one sentinel, or the node it named, could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SentinelError {
    /// The connection could not be opened, or broke (the driver's reason).
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// Nothing was answered in time.
    #[error("no answer in time")]
    Timeout,
    /// The sentinel does not monitor a master of that name.
    #[error("sentinel knows no master named {0:?}")]
    UnknownMaster(String),
    /// The sentinel named a node outside the
    /// [`AllowedMasters`]: it was not connected to.
    #[error(
        "named {addr} as the master, which is not an allowed master \
         (allow it in the sentinel configuration's allowed masters if it is yours)"
    )]
    NotAllowed {
        /// The node it named.
        addr: MasterAddr,
    },
    /// The sentinel or the node answered with an error (`WRONGPASS`,
    /// `NOAUTH`, `NOPERM`, ...).
    #[error("refused: {0}")]
    Refused(RedisErrorReply),
    /// The node the sentinel named is not a master (a sentinel that lags
    /// or lies, or a failover under way).
    #[error("{addr} says it is a {role}, not the master")]
    NotMaster {
        /// The node.
        addr: MasterAddr,
        /// What it said it is.
        role: NodeRole,
    },
    /// The answer does not have the shape the command's answers have.
    #[error("malformed answer: {0}")]
    Malformed(String),
    /// The bytes are not RESP, or break a cap.
    #[error("invalid reply: {0}")]
    Protocol(#[from] RespError),
}

/// A discovery round in which no sentinel named a usable master: what
/// each one tried, in order.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub struct DiscoveryError {
    /// The master's service name.
    pub service: String,
    /// Per sentinel asked (its index in the configuration): why it did not
    /// do.
    pub failures: Vec<(usize, SentinelError)>,
}

impl fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no sentinel named a usable master for {:?}",
            self.service
        )?;
        if self.failures.is_empty() {
            return f.write_str(" (no sentinel configured)");
        }
        for (index, (sentinel, error)) in self.failures.iter().enumerate() {
            let sep = if index == 0 { ": " } else { "; " };
            write!(f, "{sep}sentinel {sentinel}: {error}")?;
        }
        Ok(())
    }
}

/// Where a [`SentinelDiscovery`] wants a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SentinelTarget {
    /// The sentinel of this index in the configuration.
    Sentinel(usize),
    /// The node a sentinel named, to check its role.
    Master(MasterAddr),
}

/// What a [`SentinelDiscovery`] wants done next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiscoveryStep {
    /// Close the connection in use, if any, and open one to this target;
    /// then call [`connected`](SentinelDiscovery::connected) or
    /// [`connect_failed`](SentinelDiscovery::connect_failed).
    Connect(SentinelTarget),
    /// The master: keep the connection to it (the one that asked `ROLE`)
    /// and use it. `sentinel` answered; start there next time.
    Found {
        /// The master.
        master: MasterAddr,
        /// The sentinel that named it.
        sentinel: usize,
    },
    /// No sentinel named a usable master. Close the connection in use;
    /// start another round after a backoff.
    Failed(DiscoveryError),
}

/// The question on the current connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Auth,
    MasterAddr,
    Role,
    Subscribe,
    Ping,
}

/// One connection's requests and replies, in order. Its output can hold
/// an `AUTH` with a password, so its [`Debug`] shows only lengths.
#[derive(Default)]
struct Exchange {
    decoder: RespDecoder,
    input: BytesMut,
    output: BytesMut,
    expect: VecDeque<Expect>,
}

impl fmt::Debug for Exchange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exchange")
            .field("input_len", &self.input.len())
            .field("output_len", &self.output.len())
            .field("expect", &self.expect)
            .finish_non_exhaustive()
    }
}

impl Exchange {
    fn new() -> Exchange {
        Exchange {
            decoder: RespDecoder::with_limits(LIMITS),
            ..Exchange::default()
        }
    }

    fn auth(&mut self, auth: Option<&RedisAuth>) {
        if let Some(auth) = auth {
            encode_auth(
                &mut self.output,
                &Credentials {
                    username: auth.username.as_deref().map(str::as_bytes),
                    password: auth.password.as_bytes(),
                },
            );
            self.expect.push_back(Expect::Auth);
        }
    }

    fn ask(&mut self, args: &[&[u8]], expect: Expect) {
        encode_command(&mut self.output, args);
        self.expect.push_back(expect);
    }

    fn transmit(&mut self) -> Option<Bytes> {
        (!self.output.is_empty()).then(|| self.output.split().freeze())
    }

    /// The next reply, with what it answers (`None` for a pub/sub
    /// message, which answers nothing).
    fn next(&mut self) -> Result<Option<(Option<Expect>, Incoming)>, SentinelError> {
        let Some(incoming) = self.decoder.decode_pubsub(&mut self.input)? else {
            return Ok(None);
        };
        if let Incoming::Message(_) = incoming {
            return Ok(Some((None, incoming)));
        }
        if let Incoming::Frame(Frame::Push(_)) = incoming {
            return Ok(Some((None, incoming)));
        }
        match self.expect.pop_front() {
            Some(expect) => Ok(Some((Some(expect), incoming))),
            None => Err(SentinelError::Malformed("a reply to nothing".to_owned())),
        }
    }
}

fn error_reply(frame: &Frame) -> Option<RedisErrorReply> {
    let text = frame.as_error()?;
    let message = String::from_utf8_lossy(text).into_owned();
    let code = message
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    Some(RedisErrorReply { code, message })
}

fn short(text: &[u8]) -> String {
    let text = String::from_utf8_lossy(text);
    let mut chars = text.chars();
    let mut out: String = chars.by_ref().take(40).collect();
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

fn malformed(what: &str, frame: &Frame) -> SentinelError {
    let shown = format!("{frame:?}");
    SentinelError::Malformed(format!("{what}: {}", short(shown.as_bytes())))
}

/// A host and a port, from two bulk strings.
fn parse_addr(host: &Frame, port: &Frame) -> Option<MasterAddr> {
    let host = std::str::from_utf8(host.as_bytes()?).ok()?;
    if host.is_empty() || host.len() > MAX_HOST_LEN || host.contains(['/', ' ', '\r', '\n']) {
        return None;
    }
    let port: u16 = std::str::from_utf8(port.as_bytes()?).ok()?.parse().ok()?;
    (port != 0).then(|| MasterAddr {
        host: host.to_owned(),
        port,
    })
}

/// A `SENTINEL get-master-addr-by-name` answer.
fn parse_master_addr(frame: &Frame, service: &str) -> Result<MasterAddr, SentinelError> {
    if let Some(error) = error_reply(frame) {
        return Err(SentinelError::Refused(error));
    }
    if frame.is_null() {
        return Err(SentinelError::UnknownMaster(short(service.as_bytes())));
    }
    match frame.elements() {
        Some([host, port]) => {
            parse_addr(host, port).ok_or_else(|| malformed("not a host and a port", frame))
        }
        _ => Err(malformed("not a host and a port", frame)),
    }
}

/// A `ROLE` answer: its first element.
fn parse_role(frame: &Frame) -> Result<NodeRole, SentinelError> {
    if let Some(error) = error_reply(frame) {
        return Err(SentinelError::Refused(error));
    }
    let role = frame
        .elements()
        .and_then(<[Frame]>::first)
        .and_then(Frame::as_bytes)
        .ok_or_else(|| malformed("not a role", frame))?;
    Ok(match &role[..] {
        b"master" => NodeRole::Master,
        b"slave" | b"replica" => NodeRole::Replica,
        b"sentinel" => NodeRole::Sentinel,
        other => NodeRole::Other(short(other)),
    })
}

/// A `+switch-master` payload: `<name> <old-ip> <old-port> <new-ip> <new-port>`.
fn parse_switch(payload: &[u8]) -> Option<(String, MasterAddr, MasterAddr)> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut words = text.split(' ');
    let name = words.next()?;
    let mut addr = || {
        let host = Frame::bulk(Bytes::copy_from_slice(words.next()?.as_bytes()));
        let port = Frame::bulk(Bytes::copy_from_slice(words.next()?.as_bytes()));
        parse_addr(&host, &port)
    };
    let from = addr()?;
    let to = addr()?;
    if words.next().is_some() {
        return None;
    }
    Some((name.to_owned(), from, to))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn addr(host: &str, port: u16) -> MasterAddr {
        MasterAddr {
            host: host.to_owned(),
            port,
        }
    }

    fn bulk_array(items: &[&str]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", items.len());
        for item in items {
            out.push_str(&format!("${}\r\n{item}\r\n", item.len()));
        }
        out.into_bytes()
    }

    /// Feeds `answer` one byte at a time.
    fn answer(round: &mut SentinelDiscovery, answer: &[u8]) {
        for byte in answer {
            round.handle_input(std::slice::from_ref(byte));
        }
    }

    fn expect_connect(round: &mut SentinelDiscovery, target: SentinelTarget) {
        assert_eq!(round.poll_step(), Some(DiscoveryStep::Connect(target)));
        assert_eq!(round.poll_step(), None, "waits for the connection");
        round.connected();
    }

    #[test]
    fn finds_the_master_and_checks_its_role() {
        let auth = RedisAuth {
            username: Some("sentinel-user".to_owned()),
            password: "s".to_owned(),
        };
        let mut round = SentinelDiscovery::new("mymaster", 3, 4, Some(auth), None);
        // Starts with sentinel 4 % 3.
        expect_connect(&mut round, SentinelTarget::Sentinel(1));
        let asked = round.poll_transmit().expect("the question");
        assert!(asked.starts_with(b"*3\r\n$4\r\nAUTH\r\n$13\r\nsentinel-user\r\n"));
        assert!(asked.ends_with(&bulk_array(&[
            "SENTINEL",
            "get-master-addr-by-name",
            "mymaster"
        ])));
        answer(&mut round, b"+OK\r\n");
        assert_eq!(round.poll_step(), None);
        answer(&mut round, &bulk_array(&["::1", "7000"]));
        expect_connect(&mut round, SentinelTarget::Master(addr("::1", 7000)));
        assert_eq!(
            round.poll_transmit().as_deref(),
            Some(&bulk_array(&["ROLE"])[..])
        );
        answer(&mut round, b"*3\r\n$6\r\nmaster\r\n:10\r\n*1\r\n*3\r\n$9\r\n127.0.0.1\r\n$4\r\n7001\r\n$2\r\n10\r\n");
        assert_eq!(
            round.poll_step(),
            Some(DiscoveryStep::Found {
                master: addr("::1", 7000),
                sentinel: 1
            })
        );
        assert_eq!(round.poll_step(), None);
        assert_eq!(addr("::1", 7000).to_string(), "[::1]:7000");
    }

    #[test]
    fn every_way_a_sentinel_fails_moves_on_and_the_round_reports_them_all() {
        let mut round = SentinelDiscovery::new("mymaster", 6, 0, None, None);
        // 0: down.
        expect_connect(&mut round, SentinelTarget::Sentinel(0));
        round.connect_failed("connection refused");
        // 1: does not know the name.
        expect_connect(&mut round, SentinelTarget::Sentinel(1));
        answer(&mut round, b"*-1\r\n");
        // 2: names a replica (it lies, or lags).
        expect_connect(&mut round, SentinelTarget::Sentinel(2));
        answer(&mut round, &bulk_array(&["10.0.0.2", "6379"]));
        expect_connect(&mut round, SentinelTarget::Master(addr("10.0.0.2", 6379)));
        answer(
            &mut round,
            b"*5\r\n$5\r\nslave\r\n$8\r\n10.0.0.1\r\n:6379\r\n$9\r\nconnected\r\n:1\r\n",
        );
        // 3: names a node that is down.
        expect_connect(&mut round, SentinelTarget::Sentinel(3));
        answer(&mut round, &bulk_array(&["10.0.0.9", "6379"]));
        expect_connect(&mut round, SentinelTarget::Master(addr("10.0.0.9", 6379)));
        round.connect_failed("connection refused");
        // 4: refuses the credentials.
        expect_connect(&mut round, SentinelTarget::Sentinel(4));
        answer(&mut round, b"-WRONGPASS invalid username-password pair\r\n");
        // 5: answers nonsense, then is silent.
        expect_connect(&mut round, SentinelTarget::Sentinel(5));
        answer(&mut round, &bulk_array(&["10.0.0.2", "port"]));
        let Some(DiscoveryStep::Failed(error)) = round.poll_step() else {
            panic!("the round fails");
        };
        let kinds: Vec<(usize, &str)> = error
            .failures
            .iter()
            .map(|(sentinel, error)| {
                let kind = match error {
                    SentinelError::Unreachable(_) => "unreachable",
                    SentinelError::UnknownMaster(_) => "unknown",
                    SentinelError::NotMaster {
                        role: NodeRole::Replica,
                        ..
                    } => "replica",
                    SentinelError::Refused(_) => "refused",
                    SentinelError::Malformed(_) => "malformed",
                    _ => "other",
                };
                (*sentinel, kind)
            })
            .collect();
        assert_eq!(
            kinds,
            [
                (0, "unreachable"),
                (1, "unknown"),
                (2, "replica"),
                (3, "unreachable"),
                (4, "refused"),
                (5, "malformed")
            ]
        );
        let message = error.to_string();
        assert!(
            message.contains("no master named \"mymaster\""),
            "{message}"
        );
        assert!(
            message.contains("10.0.0.2:6379 says it is a replica"),
            "{message}"
        );
        assert_eq!(round.poll_step(), None, "a round ends once");
    }

    #[test]
    fn hostile_answers_end_the_connection_not_the_process() {
        for bad in [
            &b"*2\r\n$8\r\n10.0.0.2\r\n$5\r\n99999\r\n"[..],
            b"*2\r\n$0\r\n\r\n$4\r\n6379\r\n",
            b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n",
            b":1\r\n",
            b"$99999999\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
            b"not resp\r\n",
            b"*2000\r\n",
            b">3\r\n$7\r\nmessage\r\n$1\r\na\r\n$1\r\nb\r\n+OK\r\n",
        ] {
            let mut round = SentinelDiscovery::new("m", 1, 0, None, None);
            expect_connect(&mut round, SentinelTarget::Sentinel(0));
            answer(&mut round, bad);
            match round.poll_step() {
                Some(DiscoveryStep::Failed(error)) => {
                    assert_eq!(error.failures.len(), 1, "{error}");
                }
                other => panic!("{:?}: {other:?}", String::from_utf8_lossy(bad)),
            }
        }
        // A reply nobody asked for.
        let mut round = SentinelDiscovery::new("m", 1, 0, None, None);
        expect_connect(&mut round, SentinelTarget::Sentinel(0));
        answer(&mut round, b"*-1\r\n+OK\r\n");
        assert!(matches!(round.poll_step(), Some(DiscoveryStep::Failed(_))));
        // No sentinels: fails at once.
        let mut round = SentinelDiscovery::new("m", 0, 0, None, None);
        assert!(
            matches!(round.poll_step(), Some(DiscoveryStep::Failed(error)) if error.failures.is_empty())
        );
    }

    #[test]
    fn timeouts_and_broken_connections_count_against_the_sentinel() {
        let mut round = SentinelDiscovery::new("m", 2, 1, None, None);
        expect_connect(&mut round, SentinelTarget::Sentinel(1));
        round.timed_out();
        expect_connect(&mut round, SentinelTarget::Sentinel(0));
        answer(&mut round, &bulk_array(&["10.0.0.3", "1"]));
        expect_connect(&mut round, SentinelTarget::Master(addr("10.0.0.3", 1)));
        round.connect_failed("closed");
        let Some(DiscoveryStep::Failed(error)) = round.poll_step() else {
            panic!("fails");
        };
        assert_eq!(
            error.failures,
            [
                (1, SentinelError::Timeout),
                (0, SentinelError::Unreachable("closed".to_owned()))
            ]
        );
    }

    #[test]
    fn a_node_outside_the_allow_list_is_never_connected_to() {
        let allowed = AllowedMasters::parse(["10.1.0.0/16", "redis.internal"]).expect("parses");
        let mut round =
            SentinelDiscovery::new("m", 3, 0, None, None).with_allowed_masters(allowed.clone());
        expect_connect(&mut round, SentinelTarget::Sentinel(0));
        answer(&mut round, &bulk_array(&["10.2.0.1", "6379"]));
        // Straight on to the next sentinel: no connection to 10.2.0.1.
        expect_connect(&mut round, SentinelTarget::Sentinel(1));
        answer(&mut round, &bulk_array(&["evil.example", "6379"]));
        expect_connect(&mut round, SentinelTarget::Sentinel(2));
        answer(&mut round, &bulk_array(&["REDIS.internal", "6379"]));
        expect_connect(
            &mut round,
            SentinelTarget::Master(addr("REDIS.internal", 6379)),
        );
        assert_eq!(
            round.failures(),
            [
                (
                    0,
                    SentinelError::NotAllowed {
                        addr: addr("10.2.0.1", 6379)
                    }
                ),
                (
                    1,
                    SentinelError::NotAllowed {
                        addr: addr("evil.example", 6379)
                    }
                )
            ]
        );
        let message = round.failures()[0].1.to_string();
        assert!(
            message.contains("named 10.2.0.1:6379 as the master, which is not an allowed master"),
            "{message}"
        );
        // The default: private addresses only.
        let mut round = SentinelDiscovery::new("m", 1, 0, None, None);
        expect_connect(&mut round, SentinelTarget::Sentinel(0));
        answer(&mut round, &bulk_array(&["203.0.113.5", "6379"]));
        assert!(matches!(
            round.poll_step(),
            Some(DiscoveryStep::Failed(error))
                if matches!(error.failures[..], [(0, SentinelError::NotAllowed { .. })])
        ));
    }

    #[test]
    fn the_role_is_asked_before_the_password_is_sent() {
        let auth = RedisAuth {
            username: None,
            password: "pw".to_owned(),
        };
        // A node that answers ROLE unauthenticated never sees the password.
        let mut round = SentinelDiscovery::new("m", 2, 0, None, Some(auth.clone()));
        expect_connect(&mut round, SentinelTarget::Sentinel(0));
        answer(&mut round, &bulk_array(&["10.0.0.2", "6379"]));
        expect_connect(&mut round, SentinelTarget::Master(addr("10.0.0.2", 6379)));
        assert_eq!(
            round.poll_transmit().as_deref(),
            Some(&bulk_array(&["ROLE"])[..])
        );
        answer(
            &mut round,
            b"*3\r\n$5\r\nslave\r\n$8\r\n10.0.0.1\r\n:6379\r\n",
        );
        assert_eq!(round.poll_transmit(), None, "no AUTH to a replica");
        // One that demands it first gets it, then is asked again.
        expect_connect(&mut round, SentinelTarget::Sentinel(1));
        answer(&mut round, &bulk_array(&["10.0.0.1", "6379"]));
        expect_connect(&mut round, SentinelTarget::Master(addr("10.0.0.1", 6379)));
        assert_eq!(
            round.poll_transmit().as_deref(),
            Some(&bulk_array(&["ROLE"])[..])
        );
        answer(&mut round, b"-NOAUTH Authentication required.\r\n");
        assert_eq!(round.poll_step(), None);
        let mut expected = bulk_array(&["AUTH", "pw"]);
        expected.extend_from_slice(&bulk_array(&["ROLE"]));
        assert_eq!(round.poll_transmit().as_deref(), Some(&expected[..]));
        answer(&mut round, b"+OK\r\n*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n");
        assert_eq!(
            round.poll_step(),
            Some(DiscoveryStep::Found {
                master: addr("10.0.0.1", 6379),
                sentinel: 1
            })
        );
        // Refused twice, or refused with no credentials to give: a failure.
        let mut round = SentinelDiscovery::new("m", 1, 0, None, None);
        expect_connect(&mut round, SentinelTarget::Sentinel(0));
        answer(&mut round, &bulk_array(&["10.0.0.1", "6379"]));
        expect_connect(&mut round, SentinelTarget::Master(addr("10.0.0.1", 6379)));
        answer(&mut round, b"-NOAUTH Authentication required.\r\n");
        assert!(matches!(
            round.poll_step(),
            Some(DiscoveryStep::Failed(error))
                if matches!(&error.failures[..], [(0, SentinelError::Refused(reply))] if reply.code == "NOAUTH")
        ));
        let mut round = SentinelDiscovery::new("m", 1, 0, None, Some(auth));
        expect_connect(&mut round, SentinelTarget::Sentinel(0));
        answer(&mut round, &bulk_array(&["10.0.0.1", "6379"]));
        expect_connect(&mut round, SentinelTarget::Master(addr("10.0.0.1", 6379)));
        answer(&mut round, b"-NOAUTH Authentication required.\r\n");
        let _ = round.poll_transmit();
        answer(&mut round, b"+OK\r\n-NOPERM no\r\n");
        assert!(matches!(round.poll_step(), Some(DiscoveryStep::Failed(_))));
    }

    #[test]
    fn a_switch_to_a_node_outside_the_allow_list_fails_the_watch() {
        let now = Instant::now();
        let mut watch = SentinelWatch::new("m", None)
            .with_allowed_masters(AllowedMasters::parse(["10.0.0.0/8"]).expect("parses"));
        watch.connected(now);
        watch.handle_input(
            b"*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n",
            now,
        );
        let ok = bulk_array(&["message", "+switch-master", "m 10.0.0.1 1 10.0.0.2 2"]);
        let other = bulk_array(&["message", "+switch-master", "x 10.0.0.1 1 8.8.8.8 2"]);
        let bad = bulk_array(&["message", "+switch-master", "m 10.0.0.2 2 8.8.8.8 2"]);
        for input in [ok, other, bad] {
            watch.handle_input(&input, now);
        }
        assert_eq!(watch.poll_event(), Some(WatchEvent::Watching));
        assert!(matches!(
            watch.poll_event(),
            Some(WatchEvent::Switched { .. })
        ));
        assert_eq!(
            watch.poll_event(),
            Some(WatchEvent::Failed(SentinelError::NotAllowed {
                addr: addr("8.8.8.8", 2)
            }))
        );
    }

    #[test]
    fn the_watch_reports_switches_of_its_service_only() {
        let now = Instant::now();
        let mut watch = SentinelWatch::new("mymaster", None);
        watch.connected(now);
        assert_eq!(
            watch.poll_transmit().as_deref(),
            Some(&bulk_array(&["SUBSCRIBE", "+switch-master"])[..])
        );
        assert_eq!(
            watch.poll_timeout(),
            Some(now + SentinelWatch::PING_TIMEOUT)
        );
        let mut input = bulk_array(&["subscribe", "+switch-master"]);
        input.truncate(input.len() - 2);
        input.extend_from_slice(b"\r\n");
        // `subscribe` confirmations end with an integer count.
        let confirm = b"*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n";
        let other = bulk_array(&["message", "+switch-master", "other 10.0.0.1 1 10.0.0.2 2"]);
        let ours = bulk_array(&[
            "message",
            "+switch-master",
            "mymaster 10.0.0.1 6379 10.0.0.2 6380",
        ]);
        let mut all = confirm.to_vec();
        all.extend_from_slice(&other);
        all.extend_from_slice(&ours);
        for byte in &all {
            watch.handle_input(std::slice::from_ref(byte), now);
        }
        assert_eq!(watch.poll_event(), Some(WatchEvent::Watching));
        assert_eq!(
            watch.poll_event(),
            Some(WatchEvent::Switched {
                from: addr("10.0.0.1", 6379),
                to: addr("10.0.0.2", 6380)
            })
        );
        assert_eq!(watch.poll_event(), None);
        // Keep-alive: a PING when due, the pong clears it, silence fails.
        let ping_at = now + SentinelWatch::PING_INTERVAL;
        assert_eq!(watch.poll_timeout(), Some(ping_at));
        watch.handle_timeout(ping_at);
        assert_eq!(
            watch.poll_transmit().as_deref(),
            Some(&bulk_array(&["PING"])[..])
        );
        watch.handle_input(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n", ping_at);
        assert_eq!(watch.poll_event(), None);
        let next = ping_at + SentinelWatch::PING_INTERVAL;
        watch.handle_timeout(next);
        assert!(watch.poll_transmit().is_some());
        watch.handle_timeout(next + SentinelWatch::PING_TIMEOUT);
        assert_eq!(
            watch.poll_event(),
            Some(WatchEvent::Failed(SentinelError::Timeout))
        );
        assert_eq!(watch.poll_timeout(), None);
    }

    #[test]
    fn a_watch_refused_or_fed_nonsense_fails() {
        let now = Instant::now();
        let auth = RedisAuth {
            username: None,
            password: "pw".to_owned(),
        };
        let mut watch = SentinelWatch::new("m", Some(&auth));
        watch.connected(now);
        let sent = watch.poll_transmit().expect("auth and subscribe");
        assert!(sent.starts_with(&bulk_array(&["AUTH", "pw"])));
        watch.handle_input(b"-WRONGPASS nope\r\n", now);
        assert!(matches!(
            watch.poll_event(),
            Some(WatchEvent::Failed(SentinelError::Refused(_)))
        ));
        let mut watch = SentinelWatch::new("m", None);
        watch.connected(now);
        let bad = bulk_array(&["message", "+switch-master", "m 1.2.3.4 x 5.6.7.8 9"]);
        watch.handle_input(
            b"*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n",
            now,
        );
        watch.handle_input(&bad, now);
        assert_eq!(watch.poll_event(), Some(WatchEvent::Watching));
        assert!(matches!(
            watch.poll_event(),
            Some(WatchEvent::Failed(SentinelError::Malformed(_)))
        ));
    }
}
