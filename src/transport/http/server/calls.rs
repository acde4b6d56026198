//! The replication HTTP API's calls on an [`HttpServer`](super::HttpServer):
//! the sans-IO [`ReplicationApi`] and [`ResponseCache`], with the waits
//! for the caller's positions, the application's handlers and the
//! answers' positions.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use futures::channel::{mpsc, oneshot};
use futures::future::{self, Either};
use serde_json::{Map, Value};

use crate::http::{
    CacheLookup, CachedAnswer, ReplicationApi, ReplicationError, ReplicationRequest, ResponseCache,
    WAIT_FOR_POSITIONS, answer_body, fingerprint,
};
use crate::transport::runtime::{BoxFuture, Runtime};
use crate::wire::{InstanceName, StreamName, Token};

/// The application's handler of one endpoint: the call's content in, the
/// answer's content (status 200) or a refusal out.
pub(crate) type CallHandler = dyn Fn(ReplicationRequest) -> BoxFuture<'static, Result<Map<String, Value>, ReplicationError>>
    + Send
    + Sync;

/// The positions of the streams this process writes, for the answers.
pub(crate) type PositionsFn = dyn Fn() -> Vec<(StreamName, Token)> + Send + Sync;

/// Waits until the follower has seen `writer` reach `token` on `stream`
/// (or gives up by the deadline); `true` if it did.
pub(crate) type WaitFn =
    dyn Fn(StreamName, InstanceName, Token, Instant) -> BoxFuture<'static, bool> + Send + Sync;

/// The calls one server answers.
pub(crate) struct Calls {
    pub(crate) api: ReplicationApi,
    /// One per endpoint of `api`, in its order.
    pub(crate) handlers: Vec<Arc<CallHandler>>,
    cache: Arc<Cache>,
    /// Where the runs of calls with a txn id go, for the server's loop to
    /// poll: they outlive their connections.
    runs: mpsc::UnboundedSender<BoxFuture<'static, ()>>,
    run_queue: Mutex<Option<mpsc::UnboundedReceiver<BoxFuture<'static, ()>>>>,
    pub(crate) positions: Option<Arc<PositionsFn>>,
    pub(crate) waits: Option<Arc<WaitFn>>,
}

impl Calls {
    pub(crate) fn new(api: ReplicationApi) -> Calls {
        let (runs, run_queue) = mpsc::unbounded();
        Calls {
            api,
            handlers: Vec::new(),
            cache: Arc::new(Mutex::new(ResponseCache::new())),
            runs,
            run_queue: Mutex::new(Some(run_queue)),
            positions: None,
            waits: None,
        }
    }

    /// Answers a call whose headers and body passed: waits for the
    /// caller's positions, looks its txn id up, has it handled, adds this
    /// process's positions. `deadline` is the request's own.
    pub(crate) async fn answer<R: Runtime + Clone>(
        &self,
        runtime: &R,
        request: ReplicationRequest,
        body: &[u8],
        deadline: Instant,
    ) -> (u16, String) {
        let Some(index) = self
            .api
            .endpoints()
            .iter()
            .position(|endpoint| endpoint.name() == request.endpoint)
        else {
            return error(&ReplicationError::NotFound);
        };
        let endpoint = &self.api.endpoints()[index];
        let handler = Arc::clone(&self.handlers[index]);
        if let (Some(caller), Some(waits)) = (&request.caller, &self.waits) {
            let by = (runtime.now() + WAIT_FOR_POSITIONS).min(deadline);
            let all = caller
                .streams
                .iter()
                .map(|(stream, token)| waits(stream.clone(), caller.instance.clone(), *token, by));
            let reached = future::join_all(all).await;
            if reached.contains(&false) {
                // As Synapse does: a warning, and the call goes on.
                tracing::warn!(
                    endpoint = endpoint.name(),
                    caller = %caller.instance,
                    "timed out waiting for the caller's stream positions; handling the call anyway"
                );
            }
        }
        let waits_for_streams = endpoint.waits_for_streams();
        let (status, body) = match (endpoint.caches(), request.txn_id.clone()) {
            (true, Some(txn_id)) => {
                let args: Vec<&str> = request.args.iter().map(|(_, v)| v.as_str()).collect();
                let print = fingerprint(endpoint.name(), &args, request.query.as_deref(), body);
                self.cached(
                    runtime,
                    endpoint.name(),
                    &txn_id,
                    print,
                    handler,
                    request,
                    deadline,
                )
                .await
            }
            _ => handle(runtime, &handler, request, deadline).await,
        };
        if waits_for_streams && status == 200 {
            let positions = self.positions.as_ref().map(|f| f()).unwrap_or_default();
            (status, answer_body(&body, &positions))
        } else {
            (status, body)
        }
    }

    /// The answer of a call with a txn id: handled once, kept for its
    /// retries, waited for by its concurrent duplicates. The handler runs
    /// apart from the connection (in the server's own loop), to its end: as
    /// Synapse's `ResponseCache` does, a caller that goes away or a
    /// request timeout cancels no run, and the retries Synapse makes of a
    /// 504 wait for that run rather than start another.
    #[allow(clippy::too_many_arguments)]
    async fn cached<R: Runtime + Clone>(
        &self,
        runtime: &R,
        endpoint: &str,
        txn_id: &str,
        print: u64,
        handler: Arc<CallHandler>,
        request: ReplicationRequest,
        deadline: Instant,
    ) -> (u16, String) {
        let lookup = lock(&self.cache).lookup(endpoint, txn_id, print, runtime.now());
        let started = match lookup {
            CacheLookup::Answer(answer) => return (answer.status, answer.body),
            CacheLookup::Conflict => {
                return error(&ReplicationError::TxnConflict(
                    txn_id.chars().take(64).collect(),
                ));
            }
            CacheLookup::Full => return error(&ReplicationError::Busy),
            CacheLookup::Wait => false,
            CacheLookup::Handle => true,
        };
        // The first call waits for its run as its retries do (before the
        // run is polled, so that it cannot miss the answer).
        let (tx, rx) = oneshot::channel();
        let waiting = lock(&self.cache).wait(endpoint, txn_id, tx).is_ok();
        if started {
            let run = InFlight {
                cache: Arc::clone(&self.cache),
                endpoint: endpoint.to_owned(),
                txn_id: txn_id.to_owned(),
                done: false,
            }
            .run(runtime.clone(), handler, request);
            // Refused only once `HttpServer::run` is gone: the run is
            // dropped, and its guard answers the waiters.
            let _ = self.runs.unbounded_send(Box::pin(run));
        }
        if !waiting {
            // As many wait for this run already.
            return error(&ReplicationError::Busy);
        }
        match future::select(rx, runtime.sleep_until(deadline)).await {
            Either::Left((Ok(answer), _)) => (answer.status, answer.body),
            Either::Left((Err(_), _)) => timed_out(),
            Either::Right(_) => {
                tracing::warn!(
                    endpoint,
                    "replication call not handled in time; its run goes on for its retries"
                );
                timed_out()
            }
        }
    }

    /// The runs of calls with a txn id, for [`HttpServer::run`](super::HttpServer::run)
    /// to poll: taken once.
    pub(crate) fn take_runs(&self) -> Option<mpsc::UnboundedReceiver<BoxFuture<'static, ()>>> {
        self.run_queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

type Cache = Mutex<ResponseCache<oneshot::Sender<CachedAnswer>>>;

fn lock(cache: &Cache) -> std::sync::MutexGuard<'_, ResponseCache<oneshot::Sender<CachedAnswer>>> {
    cache.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A call being handled under its txn id; finished as failed if dropped
/// before its end (only when the server itself is dropped), so that its
/// waiters are answered and the txn id is not held for ever.
struct InFlight {
    cache: Arc<Cache>,
    endpoint: String,
    txn_id: String,
    done: bool,
}

impl InFlight {
    /// Runs `handler` to its end, keeps a success for the retries, and
    /// answers every call that waits.
    async fn run<R: Runtime>(
        mut self,
        runtime: R,
        handler: Arc<CallHandler>,
        request: ReplicationRequest,
    ) {
        let (status, body, keep) = match handler(request).await {
            Ok(content) => (200, Value::Object(content).to_string(), true),
            Err(refusal) => {
                tracing::debug!(
                    endpoint = self.endpoint,
                    %refusal,
                    "replication call refused by its handler"
                );
                let (status, body) = error(&refusal);
                (status, body, false)
            }
        };
        self.done = true;
        self.finish(CachedAnswer { status, body }, keep, runtime.now());
    }

    fn finish(&self, answer: CachedAnswer, keep: bool, now: Instant) {
        let waiters =
            lock(&self.cache).finish(&self.endpoint, &self.txn_id, answer.clone(), keep, now);
        for waiter in waiters {
            let _ = waiter.send(answer.clone());
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (status, body) = timed_out();
        // Not kept: the time (which only dates kept answers) is moot.
        self.finish(CachedAnswer { status, body }, false, Instant::now());
    }
}

/// Runs `handler` by `deadline`, for a call without a txn id (nothing
/// to answer a retry from, so nothing to run on for).
async fn handle<R: Runtime>(
    runtime: &R,
    handler: &Arc<CallHandler>,
    request: ReplicationRequest,
    deadline: Instant,
) -> (u16, String) {
    let endpoint = request.endpoint.clone();
    match future::select(handler(request), runtime.sleep_until(deadline)).await {
        Either::Left((Ok(content), _)) => (200, Value::Object(content).to_string()),
        Either::Left((Err(refusal), _)) => {
            tracing::debug!(endpoint, %refusal, "replication call refused by its handler");
            error(&refusal)
        }
        Either::Right(_) => {
            tracing::warn!(endpoint, "replication call not handled in time");
            timed_out()
        }
    }
}

fn error(error: &ReplicationError) -> (u16, String) {
    (error.status(), error.body())
}

/// 504: Synapse's callers retry it with the same txn id.
fn timed_out() -> (u16, String) {
    error(&ReplicationError::refused(504, "M_UNKNOWN", "Timed out"))
}
