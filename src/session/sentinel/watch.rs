//! Hearing of the sentinels' failovers.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::resp::{Incoming, SubscriptionKind, encode_ping, encode_subscribe};

use super::RedisAuth;

use super::{
    AllowedMasters, Exchange, Expect, MasterAddr, SWITCH_MASTER_CHANNEL, SentinelError,
    error_reply, malformed, parse_switch, short,
};

/// What a [`SentinelWatch`] heard.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WatchEvent {
    /// The sentinel confirmed the subscription: failovers from now on are
    /// heard.
    Watching,
    /// The sentinels switched the service's master (`+switch-master`).
    Switched {
        /// The master before.
        from: MasterAddr,
        /// The master now.
        to: MasterAddr,
    },
    /// The watch gave the connection up: close it and watch through
    /// another sentinel. A switch to a node outside the
    /// [`AllowedMasters`] is [`SentinelError::NotAllowed`].
    Failed(SentinelError),
}

/// A subscription to one sentinel's `+switch-master` announcements for
/// one service (see the [module docs](crate::session::sentinel)).
///
/// Call [`connected`](Self::connected) when the connection is up, give
/// every byte read to [`handle_input`](Self::handle_input), call
/// [`handle_timeout`](Self::handle_timeout) at
/// [`poll_timeout`](Self::poll_timeout); after each, drain
/// [`poll_transmit`](Self::poll_transmit), then
/// [`poll_event`](Self::poll_event). After [`WatchEvent::Failed`] nothing
/// more is read; make a new watch for the next connection.
#[derive(Debug)]
pub struct SentinelWatch {
    service: String,
    allowed: AllowedMasters,
    exchange: Exchange,
    events: VecDeque<WatchEvent>,
    failed: bool,
    /// When the next PING is due.
    ping_at: Option<Instant>,
    /// When the PING in flight is overdue.
    pong_by: Option<Instant>,
}

impl SentinelWatch {
    /// A PING every 5 s.
    pub const PING_INTERVAL: Duration = Duration::from_secs(5);
    /// The connection is given up when a reply is 5 s late.
    pub const PING_TIMEOUT: Duration = Duration::from_secs(5);

    /// A watch of `service`'s failovers, with the sentinels' credentials.
    pub fn new(service: impl Into<String>, auth: Option<&RedisAuth>) -> SentinelWatch {
        let mut exchange = Exchange::new();
        exchange.auth(auth);
        SentinelWatch {
            service: service.into(),
            allowed: AllowedMasters::default(),
            exchange,
            events: VecDeque::new(),
            failed: false,
            ping_at: None,
            pong_by: None,
        }
    }

    /// Switches only to nodes these allow are reported (default
    /// [`AllowedMasters::private_networks`]); one to another node fails
    /// the watch with [`SentinelError::NotAllowed`].
    #[must_use]
    pub fn with_allowed_masters(mut self, allowed: AllowedMasters) -> SentinelWatch {
        self.allowed = allowed;
        self
    }

    /// The connection is up: `AUTH` (if any) and `SUBSCRIBE` are queued.
    pub fn connected(&mut self, now: Instant) {
        encode_subscribe(
            &mut self.exchange.output,
            &[SWITCH_MASTER_CHANNEL.as_bytes()],
        );
        self.exchange.expect.push_back(Expect::Subscribe);
        self.pong_by = Some(now + Self::PING_TIMEOUT);
    }

    /// Bytes to write.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        self.exchange.transmit()
    }

    /// What was heard.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<WatchEvent> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) is due.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.failed {
            return None;
        }
        self.pong_by.or(self.ping_at)
    }

    /// Time passed: a PING is sent, or a late reply gives up.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.failed {
            return;
        }
        if self.pong_by.is_some_and(|by| now >= by) {
            return self.fail(SentinelError::Timeout);
        }
        if self.pong_by.is_none() && self.ping_at.is_some_and(|at| now >= at) {
            encode_ping(&mut self.exchange.output, None);
            self.exchange.expect.push_back(Expect::Ping);
            self.ping_at = None;
            self.pong_by = Some(now + Self::PING_TIMEOUT);
        }
    }

    fn fail(&mut self, error: SentinelError) {
        if !self.failed {
            self.failed = true;
            self.events.push_back(WatchEvent::Failed(error));
        }
    }

    /// Bytes read, in any chunks.
    pub fn handle_input(&mut self, data: &[u8], now: Instant) {
        if self.failed {
            return;
        }
        self.exchange.input.extend_from_slice(data);
        while !self.failed {
            let (expect, incoming) = match self.exchange.next() {
                Ok(Some(reply)) => reply,
                Ok(None) => break,
                Err(error) => return self.fail(error),
            };
            match (expect, incoming) {
                (None, Incoming::Message(message)) => {
                    if &message.channel[..] != SWITCH_MASTER_CHANNEL.as_bytes() {
                        continue;
                    }
                    match parse_switch(&message.payload) {
                        Some((name, _, to))
                            if name == self.service && !self.allowed.allows(&to.host) =>
                        {
                            return self.fail(SentinelError::NotAllowed { addr: to });
                        }
                        Some((name, from, to)) if name == self.service => {
                            self.events.push_back(WatchEvent::Switched { from, to });
                        }
                        Some(_) => {}
                        None => {
                            let error = SentinelError::Malformed(format!(
                                "+switch-master {}",
                                short(&message.payload)
                            ));
                            return self.fail(error);
                        }
                    }
                }
                (None, _) => {}
                (Some(Expect::Auth), Incoming::Frame(frame)) => {
                    if let Some(error) = error_reply(&frame) {
                        return self.fail(SentinelError::Refused(error));
                    }
                }
                (Some(Expect::Subscribe), Incoming::Subscription { kind, channel, .. })
                    if kind == SubscriptionKind::Subscribe
                        && channel.as_deref() == Some(SWITCH_MASTER_CHANNEL.as_bytes()) =>
                {
                    self.pong_by = None;
                    self.ping_at = Some(now + Self::PING_INTERVAL);
                    self.events.push_back(WatchEvent::Watching);
                }
                (Some(Expect::Ping), Incoming::Pong(_)) => {
                    self.pong_by = None;
                    self.ping_at = Some(now + Self::PING_INTERVAL);
                }
                (Some(expect), Incoming::Frame(frame)) => {
                    let error = match error_reply(&frame) {
                        Some(error) => SentinelError::Refused(error),
                        None => malformed(&format!("a reply to {expect:?}"), &frame),
                    };
                    return self.fail(error);
                }
                (Some(expect), _) => {
                    return self.fail(SentinelError::Malformed(format!(
                        "an unexpected reply to {expect:?}"
                    )));
                }
            }
        }
    }
}
