//! The fifteen replication commands, as typed values.

use std::fmt;

use bytes::Bytes;
use bytestring::ByteString;

use super::names::{InstanceName, StreamName};
use super::row::RawRow;
use super::token::{RdataToken, Token};

/// One replication command: one line on the wire.
///
/// Decode a line with [`Command::decode`] (or a [`Decoder`](super::Decoder)
/// with your own limits) and encode one with [`Command::encode`].
///
/// ```
/// use synapse_replication::wire::{Command, RdataToken, StreamName, Token};
///
/// let line = br#"RDATA caches master 7 ["get_user_by_id",["@a:example.com"],1700000000000]"#;
/// let command = Command::decode(bytes::Bytes::from_static(line)).unwrap().unwrap();
/// let Command::Rdata(rdata) = &command else { panic!() };
/// assert_eq!(rdata.stream, StreamName::Caches);
/// assert_eq!(rdata.token, RdataToken::At(Token(7)));
/// assert_eq!(command.to_bytes().unwrap(), &line[..]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command {
    /// `SERVER <server_name>`: the first line a direct TCP server sends.
    Server(ByteString),
    /// `RDATA`: one row of a stream.
    Rdata(Rdata),
    /// `POSITION`: a writer's position in a stream.
    Position(Position),
    /// `ERROR <message>`: the peer reports an error, usually before closing.
    Error(ByteString),
    /// `PING <data>`: keep-alive; the data is usually a timestamp in ms.
    Ping(ByteString),
    /// `NAME <name>`: a direct TCP client names itself.
    Name(ByteString),
    /// `REPLICATE`: asks every writer to announce its positions.
    Replicate,
    /// `USER_SYNC`: a user started or stopped syncing on a worker.
    UserSync(UserSync),
    /// `CLEAR_USER_SYNC <instance_id>`: forget every sync of that worker.
    ClearUserSync(InstanceName),
    /// `FEDERATION_ACK`: the federation sender processed up to a token.
    FederationAck(FederationAck),
    /// `USER_IP`: a worker saw a client's IP and user agent.
    ///
    /// Boxed: it is the largest command and one of the rarest, and a
    /// [`Command`] is moved whole for each of the many `RDATA`.
    UserIp(Box<UserIp>),
    /// `REMOTE_SERVER_UP <server_name>`: a remote server is reachable again.
    RemoteServerUp(ByteString),
    /// `LOCK_RELEASED`: a database lock was released.
    LockReleased(LockReleased),
    /// `NEW_ACTIVE_TASK <task_id>`: a scheduled task is ready to run.
    NewActiveTask(ByteString),
    /// `CANCEL_TASK <task_id>`: a scheduled task was cancelled.
    CancelTask(ByteString),
}

/// `RDATA <stream> <instance> <token> <row_json>`: one row of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rdata {
    /// The stream the row belongs to.
    pub stream: StreamName,
    /// The writer that wrote the row.
    pub instance: InstanceName,
    /// The row's token, or `batch` when more rows with the same token follow.
    pub token: RdataToken,
    /// The row, as validated JSON text (decode it with the `streams` module).
    pub row: RawRow,
}

/// `POSITION <stream> <instance> <prev_token> <new_token>`.
///
/// The writer `instance` wrote no rows of `stream` between `prev_token` and
/// `new_token`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Position {
    /// The stream.
    pub stream: StreamName,
    /// The writer whose position this is.
    pub instance: InstanceName,
    /// The last token the writer announced before this one.
    pub prev_token: Token,
    /// The writer's current token.
    pub new_token: Token,
}

/// `USER_SYNC <instance_id> <user_id> <device_id> <start|end> <last_sync_ms>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UserSync {
    /// The process the user syncs on, by its instance *id*: Synapse sends
    /// `hs.get_instance_id()`, a random id that changes at every start (not
    /// the worker's name), and `CLEAR_USER_SYNC` names the same id.
    pub instance_id: InstanceName,
    /// The Matrix user id.
    pub user_id: ByteString,
    /// The device, if known (written as the literal `None` otherwise).
    pub device_id: Option<ByteString>,
    /// `start` (true) or `end` (false).
    pub is_syncing: bool,
    /// When the user last synced, in ms since the epoch.
    pub last_sync_ms: i64,
}

/// `FEDERATION_ACK <instance_name> <token>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FederationAck {
    /// The federation sender.
    pub instance: InstanceName,
    /// The `federation` stream token processed.
    pub token: Token,
}

/// `USER_IP <user_id> [access_token, ip, user_agent, device_id, last_seen]`.
///
/// Published on the channel `<prefix>/USER_IP` over Redis. Its `Debug`
/// output hides the access token.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UserIp {
    /// The Matrix user id.
    pub user_id: ByteString,
    /// The access token used (a secret: never log it).
    pub access_token: ByteString,
    /// The client's IP address.
    pub ip: ByteString,
    /// The client's user agent.
    pub user_agent: ByteString,
    /// The device, if known.
    pub device_id: Option<ByteString>,
    /// When the client was seen, in ms since the epoch.
    pub last_seen: i64,
}

impl fmt::Debug for UserIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserIp")
            .field("user_id", &self.user_id)
            .field("access_token", &"<redacted>")
            .field("ip", &self.ip)
            .field("user_agent", &self.user_agent)
            .field("device_id", &self.device_id)
            .field("last_seen", &self.last_seen)
            .finish()
    }
}

/// `LOCK_RELEASED [instance_name, lock_name, lock_key]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockReleased {
    /// The instance that held the lock.
    pub instance: InstanceName,
    /// The lock's name.
    pub lock_name: ByteString,
    /// The lock's key.
    pub lock_key: ByteString,
}

/// Which end of a direct TCP connection sends a command.
///
/// Over Redis every process both sends and receives every command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The server end (Synapse's main process, historically).
    Server,
    /// The client end (a worker).
    Client,
}

macro_rules! command_kinds {
    ($( $(#[$doc:meta])* $kind:ident => $name:literal / $bytes:literal, server: $server:literal, client: $client:literal; )*) => {
        /// The name of a command, without its arguments.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum CommandKind {
            $( $(#[$doc])* $kind, )*
        }

        impl CommandKind {
            /// Every command, in the order of Synapse's `_COMMANDS`.
            pub const ALL: &'static [CommandKind] = &[ $( CommandKind::$kind, )* ];

            /// The name as written on the wire.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( CommandKind::$kind => $name, )*
                }
            }

            /// The command with this exact (case-sensitive) wire name.
            pub fn from_name(name: &[u8]) -> Option<CommandKind> {
                match name {
                    $( $bytes => Some(CommandKind::$kind), )*
                    _ => None,
                }
            }

            /// Whether `side` may send this command on a direct TCP connection
            /// (Synapse's `VALID_SERVER_COMMANDS` and `VALID_CLIENT_COMMANDS`).
            pub const fn may_be_sent_by(self, side: Side) -> bool {
                match side {
                    Side::Server => match self { $( CommandKind::$kind => $server, )* },
                    Side::Client => match self { $( CommandKind::$kind => $client, )* },
                }
            }
        }
    };
}

command_kinds! {
    /// `SERVER`
    Server => "SERVER" / b"SERVER", server: true, client: false;
    /// `RDATA`
    Rdata => "RDATA" / b"RDATA", server: true, client: false;
    /// `POSITION`
    Position => "POSITION" / b"POSITION", server: true, client: false;
    /// `ERROR`
    Error => "ERROR" / b"ERROR", server: true, client: true;
    /// `PING`
    Ping => "PING" / b"PING", server: true, client: true;
    /// `NAME`
    Name => "NAME" / b"NAME", server: false, client: true;
    /// `REPLICATE`
    Replicate => "REPLICATE" / b"REPLICATE", server: false, client: true;
    /// `USER_SYNC`
    UserSync => "USER_SYNC" / b"USER_SYNC", server: false, client: true;
    /// `FEDERATION_ACK`
    FederationAck => "FEDERATION_ACK" / b"FEDERATION_ACK", server: false, client: true;
    /// `USER_IP`
    UserIp => "USER_IP" / b"USER_IP", server: false, client: true;
    /// `REMOTE_SERVER_UP`
    RemoteServerUp => "REMOTE_SERVER_UP" / b"REMOTE_SERVER_UP", server: true, client: true;
    /// `CLEAR_USER_SYNC`
    ClearUserSync => "CLEAR_USER_SYNC" / b"CLEAR_USER_SYNC", server: false, client: true;
    /// `LOCK_RELEASED`
    LockReleased => "LOCK_RELEASED" / b"LOCK_RELEASED", server: true, client: true;
    /// `NEW_ACTIVE_TASK`
    NewActiveTask => "NEW_ACTIVE_TASK" / b"NEW_ACTIVE_TASK", server: false, client: false;
    /// `CANCEL_TASK`
    CancelTask => "CANCEL_TASK" / b"CANCEL_TASK", server: false, client: false;
}

impl CommandKind {
    /// The Redis channel suffix this command is published on, if not the
    /// bare prefix: `USER_IP` goes to `<prefix>/USER_IP`.
    pub const fn redis_channel_suffix(self) -> Option<&'static str> {
        match self {
            CommandKind::UserIp => Some("USER_IP"),
            _ => None,
        }
    }
}

impl fmt::Display for CommandKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Command {
    /// The command's name.
    pub fn kind(&self) -> CommandKind {
        match self {
            Command::Server(_) => CommandKind::Server,
            Command::Rdata(_) => CommandKind::Rdata,
            Command::Position(_) => CommandKind::Position,
            Command::Error(_) => CommandKind::Error,
            Command::Ping(_) => CommandKind::Ping,
            Command::Name(_) => CommandKind::Name,
            Command::Replicate => CommandKind::Replicate,
            Command::UserSync(_) => CommandKind::UserSync,
            Command::ClearUserSync(_) => CommandKind::ClearUserSync,
            Command::FederationAck(_) => CommandKind::FederationAck,
            Command::UserIp(_) => CommandKind::UserIp,
            Command::RemoteServerUp(_) => CommandKind::RemoteServerUp,
            Command::LockReleased(_) => CommandKind::LockReleased,
            Command::NewActiveTask(_) => CommandKind::NewActiveTask,
            Command::CancelTask(_) => CommandKind::CancelTask,
        }
    }

    /// Encodes the command as one line (without the `\n`), as Synapse writes it.
    pub fn to_bytes(&self) -> Result<Bytes, super::EncodeError> {
        let mut out = bytes::BytesMut::new();
        self.encode(&mut out)?;
        Ok(out.freeze())
    }
}

impl From<Rdata> for Command {
    fn from(rdata: Rdata) -> Self {
        Command::Rdata(rdata)
    }
}

impl From<Position> for Command {
    fn from(position: Position) -> Self {
        Command::Position(position)
    }
}
