//! Where the typing writer learns which servers are in a room, to apply a
//! federation typing EDU only as Synapse's `_recv_edu` does (the origin
//! and this server both in the room): Synapse's own database when the
//! configuration has a `database` section (and the crate its `postgres`
//! feature), else the admin API with a server admin's token, else
//! nowhere.

/// Synapse 1.163.2's `get_current_hosts_in_room` on PostgreSQL
/// (storage/databases/main/roommember.py): the servers of the users
/// joined to the room in its current state. Parameter: the room id.
pub const CURRENT_HOSTS_IN_ROOM_SQL: &str = "SELECT DISTINCT substring(state_key FROM '@[^:]*:(.*)$') \
     FROM current_state_events \
     WHERE type = 'm.room.member' AND membership = 'join' AND room_id = $1";

/// A source of the servers in a room.
pub enum HostsSource {
    /// Synapse's PostgreSQL, read with [`CURRENT_HOSTS_IN_ROOM_SQL`].
    #[cfg(feature = "postgres")]
    Database(tokio_postgres::Client),
    /// The admin API's room members, with a server admin's access token.
    AdminApi(String),
    /// Neither: remote typing is answered but not applied.
    None,
}

// By hand: the admin token never shows.
impl std::fmt::Debug for HostsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            #[cfg(feature = "postgres")]
            HostsSource::Database(_) => f.write_str("Database"),
            HostsSource::AdminApi(_) => f.write_str("AdminApi(<redacted>)"),
            HostsSource::None => f.write_str("None"),
        }
    }
}

impl HostsSource {
    /// The database of `synapse`'s `database` section if it has one (a
    /// connection driven on smol's executor), else the admin API with
    /// `admin_token`, else none. A `database` section that cannot be used
    /// is an error: a writer configured to read it should not quietly
    /// fall back.
    pub async fn open(
        synapse: &synapse_replication::config::SynapseConfig,
        admin_token: Option<String>,
    ) -> std::io::Result<HostsSource> {
        #[cfg(feature = "postgres")]
        if let Some(database) = synapse.database() {
            use synapse_replication::transport::SmolRuntime;
            use synapse_replication::transport::postgres::PostgresConnect;
            let refused = |error: &dyn std::fmt::Display| {
                std::io::Error::other(format!(
                    "the database section (for the servers in a room): {error}"
                ))
            };
            let connect = PostgresConnect::new(database).map_err(|error| refused(&error))?;
            let (client, connection) = connect
                .connect(&SmolRuntime)
                .await
                .map_err(|error| refused(&error))?;
            smol::spawn(async move {
                if let Err(error) = connection.await {
                    eprintln!("typing writer: database connection: {error}");
                }
            })
            .detach();
            return Ok(HostsSource::Database(client));
        }
        #[cfg(not(feature = "postgres"))]
        if synapse.database().is_some() {
            eprintln!(
                "typing writer: built without the postgres feature: the database section is not \
                 read"
            );
        }
        Ok(match admin_token {
            Some(token) => HostsSource::AdminApi(token),
            None => HostsSource::None,
        })
    }

    /// Whether the servers in a room can be read at all.
    pub fn is_none(&self) -> bool {
        matches!(self, HostsSource::None)
    }

    /// The servers with a joined user in `room` from the database (none
    /// for a room it does not hold).
    #[cfg(feature = "postgres")]
    pub async fn from_database(
        client: &tokio_postgres::Client,
        room: &str,
    ) -> std::io::Result<std::collections::BTreeSet<String>> {
        let rows = client
            .query(CURRENT_HOSTS_IN_ROOM_SQL, &[&room])
            .await
            .map_err(|error| std::io::Error::other(format!("current hosts in room: {error}")))?;
        Ok(rows
            .iter()
            // NULL: a state key that is no user id (Synapse keeps it too,
            // as None, which matches no server).
            .filter_map(|row| row.get::<_, Option<String>>(0))
            .collect())
    }
}
