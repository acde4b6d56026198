//! [`StreamIdStore`] on tokio-postgres, and [`PostgresConnect`]: a
//! connection to Synapse's PostgreSQL over any runtime's socket.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::{Either, select};
use tokio_postgres::GenericClient;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::types::ToSql;
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt};

use super::caches::{CachesStore, UPDATED_CACHES_SQL, insert_invalidations_sql};
use super::store::StreamIdStore;
use super::streams::DatabaseStream;
use crate::config::{ConfigError, DatabaseConfig};
use crate::positions::InvalidationRow;
use crate::transport::runtime::{BoxConnection, Runtime, deadline_after};
use crate::wire::{InstanceName, Token};

/// The connection task of a client [`PostgresConnect::connect`] opened:
/// a future that moves the client's bytes, to spawn on the runtime
/// (`smol::spawn(connection)`, `tokio::spawn(connection)`). The client's
/// calls wait until it runs; it ends when the client is dropped.
pub type PostgresConnection = tokio_postgres::Connection<Compat<BoxConnection>, NoTlsStream>;

/// Connecting to Synapse's PostgreSQL failed, or its `database` section
/// asks for what this client does not do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresError {
    /// The `database` section is not one to connect with (SQLite, a `dsn`
    /// string).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// TLS to PostgreSQL was asked for: not supported yet.
    #[error(
        "database.args.sslmode: sslmode={mode} is not supported yet (no TLS to postgresql): \
         use disable or prefer, or a unix socket"
    )]
    TlsNotSupported {
        /// The `sslmode` given.
        mode: String,
    },
    /// A connection argument this client does not take.
    #[error("database.args.{key}: not a connection argument this client takes")]
    UnknownArg {
        /// The argument.
        key: String,
    },
    /// A connection argument with a value that cannot be used.
    #[error("database.args.{key}: {reason}")]
    InvalidArg {
        /// The argument.
        key: String,
        /// What is wrong (never the value of a password).
        reason: String,
    },
    /// A connection argument that is needed is missing.
    #[error("database.args.{key} is needed: {why}")]
    MissingArg {
        /// The argument.
        key: &'static str,
        /// Why this client needs it.
        why: &'static str,
    },
    /// No host could be reached.
    #[error("could not reach postgresql at {target}: {source}")]
    Connect {
        /// The last host tried (`host:port`, or a socket path).
        target: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// PostgreSQL refused the connection (authentication, an unknown
    /// database, ...).
    #[error("postgresql at {target}: {source}")]
    Postgres {
        /// The host (`host:port`, or a socket path).
        target: String,
        /// PostgreSQL's error.
        #[source]
        source: tokio_postgres::Error,
    },
}

/// Where to connect: a TCP address or a Unix socket.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    Tcp(String),
    Unix(PathBuf),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Tcp(addr) => f.write_str(addr),
            Target::Unix(path) => write!(f, "{}", path.display()),
        }
    }
}

/// How to connect to Synapse's PostgreSQL, read from its `database`
/// section ([`DatabaseConfig::postgres_params`]): the hosts to try, in
/// order, and what to say at startup (user, password, database, ...).
///
/// The socket is opened with a [`Runtime`] (smol, tokio, or yours), and
/// tokio-postgres speaks the protocol over it (`Config::connect_raw`), so
/// the client runs on any runtime; spawn the returned
/// [`PostgresConnection`] on it.
///
/// Taken from the arguments: `host` (names, addresses, or Unix socket
/// directories, comma-separated), `hostaddr`, `port`, `user`,
/// `password`, `dbname`, `options`, `application_name`,
/// `connect_timeout`, `channel_binding`, `sslmode` (`disable`, `allow`,
/// `prefer`: plaintext, as libpq built without TLS does; `require` and
/// above are refused, with an error saying so). Socket tuning that the
/// runtime's socket does not take (`keepalives*`, `tcp_user_timeout`),
/// TLS and GSS settings (`sslrootcert`, `gssencmode`, ...) and
/// `target_session_attrs` are accepted and not used; any other argument
/// is refused, by name. libpq's
/// defaults for a missing `host` and `user` (a socket directory chosen
/// when libpq was built, the login name) are not guessed: give them.
///
/// Passwords never show in `Debug` output or errors.
///
/// ```no_run
/// # #[cfg(feature = "runtime-smol")]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use synapse_replication::config::SynapseConfig;
/// use synapse_replication::transport::postgres::{DatabaseIds, DatabaseStream, PostgresConnect};
/// use synapse_replication::transport::SmolRuntime;
/// use synapse_replication::wire::InstanceName;
///
/// let synapse = SynapseConfig::from_json(r#"{
///     "server_name": "example.com",
///     "database": {"name": "psycopg2", "args": {
///         "host": "127.0.0.1", "user": "synapse", "password": "secret", "dbname": "synapse"
///     }}
/// }"#)?;
/// let connect = PostgresConnect::new(synapse.database().ok_or("no database")?)?;
/// smol::block_on(async {
///     let (client, connection) = connect.connect(&SmolRuntime).await?;
///     smol::spawn(connection).detach();
///     let me = InstanceName::from("rust_account_data");
///     let ids =
///         DatabaseIds::load(client, DatabaseStream::ACCOUNT_DATA, me.clone(), [me]).await?;
///     let taken = ids.take(1).await?;
///     // ... write the rows with `taken`, and commit ...
///     let position = ids.persisted(&taken).await?;
///     println!("announce account_data {position}");
///     Ok(())
/// })
/// # }
/// # #[cfg(not(feature = "runtime-smol"))]
/// # fn main() {}
/// ```
#[derive(Clone)]
pub struct PostgresConnect {
    config: tokio_postgres::Config,
    targets: Vec<Target>,
    connect_timeout: Option<Duration>,
}

impl fmt::Debug for PostgresConnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // tokio_postgres::Config's own Debug redacts the password too;
        // this does not rely on it.
        f.debug_struct("PostgresConnect")
            .field("targets", &self.targets)
            .field("user", &self.config.get_user())
            .field("dbname", &self.config.get_dbname())
            .field(
                "password",
                &self.config.get_password().map(|_| "<redacted>"),
            )
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// Arguments that only tune a socket or TLS, which this client does not
/// set up: accepted, so that Synapse's configuration is taken as it is.
const IGNORED: &[&str] = &[
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "sslcompression",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "gssencmode",
    "target_session_attrs",
];

fn invalid(key: &str, reason: impl Into<String>) -> PostgresError {
    PostgresError::InvalidArg {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

impl PostgresConnect {
    /// Reads the connection from Synapse's `database` section.
    pub fn new(database: &DatabaseConfig) -> Result<PostgresConnect, PostgresError> {
        let mut config = tokio_postgres::Config::new();
        let (mut hosts, mut hostaddrs, mut ports) = (None, None, None);
        let mut connect_timeout = None;
        for (key, value) in database.postgres_params()? {
            match key {
                "host" => hosts = Some(value),
                "hostaddr" => hostaddrs = Some(value),
                "port" => ports = Some(value),
                "user" => {
                    config.user(value);
                }
                "password" => {
                    config.password(value);
                }
                "dbname" => {
                    config.dbname(value);
                }
                "options" => {
                    config.options(value);
                }
                "application_name" => {
                    config.application_name(value);
                }
                "connect_timeout" => {
                    // libpq: seconds; zero, negative or none is no limit.
                    let seconds: i64 = value.trim().parse().map_err(|_| {
                        invalid(key, format!("expected a number of seconds, not {value:?}"))
                    })?;
                    connect_timeout = u64::try_from(seconds)
                        .ok()
                        .filter(|&seconds| seconds > 0)
                        .map(Duration::from_secs);
                }
                "channel_binding" => {
                    let binding = match value {
                        "disable" => tokio_postgres::config::ChannelBinding::Disable,
                        "prefer" => tokio_postgres::config::ChannelBinding::Prefer,
                        "require" => tokio_postgres::config::ChannelBinding::Require,
                        _ => {
                            return Err(invalid(key, "expected disable, prefer or require"));
                        }
                    };
                    config.channel_binding(binding);
                }
                "sslmode" => match value {
                    // Without TLS: what libpq built without TLS does for
                    // the modes that do not require it.
                    "disable" | "allow" | "prefer" => {
                        config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                    }
                    mode => {
                        return Err(PostgresError::TlsNotSupported {
                            mode: mode.chars().take(32).collect(),
                        });
                    }
                },
                key if IGNORED.contains(&key) => {}
                key => {
                    return Err(PostgresError::UnknownArg {
                        key: key.chars().take(64).collect(),
                    });
                }
            }
        }
        if config.get_user().is_none() {
            return Err(PostgresError::MissingArg {
                key: "user",
                why: "libpq's default (the login name) is not guessed",
            });
        }
        let targets = targets(hosts, hostaddrs, ports)?;
        Ok(PostgresConnect {
            config,
            targets,
            connect_timeout,
        })
    }

    /// Connects: tries each host in order and starts a session on the
    /// first that answers. Spawn the returned [`PostgresConnection`] on
    /// the runtime; the client's calls wait until it runs.
    pub async fn connect<R: Runtime + ?Sized>(
        &self,
        runtime: &R,
    ) -> Result<(tokio_postgres::Client, PostgresConnection), PostgresError> {
        let mut last = None;
        for target in &self.targets {
            let opened = match target {
                Target::Tcp(addr) => runtime.connect(addr),
                Target::Unix(path) => runtime.connect_unix(path),
            };
            let opened = match self.connect_timeout {
                None => opened.await,
                Some(timeout) => {
                    let deadline = deadline_after(runtime.now(), timeout);
                    match select(opened, runtime.sleep_until(deadline)).await {
                        Either::Left((opened, _)) => opened,
                        Either::Right(((), _)) => Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("no answer within connect_timeout ({}s)", timeout.as_secs()),
                        )),
                    }
                }
            };
            match opened {
                Ok(stream) => {
                    return self
                        .config
                        .connect_raw(stream.compat(), tokio_postgres::NoTls)
                        .await
                        .map_err(|source| PostgresError::Postgres {
                            target: target.to_string(),
                            source,
                        });
                }
                Err(error) => {
                    tracing::debug!(%target, %error, "postgresql not reached");
                    last = Some((target, error));
                }
            }
        }
        let (target, source) = match last {
            Some((target, source)) => (target.to_string(), source),
            // `targets` always has one; say so rather than panic.
            None => (
                String::new(),
                io::Error::new(io::ErrorKind::InvalidInput, "no host to connect to"),
            ),
        };
        Err(PostgresError::Connect { target, source })
    }
}

/// libpq's hosts and ports: `host` and `hostaddr` lists, each with a port
/// (one port for all, or one each).
fn targets(
    hosts: Option<&str>,
    hostaddrs: Option<&str>,
    ports: Option<&str>,
) -> Result<Vec<Target>, PostgresError> {
    // hostaddr, where given, is what is dialled (host then only names
    // the server for TLS and passwords files, which are not used here).
    let (key, hosts) = match (hostaddrs, hosts) {
        (Some(addrs), _) => ("hostaddr", addrs),
        (None, Some(hosts)) => ("host", hosts),
        (None, None) => {
            return Err(PostgresError::MissingArg {
                key: "host",
                why: "libpq's default socket directory depends on how it was built; \
                      give an address or a directory such as /var/run/postgresql",
            });
        }
    };
    let hosts: Vec<&str> = hosts.split(',').map(str::trim).collect();
    let ports: Vec<u16> = match ports {
        None => vec![5432],
        Some(ports) => ports
            .split(',')
            .map(|port| match port.trim() {
                "" => Ok(5432),
                port => port
                    .parse::<u16>()
                    .ok()
                    .filter(|&port| port != 0)
                    .ok_or_else(|| invalid("port", "expected a port from 1 to 65535")),
            })
            .collect::<Result<_, _>>()?,
    };
    if ports.len() != 1 && ports.len() != hosts.len() {
        return Err(invalid(
            "port",
            format!(
                "{} ports for {} hosts (give one, or one each)",
                ports.len(),
                hosts.len()
            ),
        ));
    }
    hosts
        .iter()
        .enumerate()
        .map(|(at, host)| {
            let port = match ports.as_slice() {
                [one] => *one,
                each => each.get(at).copied().unwrap_or(5432),
            };
            if host.is_empty() {
                return Err(invalid(key, "an empty host"));
            }
            Ok(if host.starts_with('/') {
                // libpq's socket file in the directory.
                Target::Unix(PathBuf::from(host).join(format!(".s.PGSQL.{port}")))
            } else if host.contains(':') {
                Target::Tcp(format!("[{host}]:{port}"))
            } else {
                Target::Tcp(format!("{host}:{port}"))
            })
        })
        .collect()
}

/// The sign of a stream's ids in its tables and `stream_positions`.
fn factor(stream: &DatabaseStream) -> i64 {
    if stream.positive { 1 } else { -1 }
}

/// The shared SQL of the implementations on a client and a transaction.
async fn next_ids<C: GenericClient + Sync>(
    client: &C,
    stream: &DatabaseStream,
    n: usize,
) -> Result<Vec<Token>, tokio_postgres::Error> {
    // Beyond i64, Postgres would refuse the series anyway; ask for what fits.
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    let rows = client.query(&stream.nextval_sql(), &[&n]).await?;
    rows.iter()
        .map(|row| row.try_get::<_, i64>(0).map(Token))
        .collect()
}

async fn write_position<C: GenericClient + Sync>(
    client: &C,
    stream: &DatabaseStream,
    instance: &InstanceName,
    position: Token,
) -> Result<(), tokio_postgres::Error> {
    let id = position.0.saturating_mul(factor(stream));
    client
        .execute(
            stream.upsert_position_sql(),
            &[&stream.positions_name, &instance.as_str(), &id],
        )
        .await?;
    Ok(())
}

async fn delete_stale_positions<C: GenericClient + Sync>(
    client: &C,
    stream: &DatabaseStream,
    writers: &[InstanceName],
) -> Result<(), tokio_postgres::Error> {
    let writers: Vec<&str> = writers.iter().map(InstanceName::as_str).collect();
    client
        .execute(
            "DELETE FROM stream_positions WHERE stream_name = $1 AND NOT instance_name = ANY($2)",
            &[&stream.positions_name, &writers],
        )
        .await?;
    Ok(())
}

async fn positions<C: GenericClient + Sync>(
    client: &C,
    stream: &DatabaseStream,
) -> Result<Vec<(InstanceName, Token)>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = $1",
            &[&stream.positions_name],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let instance: &str = row.try_get(0)?;
            let id: i64 = row.try_get(1)?;
            Ok((
                InstanceName::from(instance),
                Token(id.saturating_mul(factor(stream))),
            ))
        })
        .collect()
}

async fn last_value<C: GenericClient + Sync>(
    client: &C,
    stream: &DatabaseStream,
) -> Result<Token, tokio_postgres::Error> {
    let row = client.query_one(&stream.last_value_sql(), &[]).await?;
    Ok(Token(row.try_get(0)?))
}

async fn max_id<C: GenericClient + Sync>(
    client: &C,
    stream: &DatabaseStream,
) -> Result<Token, tokio_postgres::Error> {
    let mut max = 1;
    for table in stream.tables {
        let row = client.query_one(&stream.max_id_sql(table), &[]).await?;
        max = max.max(row.try_get::<_, i64>(0)?);
    }
    Ok(Token(max))
}

async fn rows_from<C: GenericClient + Sync>(
    client: &C,
    stream: &DatabaseStream,
    from: Token,
) -> Result<Vec<(Option<InstanceName>, Token)>, tokio_postgres::Error> {
    let from = from.0.saturating_mul(factor(stream));
    let mut found = Vec::new();
    for table in stream.tables {
        for row in client.query(&stream.rows_from_sql(table), &[&from]).await? {
            let instance: Option<&str> = row.try_get(0)?;
            let id: i64 = row.try_get(1)?;
            found.push((
                instance.map(InstanceName::from),
                Token(id.saturating_mul(factor(stream))),
            ));
        }
    }
    Ok(found)
}

/// The store on one client: each call is a statement of its own
/// (autocommit), as Synapse's id generator runs them.
macro_rules! impl_store {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl StreamIdStore for $ty {
            type Error = tokio_postgres::Error;

            async fn next_ids(&self, stream: &DatabaseStream, n: usize) -> Result<Vec<Token>, Self::Error> {
                next_ids(self, stream, n).await
            }

            async fn write_position(
                &self,
                stream: &DatabaseStream,
                instance: &InstanceName,
                position: Token,
            ) -> Result<(), Self::Error> {
                write_position(self, stream, instance, position).await
            }

            async fn delete_stale_positions(
                &self,
                stream: &DatabaseStream,
                writers: &[InstanceName],
            ) -> Result<(), Self::Error> {
                delete_stale_positions(self, stream, writers).await
            }

            async fn positions(&self, stream: &DatabaseStream) -> Result<Vec<(InstanceName, Token)>, Self::Error> {
                positions(self, stream).await
            }

            async fn last_value(&self, stream: &DatabaseStream) -> Result<Token, Self::Error> {
                last_value(self, stream).await
            }

            async fn max_id(&self, stream: &DatabaseStream) -> Result<Token, Self::Error> {
                max_id(self, stream).await
            }

            async fn rows_from(
                &self,
                stream: &DatabaseStream,
                from: Token,
            ) -> Result<Vec<(Option<InstanceName>, Token)>, Self::Error> {
                rows_from(self, stream, from).await
            }
        }
    )*};
}

impl_store!(tokio_postgres::Client, tokio_postgres::Transaction<'_>);

async fn insert_invalidations<C: GenericClient + Sync>(
    client: &C,
    instance: &InstanceName,
    rows: &[InvalidationRow],
) -> Result<(), tokio_postgres::Error> {
    let instance = instance.as_str();
    let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(1 + 4 * rows.len());
    params.push(&instance);
    for row in rows {
        params.push(&row.stream_id.0);
        params.push(&row.cache_func);
        params.push(&row.keys);
        params.push(&row.invalidation_ts);
    }
    client
        .execute(&insert_invalidations_sql(rows.len()), &params)
        .await?;
    Ok(())
}

async fn updated_caches<C: GenericClient + Sync>(
    client: &C,
    instance: &InstanceName,
    from: Token,
    limit: usize,
) -> Result<Vec<InvalidationRow>, tokio_postgres::Error> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client
        .query(UPDATED_CACHES_SQL, &[&from.0, &instance.as_str(), &limit])
        .await?;
    rows.iter()
        .map(|row| {
            Ok(InvalidationRow {
                stream_id: Token(row.try_get(0)?),
                cache_func: row.try_get(1)?,
                keys: row.try_get(2)?,
                invalidation_ts: row.try_get(3)?,
            })
        })
        .collect()
}

macro_rules! impl_caches_store {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl CachesStore for $ty {
            async fn insert_invalidations(
                &self,
                instance: &InstanceName,
                rows: &[InvalidationRow],
            ) -> Result<(), Self::Error> {
                insert_invalidations(self, instance, rows).await
            }

            async fn updated_caches(
                &self,
                instance: &InstanceName,
                from: Token,
                limit: usize,
            ) -> Result<Vec<InvalidationRow>, Self::Error> {
                updated_caches(self, instance, from, limit).await
            }
        }
    )*};
}

impl_caches_store!(tokio_postgres::Client, tokio_postgres::Transaction<'_>);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SynapseConfig;

    fn connect(args: &str) -> Result<PostgresConnect, PostgresError> {
        let synapse = SynapseConfig::from_json(&format!(
            r#"{{"server_name": "x", "database": {{"name": "psycopg2", "args": {args}}}}}"#
        ))
        .unwrap();
        PostgresConnect::new(synapse.database().unwrap())
    }

    #[test]
    fn synapse_arguments_become_hosts_and_startup() {
        let connect = connect(
            r#"{"user": "synapse", "password": "hunter2-pg", "database": "synapse",
                "host": "db1,/run/postgresql,::1", "port": 5433, "cp_min": 5,
                "keepalives_idle": 10, "sslmode": "prefer", "connect_timeout": 3,
                "application_name": "rust"}"#,
        )
        .unwrap();
        assert_eq!(
            connect.targets,
            [
                Target::Tcp("db1:5433".into()),
                Target::Unix("/run/postgresql/.s.PGSQL.5433".into()),
                Target::Tcp("[::1]:5433".into()),
            ]
        );
        assert_eq!(connect.config.get_dbname(), Some("synapse"));
        assert_eq!(connect.connect_timeout, Some(Duration::from_secs(3)));
        let shown = format!("{connect:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }

    #[test]
    fn what_is_not_supported_says_so() {
        for mode in ["require", "verify-ca", "verify-full"] {
            let error = connect(&format!(
                r#"{{"user": "u", "host": "h", "sslmode": "{mode}"}}"#
            ))
            .unwrap_err();
            let message = error.to_string();
            assert!(
                message.contains(&format!("sslmode={mode} is not supported yet")),
                "{message}"
            );
        }
        let error = connect(r#"{"user": "u", "host": "h", "service": "x"}"#).unwrap_err();
        assert_eq!(
            error.to_string(),
            "database.args.service: not a connection argument this client takes"
        );
        let error = connect(r#"{"host": "h", "password": "hunter2"}"#).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("database.args.user is needed")
        );
        let error = connect(r#"{"user": "u"}"#).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("database.args.host is needed")
        );
        let error = connect(r#"{"user": "u", "host": "a,b,c", "port": "1,2"}"#).unwrap_err();
        assert!(
            error.to_string().starts_with("database.args.port"),
            "{error}"
        );
        let error =
            connect(r#"{"user": "u", "host": "h", "connect_timeout": "soon"}"#).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("database.args.connect_timeout")
        );
        let synapse = SynapseConfig::from_json(
            r#"{"server_name": "x", "database": {"name": "sqlite3", "args": {"database": "x.db"}}}"#,
        )
        .unwrap();
        let error = PostgresConnect::new(synapse.database().unwrap()).unwrap_err();
        assert!(matches!(error, PostgresError::Config(_)), "{error}");
    }
}
