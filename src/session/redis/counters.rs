//! What a Redis session counts: [`RedisCounters`], [`CommandCounts`].

use std::collections::BTreeMap;

use crate::wire::CommandKind;

/// How many commands of each kind, indexed as [`CommandKind::ALL`]. Its
/// `Debug` output names the kinds counted (`{"RDATA": 12, "POSITION": 3}`).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct CommandCounts([u64; CommandKind::ALL.len()]);

impl std::fmt::Debug for CommandCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(
                self.iter()
                    .filter(|(_, count)| *count > 0)
                    .map(|(kind, count)| (kind.as_str(), count)),
            )
            .finish()
    }
}

impl CommandCounts {
    /// The count for `kind`.
    pub fn get(&self, kind: CommandKind) -> u64 {
        self.0.get(kind as usize).copied().unwrap_or(0)
    }

    /// Every kind with a non-zero count.
    pub fn iter(&self) -> impl Iterator<Item = (CommandKind, u64)> + '_ {
        CommandKind::ALL
            .iter()
            .zip(self.0)
            .filter(|(_, count)| *count > 0)
            .map(|(kind, count)| (*kind, count))
    }

    /// The sum over every kind.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    pub(super) fn add(&mut self, kind: CommandKind) {
        if let Some(count) = self.0.get_mut(kind as usize) {
            *count += 1;
        }
    }
}

/// What a [`RedisSession`](crate::session::RedisSession) has done so far, for operators.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisCounters {
    /// Valid commands received, by kind.
    pub received: CommandCounts,
    /// Commands published, by kind.
    pub published: CommandCounts,
    /// Commands dropped because the session was not ready, by kind.
    pub dropped: CommandCounts,
    /// Messages that were not valid commands.
    pub malformed: u64,
    /// `PUBLISH`es Redis refused.
    pub publish_errors: u64,
    /// Messages on channels this session did not subscribe to (ignored).
    pub foreign_messages: u64,
    /// Connections made, per link ([subscriber, publisher]).
    pub connections: [u64; 2],
    /// Connections this session gave up, per link.
    pub failures: [u64; 2],
    /// Times the session became ready.
    pub ready: u64,
    /// Connections given up, by [`RedisError::reason`](crate::session::RedisError::reason) (Synapse's
    /// `synapse_replication_tcp_protocol_close_reason`).
    pub closes: BTreeMap<&'static str, u64>,
    /// `RDATA`s and `POSITION`s naming this process as their sender beyond
    /// what it published itself: another process publishes under its
    /// instance name (a worker started twice, two configured alike, or a
    /// second deployment with the same server name on this Redis).
    /// They are ignored, as this process's own echoes are (Synapse does
    /// the same), counted here, and warned about (see [`RedisSession`](crate::session::RedisSession)).
    pub impostor_echoes: u64,
    /// Warnings not logged because one of their kind was logged less than
    /// [`RedisSession::WARNING_INTERVAL`](crate::session::RedisSession::WARNING_INTERVAL) before (malformed messages,
    /// impostor echoes, commands from a non-writer); the next one logged
    /// says how many it stands for.
    pub suppressed_warnings: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_names_the_kinds_counted() {
        let mut counts = CommandCounts::default();
        counts.add(CommandKind::Rdata);
        counts.add(CommandKind::Rdata);
        counts.add(CommandKind::Position);
        assert_eq!(format!("{counts:?}"), r#"{"RDATA": 2, "POSITION": 1}"#);
        assert_eq!(format!("{:?}", CommandCounts::default()), "{}");
    }
}
