//! Replication over Redis pub/sub, sans-IO: [`RedisSession`].
//!
//! `mod.rs` is the session; `config`, `error`, `events` and `counters` what
//! it takes and gives; `link` one connection's state.

mod config;
mod counters;
mod error;
mod events;
mod link;
mod stats;

pub use config::{RedisLink, RedisSessionConfig};
pub use counters::{CommandCounts, RedisCounters};
pub use error::{RedisError, RedisErrorReply};
pub use events::RedisEvent;
pub use stats::RedisStats;

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::positions::{
    CatchUpError, CatchUpId, CatchUpPage, Follower, FollowerEvent, RejectReason, WriteError, Writer,
};
use crate::resp::{self, Credentials, Frame, Hello, Incoming, Protocol, SubscriptionKind};
use crate::wire::{
    self, Command, CommandKind, DecodeError, Decoder, InstanceName, LostRdata, RawRow, StreamName,
    Token,
};

use super::SendError;
use link::{
    EchoTally, Expect, Link, RateLimited, is_ok, is_position, own_echo, unexpected, usable,
};

/// Replication over Redis pub/sub, sans-IO: one process of a deployment,
/// following the streams others write (its [`Follower`]) and writing its
/// own (its [`Writer`]), over two connections to Redis ([`RedisLink`]).
///
/// One session lives as long as the process; connections come and go. The
/// driver ([`RedisClient`](crate::transport::RedisClient), or your own)
/// opens the links [`wants`](RedisSession::wants) asks for and moves their
/// bytes.
///
/// # Call order
///
/// - When a link's socket is up, call [`connect`](RedisSession::connect):
///   it queues the handshake (`AUTH`, `SELECT`, `CLIENT SETNAME`, and
///   `SUBSCRIBE` on the subscriber).
/// - Give every byte received to [`handle_input`](RedisSession::handle_input),
///   call [`handle_timeout`](RedisSession::handle_timeout) when the time
///   given by [`poll_timeout`](RedisSession::poll_timeout) has passed, and
///   act with [`send`](RedisSession::send), [`write`](RedisSession::write),
///   [`advance`](RedisSession::advance) and the catch-up answers.
/// - **After every input**: drain [`poll_transmit`](RedisSession::poll_transmit)
///   for each link until `None` (write each chunk in order; take a chunk
///   only when the socket can take it), then
///   [`poll_event`](RedisSession::poll_event) until `None`, then read
///   [`poll_timeout`](RedisSession::poll_timeout).
/// - On [`RedisEvent::Closing`], or when a socket fails or closes, drop the
///   socket and call [`disconnected`](RedisSession::disconnected).
/// - Time must not go backwards (an earlier `now` is taken as the last
///   one). `poll_timeout` is never before the last `now`, and handling a
///   timeout at the time it gave moves it forward.
///
/// # Rules (Synapse's `redis.py` and PROTOCOL.md)
///
/// - The subscriber subscribes to the prefix and `prefix/<name>` for each
///   extra channel. Only when Redis has confirmed every channel, and the
///   publisher has finished its handshake, is the session ready: it then
///   publishes `REPLICATE` (once per new subscription, at once: the
///   driver's reconnection backoff spaces subscriptions out) and then the
///   writer's positions. Publishing `REPLICATE` before the subscription is
///   confirmed would lose the answers. Later `REPLICATE`s the application
///   asks for go through the [`Writer`]'s rate limit.
/// - Messages on the subscribed channels are decoded as commands: `RDATA`
///   and `POSITION` go to the follower, `REPLICATE` to the writer (which
///   announces its positions), the rest to the application. A message that
///   does not decode is reported and ignored.
/// - Losing the subscriber makes the follower forget the connection (every
///   stream waits for its next `POSITION`); losing either link makes the
///   writer stop publishing until both are back, when it announces its
///   positions again. Commands sent meanwhile are dropped and counted, or
///   queued up to [`RedisSessionConfig::max_queued_while_disconnected`].
/// - Each link sends `PING` every [`RedisSessionConfig::ping_interval`]; a link
///   that owes a reply and hears nothing for [`RedisSessionConfig::ping_timeout`]
///   is given up, which finds a paused server or a dead network.
/// - This process's own `RDATA` and `POSITION` come back from Redis and are
///   ignored (not even decoded). So are those another process publishes
///   under this process's instance name, as in Synapse, but they are
///   noticed: the session counts what it published since its subscription
///   was confirmed (and what was still unanswered then) against the echoes
///   naming it, and an echo beyond is counted in
///   [`RedisCounters::impostor_echoes`] and warned about. Publishes Redis
///   never ran (lost with a connection) are never told from echoes still
///   on their way, so until the next subscription that many impostor
///   commands may pass as echoes: the count is a lower bound, never a
///   false alarm.
/// - `RDATA` and `POSITION` from an instance the [`Follower`]'s registry
///   does not list as a writer of the stream are rejected by the follower
///   ([`FollowerEvent::Rejected`] with [`RejectReason::NotAWriter`]) and
///   warned about as the sign of a second deployment on this Redis:
///   pub/sub ignores the database number, so two deployments with one
///   server name hear each other whatever `SELECT` says. Give each its own
///   server name or its own Redis. (Rows of a stream every process writes,
///   `caches`, cannot be told apart; a process of the other deployment
///   with this one's name shows as impostor echoes.)
/// - Warnings (malformed messages, impostor echoes, commands from a
///   non-writer) go through `tracing`, at most one of each kind per
///   [`RedisSession::WARNING_INTERVAL`]; the others are counted in
///   [`RedisCounters::suppressed_warnings`], and the events and counters
///   report every message.
///
/// Its [`Debug`] output never shows a secret: of the bytes waiting to be
/// sent or decoded (an `AUTH` with the password, a `USER_IP` with an
/// access token) it shows only how many there are.
pub struct RedisSession {
    options: RedisSessionConfig,
    channels: resp::Channels,
    decoder: Decoder,
    follower: Follower,
    writer: Writer,
    links: [Option<Link>; 2],
    /// Two RESP2 connections (the server refused RESP3, or it was not
    /// asked for).
    two_links: bool,
    ready: bool,
    /// A new subscription owes a `REPLICATE`.
    replicate_owed: bool,
    queued: VecDeque<Command>,
    /// The session's own events, each with the number of the follower's
    /// events that come before it (counted from the start).
    events: VecDeque<(u64, RedisEvent)>,
    /// The count of follower events that come before the front of
    /// `events` (`u64::MAX` while it is empty), kept beside the queue so
    /// that handing over each follower event compares two integers
    /// instead of looking into the queue.
    events_due: u64,
    /// How many of the follower's events `poll_event` has handed over.
    follower_taken: u64,
    counters: RedisCounters,
    now: Option<Instant>,
    /// Reused to encode each published line (no allocation per publish).
    scratch: BytesMut,
    /// Own publishes against own echoes, to notice an impostor.
    echoes: EchoTally,
    /// The warning about malformed messages.
    malformed_warning: RateLimited,
    /// The warning about impostor echoes.
    impostor_warning: RateLimited,
    /// The warning about commands from an instance that is not a writer.
    not_a_writer_warning: RateLimited,
    /// Where the intervals of [`RedisSession::REPLICATE_CHECK_INTERVAL`]
    /// are counted from: the first instant the session was given.
    start: Option<Instant>,
}

impl fmt::Debug for RedisSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSession")
            .field("options", &self.options)
            .field("follower", &self.follower)
            .field("writer", &self.writer)
            .field("links", &self.links)
            .field("two_links", &self.two_links)
            .field("ready", &self.ready)
            .field("replicate_owed", &self.replicate_owed)
            .field("queued", &self.queued.len())
            .field("events", &self.events.len())
            .field("counters", &self.counters)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

impl RedisSession {
    /// A session with `options` that follows with `follower` and writes
    /// with `writer` (both named after this process).
    pub fn new(options: RedisSessionConfig, follower: Follower, writer: Writer) -> RedisSession {
        let channels = resp::Channels::new(options.channels().into_iter().map(Bytes::from));
        RedisSession {
            decoder: Decoder::new().max_line_len(options.max_line_len),
            two_links: !options.single_connection,
            options,
            channels,
            follower,
            writer,
            links: [None, None],
            ready: false,
            replicate_owed: false,
            queued: VecDeque::new(),
            events: VecDeque::new(),
            events_due: u64::MAX,
            follower_taken: 0,
            counters: RedisCounters::default(),
            now: None,
            scratch: BytesMut::new(),
            echoes: EchoTally::default(),
            malformed_warning: RateLimited::default(),
            impostor_warning: RateLimited::default(),
            start: None,
            not_a_writer_warning: RateLimited::default(),
        }
    }

    /// The shortest time between two warnings of one kind (malformed
    /// messages, impostor echoes, commands from a non-writer) logged
    /// through `tracing` (10 s).
    pub const WARNING_INTERVAL: Duration = Duration::from_secs(10);

    /// The interval in which a `REPLICATE` makes the follower check a
    /// writer's next move by a catch-up at most once
    /// ([`Follower::handle_replicate_in`]): any process may publish
    /// `REPLICATE`, in a loop too.
    pub const REPLICATE_CHECK_INTERVAL: Duration = Duration::from_secs(1);

    /// The number of the [`RedisSession::REPLICATE_CHECK_INTERVAL`] that
    /// `now` falls in.
    fn check_interval(&self, now: Instant) -> u64 {
        let since = self
            .start
            .map_or(Duration::ZERO, |start| now.saturating_duration_since(start));
        (since.as_millis() / RedisSession::REPLICATE_CHECK_INTERVAL.as_millis()) as u64
    }

    fn tick(&mut self, now: Instant) -> Instant {
        let now = match self.now {
            Some(last) if last > now => last,
            _ => now,
        };
        self.now = Some(now);
        self.start.get_or_insert(now);
        now
    }

    /// Whether the driver should keep a connection open for `link`: the
    /// subscriber always; the publisher unless one RESP3 connection does
    /// both.
    pub fn wants(&self, link: RedisLink) -> bool {
        match link {
            RedisLink::Subscriber => true,
            RedisLink::Publisher => self.two_links,
        }
    }

    /// The link that publishes.
    fn publisher(&self) -> RedisLink {
        if self.two_links {
            RedisLink::Publisher
        } else {
            RedisLink::Subscriber
        }
    }

    fn link(&self, link: RedisLink) -> Option<&Link> {
        self.links.get(link.index()).and_then(Option::as_ref)
    }

    fn link_mut(&mut self, link: RedisLink) -> Option<&mut Link> {
        self.links.get_mut(link.index()).and_then(Option::as_mut)
    }

    /// A socket for `link` is up: queues its handshake. A link still up is
    /// first considered lost.
    pub fn connect(&mut self, link: RedisLink, now: Instant) {
        let now = self.tick(now);
        if self.link(link).is_some() {
            self.disconnected(link, now);
        }
        let mut conn = Link::new(self.options.resp_limits, now);
        let name = self.options.client_name.as_ref().map(|name| {
            let mut name = name.replace(' ', "_");
            name.push('-');
            name.push_str(link.suffix());
            name
        });
        let credentials = self.options.auth.as_ref().map(|auth| Credentials {
            username: auth.username.as_deref().map(str::as_bytes),
            password: auth.password.as_bytes(),
        });
        let resp3 = !self.two_links && link == RedisLink::Subscriber;
        if resp3 {
            resp::encode_hello(
                &mut conn.out,
                &Hello {
                    protocol: Protocol::Resp3,
                    auth: credentials,
                    client_name: name.as_deref().map(str::as_bytes),
                },
            );
            conn.owe(Expect::Hello, now);
            conn.handshake += 1;
        } else if let Some(credentials) = &credentials {
            resp::encode_auth(&mut conn.out, credentials);
            conn.owe(Expect::Auth, now);
            conn.handshake += 1;
        }
        if let Some(database) = self.options.database {
            resp::encode_select(&mut conn.out, database);
            conn.owe(Expect::Select, now);
            conn.handshake += 1;
        }
        if let (Some(name), false) = (&name, resp3) {
            resp::encode_client_setname(&mut conn.out, name.as_bytes());
            conn.owe(Expect::SetName, now);
            conn.handshake += 1;
        }
        if link == RedisLink::Subscriber {
            let channels: Vec<&[u8]> = self.channels.names().iter().map(|c| &c[..]).collect();
            resp::encode_subscribe(&mut conn.out, &channels);
            for _ in &channels {
                conn.owe(Expect::Subscribe, now);
            }
            conn.unconfirmed = channels.len();
        }
        if let Some(count) = self.counters.connections.get_mut(link.index()) {
            *count += 1;
        }
        if let Some(slot) = self.links.get_mut(link.index()) {
            *slot = Some(conn);
        }
        self.check_ready(now);
    }

    /// `link`'s socket is gone (closed by either side, failed, or closed
    /// after [`RedisEvent::Closing`]).
    pub fn disconnected(&mut self, link: RedisLink, now: Instant) {
        self.tick(now);
        let Some(slot) = self.links.get_mut(link.index()) else {
            return;
        };
        let Some(conn) = slot.take() else {
            return;
        };
        self.echoes.unanswered_lost += conn.unanswered_echoes();
        if link == RedisLink::Subscriber {
            self.follower.disconnected();
            self.replicate_owed = false;
        }
        if self.ready {
            self.ready = false;
            self.writer.disconnected();
        }
    }

    fn check_ready(&mut self, now: Instant) {
        if self.ready {
            return;
        }
        let subscriber = self.link(RedisLink::Subscriber);
        if !usable(subscriber) {
            return;
        }
        if self.two_links && !usable(self.link(RedisLink::Publisher)) {
            return;
        }
        self.ready = true;
        self.counters.ready += 1;
        if self.replicate_owed {
            // Not through the writer's rate limit: the reconnection backoff
            // already spaces subscriptions out, and a follower must not wait
            // for positions after a new subscription.
            self.replicate_owed = false;
            self.publish(&Command::Replicate);
        }
        self.writer.connected(now);
        self.push_event(RedisEvent::Ready);
        self.drain_writer();
        while let Some(command) = self.queued.pop_front() {
            self.publish(&command);
        }
    }

    /// Handles bytes received on `link`, in any chunks. Ignored when the
    /// link is not connected or was given up. Timers due at `now` are
    /// handled too.
    pub fn handle_input(&mut self, link: RedisLink, data: &[u8], now: Instant) {
        let now = self.tick(now);
        let Some(conn) = self.link_mut(link) else {
            return;
        };
        if conn.failed {
            return;
        }
        let left = conn.input.len();
        conn.input.extend_from_slice(data);
        conn.last_progress = now;
        if link == RedisLink::Subscriber {
            self.handle_messages(left, now);
        }
        while let Some(conn) = self.links.get_mut(link.index()).and_then(Option::as_mut) {
            if conn.failed {
                break;
            }
            if link == RedisLink::Subscriber {
                if let Some((index, payload)) = conn
                    .decoder
                    .decode_message_on(&mut conn.input, &self.channels)
                {
                    self.handle_payload(index, payload, now);
                    continue;
                }
            }
            let incoming = match conn.decoder.decode_pubsub(&mut conn.input) {
                Ok(Some(incoming)) => incoming,
                Ok(None) => break,
                Err(error) => {
                    self.fail(link, RedisError::Protocol(error));
                    break;
                }
            };
            if let Err(error) = self.handle_incoming(link, incoming, now) {
                self.fail(link, error);
                break;
            }
        }
        self.drain_writer();
        self.handle_timeout(now);
    }

    fn handle_incoming(
        &mut self,
        link: RedisLink,
        incoming: Incoming,
        now: Instant,
    ) -> Result<(), RedisError> {
        match incoming {
            Incoming::Message(message) if link == RedisLink::Subscriber => {
                self.handle_message(message.channel, message.payload, now);
                Ok(())
            }
            Incoming::Message(_) => Err(RedisError::Unexpected(
                "a pub/sub message on the publisher".to_owned(),
            )),
            Incoming::Subscription { kind, channel, .. } => {
                let expected = kind == SubscriptionKind::Subscribe
                    && channel
                        .as_ref()
                        .is_some_and(|channel| self.channels.index(channel).is_some());
                let reply = self.take_expect(link)?;
                if !expected || reply != Expect::Subscribe {
                    return Err(RedisError::Unexpected(format!(
                        "{kind:?} confirmation while waiting for {reply:?}"
                    )));
                }
                if let Some(conn) = self.link_mut(link) {
                    conn.unconfirmed = conn.unconfirmed.saturating_sub(1);
                    if conn.unconfirmed == 0 {
                        self.follower.connected();
                        self.replicate_owed = true;
                        self.restart_echo_tally();
                    }
                }
                self.check_ready(now);
                Ok(())
            }
            Incoming::Pong(_) => match self.take_expect(link)? {
                Expect::Ping => Ok(()),
                other => Err(RedisError::Unexpected(format!(
                    "PONG while waiting for {other:?}"
                ))),
            },
            Incoming::Frame(frame) => self.handle_reply(link, frame, now),
        }
    }

    fn take_expect(&mut self, link: RedisLink) -> Result<Expect, RedisError> {
        self.link_mut(link)
            .and_then(Link::take)
            .ok_or_else(|| RedisError::Unexpected("a reply to nothing".to_owned()))
    }

    fn handle_reply(
        &mut self,
        link: RedisLink,
        frame: Frame,
        now: Instant,
    ) -> Result<(), RedisError> {
        if let Frame::Push(_) = frame {
            // RESP3 pushes other than messages (e.g. invalidations) answer
            // nothing.
            return Ok(());
        }
        let expect = self.take_expect(link)?;
        let error = RedisErrorReply::from_frame(&frame);
        if let Some(error) = error.as_ref().filter(|error| error.code == "NOAUTH") {
            // Redis wants a password this session has not given (or gave
            // one it does not take): nothing else will work either.
            return Err(RedisError::Auth(error.clone()));
        }
        match (expect, error) {
            (Expect::Publish(command), Some(error)) => {
                self.counters.publish_errors += 1;
                self.push_event(RedisEvent::PublishFailed { command, error });
                Ok(())
            }
            (Expect::Publish(_), None) => match frame {
                Frame::Integer(_) => Ok(()),
                other => Err(unexpected(expect, &other)),
            },
            (Expect::Hello, Some(error)) if error.code == "WRONGPASS" => {
                Err(RedisError::Auth(error))
            }
            (Expect::Hello, Some(error)) => {
                self.two_links = true;
                Err(RedisError::Resp3Unsupported(error))
            }
            (Expect::Auth, Some(error)) => Err(RedisError::Auth(error)),
            (Expect::Hello, None) if !matches!(frame, Frame::Map(_) | Frame::Array(_)) => {
                Err(unexpected(expect, &frame))
            }
            (Expect::Select, Some(error)) => Err(RedisError::Select {
                database: self.options.database.unwrap_or_default(),
                error,
            }),
            (Expect::Subscribe, Some(error)) => Err(RedisError::Subscribe(error)),
            // A refused name or PING is not worth a connection.
            (Expect::SetName | Expect::Ping, _) => self.handshake_step(link, expect, now),
            (Expect::Hello | Expect::Auth | Expect::Select, None) => {
                if !matches!(expect, Expect::Hello) && !is_ok(&frame) {
                    return Err(unexpected(expect, &frame));
                }
                self.handshake_step(link, expect, now)
            }
            (Expect::Subscribe, None) => Err(unexpected(expect, &frame)),
        }
    }

    fn handshake_step(
        &mut self,
        link: RedisLink,
        expect: Expect,
        now: Instant,
    ) -> Result<(), RedisError> {
        if expect == Expect::Ping {
            return Ok(());
        }
        if let Some(conn) = self.link_mut(link) {
            conn.handshake = conn.handshake.saturating_sub(1);
        }
        self.check_ready(now);
        Ok(())
    }

    fn handle_message(&mut self, channel: Bytes, payload: Bytes, now: Instant) {
        match self.channels.index(&channel) {
            Some(index) => self.handle_payload(index, payload, now),
            None => self.counters.foreign_messages += 1,
        }
    }

    /// The subscriber's run of messages at the front of its buffer, read
    /// from one frozen view of the buffer: each payload a slice of it (one
    /// reference count), with no bookkeeping of the buffer per message.
    /// From the first frame this path does not take (often the incomplete
    /// last one), the rest goes back to the buffer for the general loop.
    ///
    /// `left` bytes at the front of the buffer were there before this read:
    /// a frame the last read cut short, which the general loop has scanned
    /// as far as it went. A short one is scanned again from its start (the
    /// decoder's progress is only a shortcut: the buffer still holds the
    /// frame) rather than sending the whole read down the general loop.
    fn handle_messages(&mut self, left: usize, now: Instant) {
        /// Above this, the frame cut short is left to the general loop.
        const RESCAN_MAX: usize = 16 << 10;
        let link = RedisLink::Subscriber;
        let Some(conn) = self.link_mut(link) else {
            return;
        };
        if !conn.decoder.is_idle() {
            if left > RESCAN_MAX {
                return;
            }
            conn.decoder.reset();
        }
        if conn.input.is_empty() {
            return;
        }
        let chunk = conn.input.split().freeze();
        let mut at = 0;
        while let Some(conn) = self.links.get_mut(link.index()).and_then(Option::as_mut) {
            if conn.failed {
                return;
            }
            match conn.decoder.decode_message_at(&chunk, at, &self.channels) {
                Some((index, payload, end)) => {
                    at = end;
                    self.handle_payload(index, payload, now);
                }
                None => {
                    conn.input
                        .extend_from_slice(chunk.get(at..).unwrap_or_default());
                    return;
                }
            }
        }
    }

    /// A message on the subscribed channel `channel` (an index in
    /// `self.channels`).
    ///
    /// This process's own `RDATA` and `POSITION` come back from Redis; the
    /// follower ignores them: they are not decoded (and validated). The
    /// decoder looks for them (as `own_echo` does) from the stream's name
    /// it reads anyway, and each line's kind is looked at once.
    fn handle_payload(&mut self, channel: usize, payload: Bytes, now: Instant) {
        if self.options.report_received {
            return self.handle_reported_payload(channel, payload, now);
        }
        let own = self.follower.own_name().as_bytes();
        // Most messages are rows: decoded as rows, not commands, and
        // handed to the follower as they are.
        if wire::is_rdata(&payload) {
            match self.decoder.decode_rdata_unless_from(payload, own) {
                Ok(Some(rdata)) => {
                    self.counters.received.add(CommandKind::Rdata);
                    self.follower.handle_rdata(rdata);
                }
                Ok(None) => self.own_echo_received(CommandKind::Rdata, now),
                Err(failed) => self.malformed(channel, *failed, now),
            }
            return;
        }
        if is_position(&payload) {
            match self.decoder.decode_position_unless_from(&payload, own) {
                Ok(Some(position)) => {
                    self.counters.received.add(CommandKind::Position);
                    self.follower.handle_position(position);
                }
                Ok(None) => self.own_echo_received(CommandKind::Position, now),
                Err(failed) => self.malformed(channel, *failed, now),
            }
            return;
        }
        // Neither an `RDATA` nor a `POSITION`: not an echo.
        match self.decoder.decode_other_salvaging(payload) {
            Ok(Some(command)) => {
                self.counters.received.add(command.kind());
                self.handle_command(command, now);
            }
            Ok(None) => {}
            Err(failed) => self.malformed(channel, *failed, now),
        }
    }

    /// [`RedisSession::handle_payload`] when every command received is
    /// reported: own echoes are counted, and decoded and reported too.
    fn handle_reported_payload(&mut self, channel: usize, payload: Bytes, now: Instant) {
        if let Some(kind) = own_echo(&payload, self.follower.own_name().as_bytes()) {
            self.count_echo(kind, now);
        }
        let command = match self.decoder.decode_salvaging(payload) {
            Ok(Some(command)) => command,
            Ok(None) => return,
            Err(failed) => return self.malformed(channel, *failed, now),
        };
        self.counters.received.add(command.kind());
        let channel = self
            .channels
            .names()
            .get(channel)
            .cloned()
            .unwrap_or_default();
        self.push_event(RedisEvent::Received {
            channel,
            command: Box::new(command.clone()),
        });
        self.handle_command(command, now);
    }

    /// A command received, counted: to the follower, the writer or the
    /// application.
    fn handle_command(&mut self, command: Command, now: Instant) {
        match command {
            command @ (Command::Rdata(_) | Command::Position(_)) => {
                self.follower.handle_command(command)
            }
            Command::Replicate => {
                // The sender may be a writer back from losing its own
                // connection: the follower checks every writer's next
                // move, by a catch-up at most once an interval.
                let interval = self.check_interval(now);
                self.follower.handle_replicate_in(interval);
                self.writer.handle_replicate(now);
            }
            command => self.push_event(RedisEvent::Command(command)),
        }
    }

    /// An echo of this process's own `RDATA` or `POSITION`, not decoded:
    /// counted as received, and as the follower's.
    fn own_echo_received(&mut self, kind: CommandKind, now: Instant) {
        self.count_echo(kind, now);
        self.counters.received.add(kind);
        self.follower.note_own_echo();
    }

    /// An echo of this process's own `RDATA` or `POSITION`: counted. One
    /// beyond what was published is another process's (ignored too).
    fn count_echo(&mut self, kind: CommandKind, now: Instant) {
        self.echoes.echoed += 1;
        if self.echoes.echoed > self.echoes.published {
            self.impostor_echo(kind, now);
        }
    }

    /// A message on `channel` that is not a command: counted, warned
    /// about (rate limited) and reported; a row that could not be read is
    /// a gap, never a row to step over.
    fn malformed(
        &mut self,
        channel: usize,
        failed: (DecodeError, Option<LostRdata>),
        now: Instant,
    ) {
        let (error, lost) = failed;
        self.counters.malformed += 1;
        let channel = self
            .channels
            .names()
            .get(channel)
            .cloned()
            .unwrap_or_default();
        match self.malformed_warning.allow(now) {
            Some(suppressed) => tracing::warn!(
                instance = %self.follower.own_name(),
                channel = %String::from_utf8_lossy(&channel),
                %error,
                suppressed,
                "ignored a message that is not a command \
                 (`suppressed`: how many more since the last warning)"
            ),
            None => self.counters.suppressed_warnings += 1,
        }
        self.push_event(RedisEvent::Malformed { channel, error });
        if let Some(lost) = lost {
            self.follower.handle_lost_rdata(&lost);
        }
    }

    /// A new subscription is confirmed: echoes start again from what may
    /// still come back of the publishes before it.
    fn restart_echo_tally(&mut self) {
        let unanswered = self
            .link(self.publisher())
            .filter(|conn| !conn.failed)
            .map_or(0, Link::unanswered_echoes);
        self.echoes = EchoTally {
            published: unanswered + self.echoes.unanswered_lost,
            echoed: 0,
            unanswered_lost: 0,
        };
    }

    /// An `RDATA` or `POSITION` naming this process that it did not
    /// publish: counted (not as an echo of its own) and warned about.
    fn impostor_echo(&mut self, kind: CommandKind, now: Instant) {
        self.echoes.echoed -= 1;
        self.counters.impostor_echoes += 1;
        match self.impostor_warning.allow(now) {
            Some(suppressed) => tracing::warn!(
                instance = %self.follower.own_name(),
                command = %kind,
                total = self.counters.impostor_echoes,
                suppressed,
                "another process publishes under this process's instance name; \
                 its RDATA and POSITION are ignored as this process's own \
                 (a process started twice, or a second deployment with the same \
                 server name on this Redis: give each deployment its own server \
                 name or its own Redis)"
            ),
            None => self.counters.suppressed_warnings += 1,
        }
    }

    /// The follower rejected a stream command from `sender`, which the
    /// configuration does not list as a writer of `stream`: warned about
    /// (rows never reach the application).
    fn not_a_writer(&mut self, stream: &StreamName, sender: &InstanceName, command: CommandKind) {
        let Some(now) = self.now else {
            return;
        };
        match self.not_a_writer_warning.allow(now) {
            Some(suppressed) => tracing::warn!(
                instance = %self.follower.own_name(),
                %stream,
                %sender,
                %command,
                rejected = self.follower.counters().rejected,
                suppressed,
                "ignored RDATA or POSITION from an instance the configuration does not \
                 list as a writer of the stream: a second deployment with the same \
                 server name may share this Redis (pub/sub ignores the database \
                 number); give each deployment its own server name or its own Redis \
                 (or, within one deployment, make stream_writers agree)"
            ),
            None => self.counters.suppressed_warnings += 1,
        }
    }

    /// Queues an event of the session's own. The follower's events stay
    /// in the follower's queue, so that a run of rows is not moved through
    /// a second one; this event is marked with how many of them come
    /// before it, and `poll_event` keeps that order. The driver queues
    /// its own events here too, so that one order holds for all.
    pub(crate) fn push_event(&mut self, event: RedisEvent) {
        let before = self.follower_taken + self.follower.queued_events() as u64;
        if self.events.is_empty() {
            self.events_due = before;
        }
        self.events.push_back((before, event));
    }

    /// The session's next own event, whether due or not.
    fn pop_own_event(&mut self) -> Option<RedisEvent> {
        let (_, event) = self.events.pop_front()?;
        self.events_due = self.events.front().map_or(u64::MAX, |(before, _)| *before);
        Some(event)
    }

    fn drain_writer(&mut self) {
        while let Some(command) = self.writer.poll_command() {
            self.publish(&command);
        }
    }

    /// Appends a `PUBLISH` of `command` to the publisher's output.
    fn publish(&mut self, command: &Command) {
        let kind = command.kind();
        let mut line = std::mem::take(&mut self.scratch);
        line.clear();
        if command.encode(&mut line).is_err() {
            // Commands from the writer always encode; the application's
            // were encoded once already by `send`.
            self.counters.dropped.add(kind);
            self.scratch = line;
            return;
        }
        self.publish_line(kind, &line);
        self.scratch = line;
    }

    /// Appends a `PUBLISH` of an encoded line to the publisher's output.
    fn publish_line(&mut self, kind: CommandKind, line: &[u8]) {
        let suffix = kind.redis_channel_suffix();
        let publisher = self.publisher();
        let max = self.options.max_unsent_bytes;
        let (Some(conn), Some(now)) = (
            self.links
                .get_mut(publisher.index())
                .and_then(Option::as_mut)
                .filter(|conn| !conn.failed),
            self.now,
        ) else {
            self.counters.dropped.add(kind);
            return;
        };
        let prefix = self.options.prefix.as_bytes();
        match suffix {
            None => resp::encode_publish(&mut conn.out, prefix, line),
            Some(suffix) => {
                let mut channel = Vec::with_capacity(prefix.len() + 1 + suffix.len());
                channel.extend_from_slice(prefix);
                channel.push(b'/');
                channel.extend_from_slice(suffix.as_bytes());
                resp::encode_publish(&mut conn.out, &channel, line);
            }
        }
        conn.owe(Expect::Publish(kind), now);
        let unsent = conn.out.len();
        self.counters.published.add(kind);
        if matches!(kind, CommandKind::Rdata | CommandKind::Position) {
            self.echoes.published += 1;
        }
        if unsent > max {
            self.fail(publisher, RedisError::FailedToKeepUp(unsent));
        }
    }

    fn fail(&mut self, link: RedisLink, error: RedisError) {
        let Some(conn) = self.link_mut(link) else {
            return;
        };
        if conn.failed {
            return;
        }
        conn.failed = true;
        conn.out.clear();
        conn.input.clear();
        let unanswered = conn.unanswered_echoes();
        conn.expect.clear();
        self.echoes.unanswered_lost += unanswered;
        // Not ready from now on: nothing more may be published on a link
        // given up (it would be lost without being counted).
        if self.ready {
            self.ready = false;
            self.writer.disconnected();
        }
        if let Some(count) = self.counters.failures.get_mut(link.index()) {
            *count += 1;
        }
        *self.counters.closes.entry(error.reason()).or_default() += 1;
        if let Some(conn) = self.link_mut(link) {
            conn.failure = Some(error.clone());
        }
        self.push_event(RedisEvent::Closing { link, error });
    }

    /// Handles the timers due at `now`: `PING`s, and giving up links that
    /// owe replies and have been silent too long.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.tick(now);
        let interval = self
            .options
            .ping_interval
            .max(RedisSessionConfig::MIN_TIMER);
        let timeout = self.options.ping_timeout.max(RedisSessionConfig::MIN_TIMER);
        for link in RedisLink::BOTH {
            let Some(conn) = self.link_mut(link) else {
                continue;
            };
            if conn.failed {
                continue;
            }
            let silent = now.saturating_duration_since(conn.last_progress);
            if !conn.expect.is_empty() && silent >= timeout {
                self.fail(link, RedisError::Timeout(silent));
                continue;
            }
            if now.saturating_duration_since(conn.last_ping) >= interval {
                resp::encode_ping(&mut conn.out, None);
                conn.owe(Expect::Ping, now);
                conn.last_ping = now;
            }
        }
        if self.follower.has_deferred_checks() {
            let interval = self.check_interval(now);
            self.follower.begin_interval(interval);
        }
        self.writer.handle_timeout(now);
        self.drain_writer();
    }

    /// Publishes a command for the other processes: `USER_SYNC`,
    /// `CLEAR_USER_SYNC`, `FEDERATION_ACK`, `USER_IP`, `REMOTE_SERVER_UP`,
    /// `LOCK_RELEASED`, `NEW_ACTIVE_TASK`, `CANCEL_TASK`.
    ///
    /// Stream commands go through the writer ([`write`](RedisSession::write),
    /// [`advance`](RedisSession::advance),
    /// [`request_replicate`](RedisSession::request_replicate)), which keeps
    /// positions consistent: `RDATA`, `POSITION` and `REPLICATE` are
    /// refused here, as are `SERVER` and `NAME`, which mean nothing over
    /// Redis. While the session is not ready the command is queued (up to
    /// [`RedisSessionConfig::max_queued_while_disconnected`]) or dropped, counted
    /// in [`RedisCounters::dropped`], with [`SendError::NotConnected`].
    pub fn send(&mut self, command: Command) -> Result<(), SendError> {
        let kind = command.kind();
        if matches!(
            kind,
            CommandKind::Rdata
                | CommandKind::Position
                | CommandKind::Replicate
                | CommandKind::Server
                | CommandKind::Name
        ) {
            return Err(SendError::NotOverRedis(kind));
        }
        let mut line = std::mem::take(&mut self.scratch);
        line.clear();
        let encoded = command.encode(&mut line);
        let len = line.len();
        let publish = encoded.is_ok() && len <= self.options.max_line_len && self.ready;
        if publish {
            self.publish_line(kind, &line);
        }
        self.scratch = line;
        encoded?;
        if len > self.options.max_line_len {
            return Err(SendError::LineTooLong {
                len,
                max: self.options.max_line_len,
            });
        }
        if publish {
            return Ok(());
        }
        if self.queued.len() < self.options.max_queued_while_disconnected {
            self.queued.push_back(command);
            return Ok(());
        }
        self.counters.dropped.add(kind);
        Err(SendError::NotConnected)
    }

    /// Writes rows of `stream` up to its `current` token (see
    /// [`Writer::write`]): published as `RDATA` and `POSITION` when ready;
    /// otherwise announced on the next connection.
    pub fn write(
        &mut self,
        stream: &StreamName,
        current: Token,
        updates: impl IntoIterator<Item = (Token, RawRow)>,
    ) -> Result<(), WriteError> {
        let result = self.writer.write(stream, current, updates);
        self.drain_writer();
        result
    }

    /// Moves `stream`'s token without rows (see [`Writer::advance`]).
    pub fn advance(&mut self, stream: &StreamName, current: Token) -> Result<(), WriteError> {
        let result = self.writer.advance(stream, current);
        self.drain_writer();
        result
    }

    /// Asks every writer for its positions (`REPLICATE`), rate limited (see
    /// [`Writer::request_replicate`]).
    pub fn request_replicate(&mut self, now: Instant) {
        let now = self.tick(now);
        self.writer.request_replicate(now);
        self.drain_writer();
    }

    /// Applies a page of the answer to catch-up `id` (see
    /// [`Follower::handle_catch_up`]); drain events after.
    pub fn handle_catch_up(
        &mut self,
        id: CatchUpId,
        page: CatchUpPage,
    ) -> Result<(), CatchUpError> {
        self.follower.handle_catch_up(id, page)
    }

    /// Catch-up `id` could not be fetched: it is asked again with a new id
    /// (see [`Follower::catch_up_failed`]); drain events after.
    pub fn catch_up_failed(&mut self, id: CatchUpId) -> Result<(), CatchUpError> {
        self.follower.catch_up_failed(id)
    }

    /// The next event if it is the follower's rows or position, which is
    /// nearly every event: the client's hand-over takes it straight from
    /// the follower's queue, wrapped once, with no other check.
    #[inline(always)]
    pub(crate) fn poll_rows_event(&mut self) -> Option<RedisEvent> {
        if self.events_due <= self.follower_taken {
            return None;
        }
        if !matches!(
            self.follower.peek_event(),
            Some(FollowerEvent::Rows { .. } | FollowerEvent::Position { .. })
        ) {
            return None;
        }
        self.follower_taken += 1;
        self.follower.poll_event().map(RedisEvent::Follower)
    }

    /// The next event, or `None`. Drain after every input.
    #[must_use]
    #[inline(always)]
    pub fn poll_event(&mut self) -> Option<RedisEvent> {
        if self.events_due <= self.follower_taken {
            return self.pop_own_event();
        }
        if let Some(event) = self.follower.poll_event() {
            self.follower_taken += 1;
            if let FollowerEvent::Rejected {
                stream,
                instance,
                command,
                reason: RejectReason::NotAWriter,
            } = &event
            {
                self.not_a_writer(stream, instance, *command);
            }
            return Some(RedisEvent::Follower(event));
        }
        // Only if the application took the follower's events itself
        // (through `follower_mut`): nothing is left to wait for.
        self.pop_own_event()
    }

    /// The next bytes to write on `link`, or `None`: everything queued, in
    /// one chunk. Take it only when the socket can take it.
    #[must_use]
    pub fn poll_transmit(&mut self, link: RedisLink) -> Option<Bytes> {
        let conn = self.link_mut(link)?;
        if conn.failed || conn.out.is_empty() {
            return None;
        }
        Some(conn.out.split().freeze())
    }

    /// When [`handle_timeout`](RedisSession::handle_timeout) must be called
    /// next; `None` while no link is up. Never before the last `now` given.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let links = self
            .links
            .iter()
            .flatten()
            .filter_map(|link| link.deadline(&self.options));
        let checks = self
            .follower
            .has_deferred_checks()
            .then(|| {
                let next = u32::try_from(self.check_interval(self.now?) + 1).ok()?;
                self.start?
                    .checked_add(RedisSession::REPLICATE_CHECK_INTERVAL.checked_mul(next)?)
            })
            .flatten();
        let deadline = links
            .chain(self.writer.poll_timeout())
            .chain(checks)
            .min()?;
        Some(match self.now {
            Some(now) => deadline.max(now),
            None => deadline,
        })
    }

    /// Whether every channel is subscribed and the publisher is up.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Whether `link` is connected (and not given up).
    pub fn is_connected(&self, link: RedisLink) -> bool {
        self.link(link).is_some_and(|conn| !conn.failed)
    }

    /// Bytes received on the subscriber and not yet decoded (part of a
    /// frame): with [`RedisSession::unsent_bytes`] and the follower's
    /// queues, how far behind this process is.
    pub fn buffered_input(&self) -> usize {
        self.link(RedisLink::Subscriber)
            .map_or(0, |conn| conn.input.len())
    }

    /// Bytes queued for `link` and not yet taken by `poll_transmit`.
    pub fn unsent_bytes(&self, link: RedisLink) -> usize {
        self.link(link).map_or(0, |conn| conn.out.len())
    }

    /// Commands queued until the session is ready.
    pub fn queued_commands(&self) -> usize {
        self.queued.len()
    }

    /// What the session has done so far.
    pub fn counters(&self) -> &RedisCounters {
        &self.counters
    }

    /// A snapshot of how far behind this process is and what it has done,
    /// for operators (see [`RedisStats`]).
    pub fn stats(&self) -> RedisStats {
        RedisStats {
            ready: self.ready,
            buffered_input: self.buffered_input(),
            unsent_bytes: self.unsent_bytes(self.publisher()),
            queued_commands: self.queued.len(),
            queued_by_stream: self
                .follower
                .queued_by_stream()
                .map(|(stream, count)| (stream.clone(), count))
                .collect(),
            follower_buffered_bytes: self.follower.buffered_bytes(),
            catch_ups: self.follower.outstanding_catch_ups().len(),
            counters: self.counters.clone(),
            refused_commands: 0,
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &RedisSessionConfig {
        &self.options
    }

    /// Why this session gave `link` up (the error of its
    /// [`RedisEvent::Closing`]), until [`RedisSession::disconnected`]; `None`
    /// while the link is usable or not connected.
    pub fn failure(&self, link: RedisLink) -> Option<&RedisError> {
        self.link(link).and_then(|conn| conn.failure.as_ref())
    }

    /// The follower.
    pub fn follower(&self) -> &Follower {
        &self.follower
    }

    /// The follower's events not handed over yet, in order (the session's
    /// own events are never the follower's).
    pub(crate) fn queued_follower_events(&self) -> impl Iterator<Item = &FollowerEvent> {
        self.follower.queued()
    }

    /// The follower, to seed positions ([`Follower::set_position`]) or
    /// forget writers; drain events after, through
    /// [`RedisSession::poll_event`] (taking the follower's events from it
    /// directly would let the session's own events come out of order).
    pub fn follower_mut(&mut self) -> &mut Follower {
        &mut self.follower
    }

    /// The writer.
    pub fn writer(&self) -> &Writer {
        &self.writer
    }

    /// The writer, for the driver to configure (what it writes goes
    /// through [`RedisSession::write`], so that it is sent).
    pub(crate) fn writer_mut(&mut self) -> &mut Writer {
        &mut self.writer
    }

    /// Ends the session, giving back its follower and writer (to carry
    /// their positions into a new session). Links still up count as lost.
    pub fn into_parts(mut self) -> (Follower, Writer) {
        // No `now` means no link was ever connected.
        if let Some(now) = self.now {
            for link in RedisLink::BOTH {
                self.disconnected(link, now);
            }
        }
        // Events the application never took belong to this session.
        while self.follower.poll_event().is_some() {}
        (self.follower, self.writer)
    }
}
