//! Synapse's database-backed streams: the sequence each takes its ids from
//! and the tables that hold its rows, as Synapse 1.163.2 builds its
//! `MultiWriterIdGenerator`s (`synapse/storage/databases/main/*.py`,
//! `sequence_name=`).

/// One table of a stream: its name, the column that names the writer, and
/// the column that holds the stream id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamTable {
    /// The table.
    pub table: &'static str,
    /// The column naming the instance that wrote the row (may be NULL in
    /// rows written before Synapse had several writers).
    pub instance_column: &'static str,
    /// The column holding the row's stream id.
    pub id_column: &'static str,
}

/// A database-backed stream as Synapse keeps it: where its ids come from,
/// where its rows are, and its name in `stream_positions`.
///
/// The SQL this crate runs names the sequence and the tables as written
/// here, unquoted: they are Synapse's identifiers, fixed at compile time,
/// never input. A stream of one's own (`DatabaseStream { .. }`) must keep
/// to plain lowercase identifiers too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatabaseStream {
    /// The stream's name in replication commands (`RDATA account_data ...`).
    pub name: &'static str,
    /// The stream's name in `stream_positions.stream_name` (Synapse's
    /// `stream_name=`; not always the replication name: `presence_stream`
    /// for `presence`).
    pub positions_name: &'static str,
    /// The PostgreSQL sequence every writer takes ids from.
    pub sequence: &'static str,
    /// The tables holding the stream's rows, each with `instance_name` and
    /// the stream id.
    pub tables: &'static [StreamTable],
    /// `false` for Synapse's one stream that counts down (`backfill`): its
    /// tables and `stream_positions` hold negated ids, the sequence counts
    /// up. The ids a [`StreamIds`](crate::positions::StreamIds) sees are
    /// positive either way.
    pub positive: bool,
    /// Whether `stream_positions` is read and written for it: not when any
    /// process may write and no one reads the positions (`caches`,
    /// `e2e_cross_signing_keys`: Synapse gives them no writers).
    pub keeps_positions: bool,
}

const fn table(table: &'static str, id_column: &'static str) -> StreamTable {
    StreamTable {
        table,
        instance_column: "instance_name",
        id_column,
    }
}

impl DatabaseStream {
    /// `account_data`: global and room account data and tags.
    pub const ACCOUNT_DATA: DatabaseStream = DatabaseStream {
        name: "account_data",
        positions_name: "account_data",
        sequence: "account_data_sequence",
        tables: &[
            table("room_account_data", "stream_id"),
            table("room_tags_revisions", "stream_id"),
            table("account_data", "stream_id"),
        ],
        positive: true,
        keeps_positions: true,
    };

    /// `caches`: cache invalidations, written by every process.
    pub const CACHES: DatabaseStream = DatabaseStream {
        name: "caches",
        positions_name: "caches",
        sequence: "cache_invalidation_stream_seq",
        tables: &[table("cache_invalidation_stream_by_instance", "stream_id")],
        positive: true,
        keeps_positions: false,
    };

    /// `events`: events and current state changes.
    pub const EVENTS: DatabaseStream = DatabaseStream {
        name: "events",
        positions_name: "events",
        sequence: "events_stream_seq",
        tables: &[
            table("events", "stream_ordering"),
            table("current_state_delta_stream", "stream_id"),
            table("ex_outlier_stream", "event_stream_ordering"),
        ],
        positive: true,
        keeps_positions: true,
    };

    /// `backfill`: backfilled events, with ids counting down.
    pub const BACKFILL: DatabaseStream = DatabaseStream {
        name: "backfill",
        positions_name: "backfill",
        sequence: "events_backfill_stream_seq",
        tables: &[
            table("events", "stream_ordering"),
            table("ex_outlier_stream", "event_stream_ordering"),
        ],
        positive: false,
        keeps_positions: true,
    };

    /// `presence`.
    pub const PRESENCE: DatabaseStream = DatabaseStream {
        name: "presence",
        positions_name: "presence_stream",
        sequence: "presence_stream_sequence",
        tables: &[table("presence_stream", "stream_id")],
        positive: true,
        keeps_positions: true,
    };

    /// `receipts`.
    pub const RECEIPTS: DatabaseStream = DatabaseStream {
        name: "receipts",
        positions_name: "receipts",
        sequence: "receipts_sequence",
        tables: &[table("receipts_linearized", "stream_id")],
        positive: true,
        keeps_positions: true,
    };

    /// `push_rules`.
    pub const PUSH_RULES: DatabaseStream = DatabaseStream {
        name: "push_rules",
        positions_name: "push_rules_stream",
        sequence: "push_rules_stream_sequence",
        tables: &[table("push_rules_stream", "stream_id")],
        positive: true,
        keeps_positions: true,
    };

    /// `pushers` (written by main only).
    pub const PUSHERS: DatabaseStream = DatabaseStream {
        name: "pushers",
        positions_name: "pushers",
        sequence: "pushers_sequence",
        tables: &[
            table("pushers", "id"),
            table("deleted_pushers", "stream_id"),
        ],
        positive: true,
        keeps_positions: true,
    };

    /// `device_lists` (with the `user_signature` rows).
    pub const DEVICE_LISTS: DatabaseStream = DatabaseStream {
        name: "device_lists",
        positions_name: "device_lists_stream",
        sequence: "device_lists_sequence",
        tables: &[
            table("device_lists_stream", "stream_id"),
            table("user_signature_stream", "stream_id"),
            table("device_lists_outbound_pokes", "stream_id"),
            table("device_lists_changes_in_room", "stream_id"),
            table("device_lists_remote_pending", "stream_id"),
            table(
                "device_lists_changes_converted_stream_position",
                "stream_id",
            ),
        ],
        positive: true,
        keeps_positions: true,
    };

    /// `to_device`.
    pub const TO_DEVICE: DatabaseStream = DatabaseStream {
        name: "to_device",
        positions_name: "to_device",
        sequence: "device_inbox_sequence",
        tables: &[
            table("device_inbox", "stream_id"),
            table("device_federation_outbox", "stream_id"),
        ],
        positive: true,
        keeps_positions: true,
    };

    /// `thread_subscriptions`.
    pub const THREAD_SUBSCRIPTIONS: DatabaseStream = DatabaseStream {
        name: "thread_subscriptions",
        positions_name: "thread_subscriptions",
        sequence: "thread_subscriptions_sequence",
        tables: &[table("thread_subscriptions", "stream_id")],
        positive: true,
        keeps_positions: true,
    };

    /// `un_partial_stated_room` (written by main only).
    pub const UN_PARTIAL_STATED_ROOM: DatabaseStream = DatabaseStream {
        name: "un_partial_stated_room",
        positions_name: "un_partial_stated_room_stream",
        sequence: "un_partial_stated_room_stream_sequence",
        tables: &[table("un_partial_stated_room_stream", "stream_id")],
        positive: true,
        keeps_positions: true,
    };

    /// `un_partial_stated_event` (written by main only).
    pub const UN_PARTIAL_STATED_EVENT: DatabaseStream = DatabaseStream {
        name: "un_partial_stated_event",
        positions_name: "un_partial_stated_event_stream",
        sequence: "un_partial_stated_event_stream_sequence",
        tables: &[table("un_partial_stated_event_stream", "stream_id")],
        positive: true,
        keeps_positions: true,
    };

    /// `profile_updates` (written by the event persisters).
    pub const PROFILE_UPDATES: DatabaseStream = DatabaseStream {
        name: "profile_updates",
        positions_name: "profile_updates",
        sequence: "profile_updates_sequence",
        tables: &[table("profile_updates", "stream_id")],
        positive: true,
        keeps_positions: true,
    };

    /// `sticky_events` (written by the event persisters).
    pub const STICKY_EVENTS: DatabaseStream = DatabaseStream {
        name: "sticky_events",
        positions_name: "sticky_events",
        sequence: "sticky_events_sequence",
        tables: &[table("sticky_events", "stream_id")],
        positive: true,
        keeps_positions: true,
    };

    /// `quarantined_media`.
    pub const QUARANTINED_MEDIA: DatabaseStream = DatabaseStream {
        name: "quarantined_media",
        positions_name: "quarantined_media",
        sequence: "quarantined_media_id_seq",
        tables: &[table("quarantined_media_changes", "stream_id")],
        positive: true,
        keeps_positions: true,
    };

    /// `e2e_cross_signing_keys`: ids of cross-signing keys; no replication
    /// stream of its own, any process writes it.
    pub const E2E_CROSS_SIGNING_KEYS: DatabaseStream = DatabaseStream {
        name: "e2e_cross_signing_keys",
        positions_name: "e2e_cross_signing_keys",
        sequence: "e2e_cross_signing_keys_sequence",
        tables: &[table("e2e_cross_signing_keys", "stream_id")],
        positive: true,
        keeps_positions: false,
    };

    /// Every stream Synapse 1.163.2 allocates with a
    /// `MultiWriterIdGenerator`.
    pub const ALL: &'static [DatabaseStream] = &[
        DatabaseStream::ACCOUNT_DATA,
        DatabaseStream::CACHES,
        DatabaseStream::EVENTS,
        DatabaseStream::BACKFILL,
        DatabaseStream::PRESENCE,
        DatabaseStream::RECEIPTS,
        DatabaseStream::PUSH_RULES,
        DatabaseStream::PUSHERS,
        DatabaseStream::DEVICE_LISTS,
        DatabaseStream::TO_DEVICE,
        DatabaseStream::THREAD_SUBSCRIPTIONS,
        DatabaseStream::UN_PARTIAL_STATED_ROOM,
        DatabaseStream::UN_PARTIAL_STATED_EVENT,
        DatabaseStream::PROFILE_UPDATES,
        DatabaseStream::STICKY_EVENTS,
        DatabaseStream::QUARANTINED_MEDIA,
        DatabaseStream::E2E_CROSS_SIGNING_KEYS,
    ];

    /// The stream of a replication stream name (`account_data`, `caches`,
    /// ...), if it lives in the database.
    pub fn named(name: &str) -> Option<&'static DatabaseStream> {
        DatabaseStream::ALL
            .iter()
            .find(|stream| stream.name == name)
    }

    /// `SELECT nextval(...)`, `n` times in one statement, as Synapse's
    /// `PostgresSequenceGenerator.get_next_mult_txn`. Parameter: `n`
    /// (`bigint`).
    pub fn nextval_sql(&self) -> String {
        format!(
            "SELECT nextval('{}') FROM generate_series(1, $1::bigint)",
            self.sequence
        )
    }

    /// `SELECT last_value FROM <sequence>`, as `_load_current_ids` reads
    /// it (`is_called` is not looked at there either).
    pub fn last_value_sql(&self) -> String {
        format!("SELECT last_value FROM {}", self.sequence)
    }

    /// Synapse's `_update_stream_positions_table_txn`: the upsert that
    /// only ever moves a writer's row forward. Parameters: stream name
    /// (`text`), instance (`text`), position (`bigint`, negated for a
    /// stream counting down).
    pub fn upsert_position_sql(&self) -> &'static str {
        if self.positive {
            "INSERT INTO stream_positions (stream_name, instance_name, stream_id) \
             VALUES ($1, $2, $3) \
             ON CONFLICT (stream_name, instance_name) DO UPDATE SET \
             stream_id = EXCLUDED.stream_id \
             WHERE stream_positions.stream_id < EXCLUDED.stream_id"
        } else {
            "INSERT INTO stream_positions (stream_name, instance_name, stream_id) \
             VALUES ($1, $2, $3) \
             ON CONFLICT (stream_name, instance_name) DO UPDATE SET \
             stream_id = EXCLUDED.stream_id \
             WHERE stream_positions.stream_id > EXCLUDED.stream_id"
        }
    }

    /// The highest id of one table, at least 1 (`_load_current_ids` with
    /// no positions: `GREATEST(COALESCE(MAX(id), 1), 1)`, `-MIN` for a
    /// stream counting down).
    pub fn max_id_sql(&self, table: &StreamTable) -> String {
        let agg = if self.positive { "MAX" } else { "-MIN" };
        format!(
            "SELECT GREATEST(COALESCE({agg}({id}), 1), 1) FROM {table}",
            id = table.id_column,
            table = table.table
        )
    }

    /// The rows of one table from an id on, as `(instance, id)`
    /// (`_load_current_ids` with positions). Parameter: the id (`bigint`,
    /// negated for a stream counting down).
    pub fn rows_from_sql(&self, table: &StreamTable) -> String {
        let cmp = if self.positive { "<=" } else { ">=" };
        format!(
            "SELECT {instance}, {id} FROM {table} WHERE $1::bigint {cmp} {id}",
            instance = table.instance_column,
            id = table.id_column,
            table = table.table
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_plain_identifiers() {
        let plain = |name: &str| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        for (at, stream) in DatabaseStream::ALL.iter().enumerate() {
            assert!(
                DatabaseStream::ALL[..at]
                    .iter()
                    .all(|other| other.name != stream.name && other.sequence != stream.sequence),
                "{stream:?}"
            );
            assert_eq!(DatabaseStream::named(stream.name), Some(stream));
            assert!(plain(stream.sequence), "{}", stream.sequence);
            assert!(!stream.tables.is_empty());
            for table in stream.tables {
                assert!(
                    plain(table.table) && plain(table.id_column) && plain(table.instance_column)
                );
            }
        }
        assert_eq!(DatabaseStream::named("typing"), None);
    }

    #[test]
    fn sql_as_synapse_writes_it() {
        let stream = DatabaseStream::ACCOUNT_DATA;
        assert_eq!(
            stream.nextval_sql(),
            "SELECT nextval('account_data_sequence') FROM generate_series(1, $1::bigint)"
        );
        assert_eq!(
            stream.max_id_sql(&stream.tables[2]),
            "SELECT GREATEST(COALESCE(MAX(stream_id), 1), 1) FROM account_data"
        );
        assert_eq!(
            stream.rows_from_sql(&stream.tables[0]),
            "SELECT instance_name, stream_id FROM room_account_data WHERE $1::bigint <= stream_id"
        );
        let backfill = DatabaseStream::BACKFILL;
        assert!(
            backfill
                .max_id_sql(&backfill.tables[0])
                .contains("-MIN(stream_ordering)")
        );
        assert!(
            backfill
                .upsert_position_sql()
                .ends_with("> EXCLUDED.stream_id")
        );
    }
}
