//! The writer's parts and how they meet: the database (ids, changes,
//! catch-up), Redis (rows out, the deployment's positions in) and the
//! replication listener (Synapse's calls in).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::channel::oneshot;
use futures::lock::Mutex;
use synapse_replication::config::SynapseConfig;
use synapse_replication::http::{AccountDataAnswer, AccountDataRequest, CatchUpEndpoint};
use synapse_replication::positions::{BoxError, CatchUpPage, CatchUpRequest, FollowerEvent};
use synapse_replication::session::RedisEvent;
use synapse_replication::transport::postgres::{
    AccountDataCatchUp, AccountDataStore, CacheInvalidations, CachesCatchUp, PostgresConnect,
};
use synapse_replication::transport::{
    CatchUpSource, CommandSender, HttpServer, RedisClient, SmolRuntime, async_trait,
};
use synapse_replication::wire::{InstanceName, StreamName};
use synapse_replication::writers::WriterRegistry;

/// Connections that make changes: each change holds one for its
/// transaction, so this many changes run at once (Synapse's own writer
/// runs them on its pool, `cp_max` connections).
const WRITE_CONNECTIONS: usize = 4;

/// How long a stop waits for changes in flight to finish.
const STOP_WAIT: Duration = Duration::from_secs(10);

type Store = AccountDataStore<tokio_postgres::Client>;

/// A running writer; [`Running::stop`] ends it gracefully.
pub struct Running {
    /// The replication listener's address.
    pub addr: SocketAddr,
    store: Arc<Store>,
    changes: Arc<Changes>,
    server: smol::Task<()>,
    redis: smol::Task<()>,
    stop_redis: oneshot::Sender<()>,
}

/// Starts the writer as `instance` of the deployment `synapse` describes,
/// its replication listener on `listen`.
///
/// Startup is Synapse's `_load_current_ids`: the stream's position comes
/// from `stream_positions` and the sequence, so a restarted writer goes on
/// above every id it used (the ids are the database's, never its own).
/// Both positions are announced before anything is served.
pub async fn start(
    synapse: &SynapseConfig,
    instance: &str,
    listen: &str,
) -> Result<Running, BoxError> {
    let me = InstanceName::from(instance);
    if !synapse
        .writers()
        .is_configured(&StreamName::AccountData, &me)
    {
        return Err(format!(
            "stream_writers.account_data must name {instance} (and only it): Synapse's \
             processes call the writer it names"
        )
        .into());
    }
    let database = synapse.database().ok_or(
        "no database section: the writer writes Synapse's PostgreSQL database (its `database` \
         section, as in homeserver.yaml)",
    )?;
    let connect = PostgresConnect::new(database)?;
    // Each tokio-postgres client needs its connection driven: a task each.
    let connection = || async {
        let (client, connection) = connect.connect(&SmolRuntime).await?;
        smol::spawn(connection).detach();
        Ok::<_, BoxError>(client)
    };

    let caches = Arc::new(CacheInvalidations::load(connection().await?, me.clone()).await?);
    let mut redis = RedisClient::follow(SmolRuntime, synapse, me.clone())?;
    let sender = redis.sender();
    let store = Arc::new(
        AccountDataStore::load(
            connection().await?,
            Arc::clone(&caches),
            me.clone(),
            [me.clone()],
        )
        .await?
        .with_publisher(move |stream, position, rows| publish(&sender, stream, position, rows)),
    );
    // Announced on every connection and REPLICATE from now on.
    redis.advance(&StreamName::AccountData, store.position())?;
    redis.advance(&StreamName::Caches, caches.position())?;
    eprintln!(
        "account-data writer: {instance} at account_data {}, caches {}",
        store.position(),
        caches.position()
    );

    let mut writes = Vec::with_capacity(WRITE_CONNECTIONS);
    for _ in 0..WRITE_CONNECTIONS {
        writes.push(Mutex::new(connection().await?));
    }
    let changes = Arc::new(Changes {
        store: Arc::clone(&store),
        writes,
        next: AtomicUsize::new(0),
        in_flight: AtomicUsize::new(0),
        stopping: std::sync::atomic::AtomicBool::new(false),
    });

    // Catch-up of both streams from the tables, as Synapse's writer
    // answers it: any row of account_data, this process's rows of caches.
    let caches_source: Arc<dyn CatchUpSource> = Arc::new(CachesCatchUp::new(connection().await?));
    let source = AccountDataCatchUp::new(connection().await?).with_others(caches_source);
    let source: Arc<dyn CatchUpSource> = Arc::new(Logged(source));
    let endpoint =
        CatchUpEndpoint::new(me.clone(), synapse.replication_secret().map(str::to_owned))
            .with_streams([StreamName::AccountData, StreamName::Caches]);
    let (handler, positions) = (Arc::clone(&changes), Arc::clone(&store));
    let server = HttpServer::bind(SmolRuntime, listen, endpoint, source)
        .await?
        // Refuses callers whose `_INT_STREAM_POS` name a stream they do
        // not write, and waits (5 s at most) until this process has seen
        // what they did write, as Synapse's endpoints do.
        .with_writers(synapse.writers().clone())
        .with_waiter(redis.waiter())
        .with_account_data(synapse.server_name(), move |request| {
            let changes = Arc::clone(&handler);
            async move { changes.apply(request).await }.boxed()
        })
        // Every answer carries both positions; the caller waits for them.
        .with_positions(move || {
            let mut answer = vec![(StreamName::AccountData, positions.position())];
            if caches_published() {
                answer.push((StreamName::Caches, positions.caches().position()));
            }
            answer
        });
    let addr = server.local_addr()?;
    let (stop_redis, stopped) = oneshot::channel();
    Ok(Running {
        addr,
        store,
        changes,
        server: smol::spawn(server.run()),
        redis: smol::spawn(redis_task(redis, stopped)),
        stop_redis,
    })
}

/// The test of this example turns its `caches` rows off, to show what
/// they are for: without them Synapse's processes keep what they cached
/// (main, a user's ignore list). Only in the test's build.
#[cfg(test)]
pub static CACHES_OFF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn caches_published() -> bool {
    #[cfg(test)]
    return !CACHES_OFF.load(Ordering::SeqCst);
    #[cfg(not(test))]
    true
}

/// The rows of a change, once this writer's position covers them, to
/// Redis: `RDATA` then `POSITION`. Called under the store's lock, so it
/// only queues.
fn publish(
    sender: &CommandSender,
    stream: &StreamName,
    position: synapse_replication::wire::Token,
    rows: Vec<(
        synapse_replication::wire::Token,
        synapse_replication::wire::RawRow,
    )>,
) {
    if *stream == StreamName::Caches && !caches_published() {
        return;
    }
    if let Err(error) = sender.write(stream, position, rows) {
        // The rows are in the database: a follower that misses them
        // fetches them after the next POSITION.
        eprintln!("account-data writer: {stream} at {position} not queued: {error}");
    }
}

/// Follows the deployment (the waits of `_INT_STREAM_POS` need it) and
/// publishes what the changes queue, until told to stop.
async fn redis_task(mut redis: RedisClient<SmolRuntime>, stop: oneshot::Receiver<()>) {
    let mut stop = stop.fuse();
    loop {
        let event = futures::select! {
            event = redis.next_event().fuse() => event,
            _ = stop => break,
        };
        match event {
            None => return,
            Some(RedisEvent::Ready) => {
                eprintln!("account-data writer: redis ready, positions announced");
            }
            Some(event @ (RedisEvent::Disconnected { .. } | RedisEvent::WriteFailed { .. })) => {
                eprintln!("account-data writer: redis {event}");
            }
            Some(RedisEvent::Follower(FollowerEvent::Rows {
                stream: StreamName::Caches,
                writer,
                token,
                rows,
                source,
            })) => {
                // Another process's invalidations (this one's own echoes
                // never come back from the follower). The writer keeps
                // none of Synapse's caches, so applying them is noting
                // them; an application with caches drops the entries the
                // rows name here. The test of this example reads the line.
                eprintln!(
                    "account-data writer: caches from {writer} at {token}: {} rows ({source:?})",
                    rows.len()
                );
            }
            Some(_) => {}
        }
    }
    // Whatever is queued goes out before the connections close.
    redis.close(Duration::from_secs(2)).await;
}

/// The six changes, on a few connections, counted so that a stop can
/// wait for those in flight.
struct Changes {
    store: Arc<Store>,
    writes: Vec<Mutex<tokio_postgres::Client>>,
    next: AtomicUsize,
    in_flight: AtomicUsize,
    stopping: std::sync::atomic::AtomicBool,
}

impl Changes {
    async fn apply(
        &self,
        request: AccountDataRequest,
    ) -> Result<AccountDataAnswer, synapse_replication::http::ReplicationError> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let answer = if self.stopping.load(Ordering::SeqCst) {
            // Synapse's caller retries: the next run makes the change.
            Err(synapse_replication::http::ReplicationError::refused(
                503,
                "M_UNKNOWN",
                "the account-data writer is stopping",
            ))
        } else {
            let at = self.next.fetch_add(1, Ordering::Relaxed) % self.writes.len();
            let mut client = self.writes[at].lock().await;
            match self.store.apply(&mut client, &request).await {
                Ok(max_stream_id) => Ok(AccountDataAnswer { max_stream_id }),
                Err(error) => {
                    eprintln!("account-data writer: {request:?}: {error}");
                    Err(error.to_replication_error())
                }
            }
        };
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        answer
    }
}

impl Running {
    /// Stops gracefully: new changes are refused (503, which Synapse's
    /// callers retry), those in flight finish (10 s at most), the
    /// listener closes, the rows queued go out on Redis, and the position
    /// is written to `stream_positions` once more.
    pub async fn stop(self) {
        self.changes.stopping.store(true, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + STOP_WAIT;
        while self.changes.in_flight.load(Ordering::SeqCst) > 0
            && std::time::Instant::now() < deadline
        {
            smol::Timer::after(Duration::from_millis(20)).await;
        }
        // Cancelling the listener drops its connections; no change is
        // in flight any more (or it ran out of time).
        let _ = self.server.cancel().await;
        let _ = self.stop_redis.send(());
        self.redis.await;
        match self.store.ids().write_position().await {
            Ok(position) => {
                eprintln!("account-data writer: stopped at account_data {position}");
            }
            Err(error) => eprintln!("account-data writer: position not written: {error}"),
        }
    }
}

/// Logs each catch-up Synapse's processes ask for (what a follower that
/// missed rows does), then answers it from `0`.
struct Logged<S>(S);

#[async_trait]
impl<S: CatchUpSource> CatchUpSource for Logged<S> {
    async fn fetch(&self, request: CatchUpRequest) -> Result<CatchUpPage, BoxError> {
        let (stream, from, to) = (request.stream.clone(), request.from, request.to);
        let page = self.0.fetch(request).await;
        match &page {
            Ok(page) => eprintln!(
                "account-data writer: catch-up {stream} ({from}, {to}]: {} rows",
                page.updates.len()
            ),
            Err(error) => {
                eprintln!("account-data writer: catch-up {stream} ({from}, {to}]: {error}")
            }
        }
        page
    }
}
