//! What a [`RedisSession`](super::RedisSession) tells the application.

use std::fmt;

use bytes::Bytes;

use crate::positions::FollowerEvent;
use crate::wire::{Command, CommandKind, DecodeError};

use super::{RedisError, RedisErrorReply, RedisLink};

/// What a [`RedisSession`](crate::session::RedisSession) tells the application.
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
    /// written to it.
    Closing {
        /// The connection.
        link: RedisLink,
        /// Why.
        error: RedisError,
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
        }
    }
}
