//! [`RedisEvent`]: what a [`RedisSession`](super::RedisSession), and the
//! [`RedisClient`](crate::transport::RedisClient) that drives one, tell
//! the application.

use std::fmt;
use std::io;
use std::time::Duration;

use bytes::Bytes;

use crate::positions::{BoxError, CatchUpRequest, FollowerEvent, StuckCatchUp, WriteError};
use crate::wire::{Command, CommandKind, DecodeError};

use super::super::error::{Disconnect, SendError};
use super::super::sentinel::SentinelEvent;
use super::{RedisError, RedisErrorReply, RedisLink};

/// What a [`RedisSession`](crate::session::RedisSession) and a
/// [`RedisClient`](crate::transport::RedisClient) tell the application:
/// one event type, whoever builds it. The session builds the first
/// variants; the client adds the connections' ups and downs, its
/// catch-ups' failures and what the sentinels said, from
/// [`Connected`](Self::Connected) on.
///
/// Everything a follower handles is one level deep, in
/// [`Follower`](Self::Follower): rows, positions, the catch-ups it asks
/// for, resets, rejected writers.
///
/// ```
/// use synapse_replication::positions::FollowerEvent;
/// use synapse_replication::session::RedisEvent;
///
/// fn handle(event: RedisEvent) {
///     match event {
///         RedisEvent::Follower(FollowerEvent::Rows { stream, writer, token, rows, .. }) => {
///             println!("{stream} from {writer} at {token}: {} rows", rows.len())
///         }
///         RedisEvent::Command(command) => println!("{}", command.kind()),
///         other => println!("{other}"),
///     }
/// }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisEvent {
    /// Every channel is subscribed and the publisher is up: `REPLICATE`
    /// (after a new subscription) and this process's positions are on
    /// their way. Send what others must hear on every connection now
    /// (Synapse's workers send a `USER_SYNC` per syncing user).
    Ready,
    /// What the [`Follower`](crate::positions::Follower) decided: rows to apply, positions reached,
    /// catch-ups to perform, resets, rejected commands.
    Follower(FollowerEvent),
    /// A command for the application: `USER_SYNC`, `CLEAR_USER_SYNC`,
    /// `FEDERATION_ACK`, `USER_IP`, `REMOTE_SERVER_UP`, `LOCK_RELEASED`,
    /// `NEW_ACTIVE_TASK`, `CANCEL_TASK` (and `ERROR`, `PING`, which Synapse
    /// only logs). This process's own commands come back too: Redis
    /// echoes them.
    Command(Command),
    /// A command received (only with [`RedisSessionConfig::report_received`](crate::session::RedisSessionConfig::report_received)),
    /// before it is acted on.
    Received {
        /// The channel it came on.
        channel: Bytes,
        /// The command (boxed, so that the common events stay small).
        command: Box<Command>,
    },
    /// A message that is not a valid command was ignored (Synapse logs and
    /// ignores it too: each message stands alone). If it was an `RDATA`,
    /// its row is not stepped over: the follower fetches it (see
    /// [`Follower::handle_lost_rdata`](crate::positions::Follower::handle_lost_rdata)).
    Malformed {
        /// The channel it came on.
        channel: Bytes,
        /// Why.
        error: DecodeError,
    },
    /// Redis refused a `PUBLISH` (e.g. `NOPERM`: a read-only ACL user).
    /// The command is lost; for a stream command the next announcement
    /// covers it.
    PublishFailed {
        /// The command refused.
        command: CommandKind,
        /// Redis' answer.
        error: RedisErrorReply,
    },
    /// This session gave up `link`: close the socket, then call
    /// [`RedisSession::disconnected`](crate::session::RedisSession::disconnected). Nothing more will be read from or
    /// written to it. (A [`RedisClient`](crate::transport::RedisClient)
    /// does both, and reports it as [`Disconnected`](Self::Disconnected)
    /// with this error.)
    Closing {
        /// The connection.
        link: RedisLink,
        /// Why.
        error: RedisError,
    },
    /// A connection is up; its handshake is on its way.
    /// [`Ready`](Self::Ready) follows once both are subscribed and
    /// authenticated. (From a client.)
    Connected {
        /// Which.
        link: RedisLink,
    },
    /// Connecting failed; the next attempt is in `retry_in`. (From a
    /// client.)
    ConnectFailed {
        /// Which connection.
        link: RedisLink,
        /// Why.
        error: io::Error,
        /// The delay before the next attempt.
        retry_in: Duration,
    },
    /// A connection ended; the next attempt is in `retry_in`. Losing the
    /// subscriber makes the follower drop what belonged to it; on the next
    /// subscription the writers' `POSITION`s show what was missed, and
    /// catch-ups fetch it. (From a client.)
    Disconnected {
        /// Which connection.
        link: RedisLink,
        /// Why.
        reason: Disconnect,
        /// The delay before reconnecting.
        retry_in: Duration,
    },
    /// The client's [`CatchUpSource`](crate::transport::CatchUpSource)
    /// failed; the catch-up is asked again (with a new id) after
    /// `retry_in`. Only this writer's rows of the stream wait for it. Each
    /// writer's retries back off on their own.
    CatchUpFailed {
        /// The request that failed.
        request: CatchUpRequest,
        /// The source's error.
        error: BoxError,
        /// The delay before asking again.
        retry_in: Duration,
        /// Failures in a row of this writer's catch-up, this one included
        /// (since when: `stuck_catch_ups`, once it is stuck).
        failures: u32,
    },
    /// A catch-up failed
    /// [`STUCK_AFTER_FAILURES`](crate::positions::STUCK_AFTER_FAILURES)
    /// times in a row (reported once per run of failures; it is still
    /// retried). Until it succeeds the client's `stuck_catch_ups` lists it.
    CatchUpStuck(StuckCatchUp),
    /// What the sentinels said (with a sentinel
    /// [`RedisConfig`](crate::config::RedisConfig) only): the master
    /// each link found, failovers, the watch's ups and downs.
    Sentinel(SentinelEvent),
    /// A command given to a
    /// [`CommandSender`](crate::transport::CommandSender) could not be
    /// sent (not ready, or refused); it was dropped.
    SendFailed {
        /// The command.
        command: CommandKind,
        /// Why.
        error: SendError,
    },
    /// Rows given to a [`CommandSender`](crate::transport::CommandSender)'s
    /// `write` were refused by the writer (see [`WriteError`]); nothing
    /// of them was sent or kept.
    WriteFailed {
        /// What was refused.
        error: WriteError,
    },
}

impl fmt::Display for RedisEvent {
    /// One line (rows are counted, not printed; no secret is shown).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let channel = |channel: &Bytes| String::from_utf8_lossy(channel).into_owned();
        match self {
            RedisEvent::Ready => f.write_str("ready"),
            RedisEvent::Follower(event) => write!(f, "{event}"),
            RedisEvent::Command(command) => write!(f, "command {command:?}"),
            RedisEvent::Received {
                channel: on,
                command,
            } => write!(f, "received on {}: {command:?}", channel(on)),
            RedisEvent::Malformed { channel: on, error } => {
                write!(f, "malformed on {}: {error}", channel(on))
            }
            RedisEvent::PublishFailed { command, error } => {
                write!(f, "publishing {command} failed: {error}")
            }
            RedisEvent::Closing { link, error } => write!(f, "closing {link}: {error}"),
            RedisEvent::Connected { link } => write!(f, "connected {link}"),
            RedisEvent::ConnectFailed {
                link,
                error,
                retry_in,
            } => write!(
                f,
                "connecting {link} failed: {error}; retry in {} ms",
                retry_in.as_millis()
            ),
            RedisEvent::Disconnected {
                link,
                reason,
                retry_in,
            } => write!(
                f,
                "disconnected {link}: {reason}; retry in {} ms",
                retry_in.as_millis()
            ),
            RedisEvent::CatchUpFailed {
                request,
                error,
                retry_in,
                failures,
            } => write!(
                f,
                "{request} failed ({failures} in a row): {error}; retry in {} ms",
                retry_in.as_millis()
            ),
            RedisEvent::CatchUpStuck(stuck) => write!(f, "{stuck}"),
            RedisEvent::Sentinel(event) => write!(f, "{event}"),
            RedisEvent::SendFailed { command, error } => {
                write!(f, "sending {command} failed: {error}")
            }
            RedisEvent::WriteFailed { error } => write!(f, "writing failed: {error}"),
        }
    }
}
