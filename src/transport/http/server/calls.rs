//! The replication HTTP API's calls on an [`HttpServer`](super::HttpServer):
//! the sans-IO [`ReplicationApi`] and [`ResponseCache`], with the waits
//! for the caller's positions, the application's handlers and the
//! answers' positions.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use futures::channel::oneshot;
use futures::future::{self, Either};
use serde_json::{Map, Value};

use crate::positions::{
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
    pub(crate) cache: Mutex<ResponseCache<oneshot::Sender<CachedAnswer>>>,
    pub(crate) positions: Option<Arc<PositionsFn>>,
    pub(crate) waits: Option<Arc<WaitFn>>,
}

impl Calls {
    pub(crate) fn new(api: ReplicationApi) -> Calls {
        Calls {
            api,
            handlers: Vec::new(),
            cache: Mutex::new(ResponseCache::new()),
            positions: None,
            waits: None,
        }
    }

    /// Answers a call whose headers and body passed: waits for the
    /// caller's positions, looks its txn id up, has it handled, adds this
    /// process's positions. `deadline` is the request's own.
    pub(crate) async fn answer<R: Runtime>(
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
            _ => handle(runtime, &handler, request, deadline).await.0,
        };
        if waits_for_streams && status == 200 {
            let positions = self.positions.as_ref().map(|f| f()).unwrap_or_default();
            (status, answer_body(&body, &positions))
        } else {
            (status, body)
        }
    }

    /// The answer of a call with a txn id: handled once, kept for its
    /// retries, waited for by its concurrent duplicates.
    #[allow(clippy::too_many_arguments)]
    async fn cached<R: Runtime>(
        &self,
        runtime: &R,
        endpoint: &str,
        txn_id: &str,
        print: u64,
        handler: Arc<CallHandler>,
        request: ReplicationRequest,
        deadline: Instant,
    ) -> (u16, String) {
        let lookup = self.lock().lookup(endpoint, txn_id, print, runtime.now());
        match lookup {
            CacheLookup::Answer(answer) => (answer.status, answer.body),
            CacheLookup::Conflict => error(&ReplicationError::TxnConflict(
                txn_id.chars().take(64).collect(),
            )),
            CacheLookup::Full => error(&ReplicationError::Busy),
            CacheLookup::Wait => {
                let (tx, rx) = oneshot::channel();
                if self.lock().wait(endpoint, txn_id, tx).is_err() {
                    return error(&ReplicationError::Busy);
                }
                match future::select(rx, runtime.sleep_until(deadline)).await {
                    Either::Left((Ok(answer), _)) => (answer.status, answer.body),
                    Either::Left((Err(_), _)) | Either::Right(_) => timed_out(),
                }
            }
            CacheLookup::Handle => {
                // Dropped before it finishes (the caller went away): its
                // waiters are answered, and a retry is handled afresh.
                let mut guard = InFlight {
                    calls: self,
                    endpoint,
                    txn_id,
                    now: runtime.now(),
                    done: false,
                };
                let (answer, keep) = handle(runtime, &handler, request, deadline).await;
                guard.done = true;
                let waiters = self.lock().finish(
                    endpoint,
                    txn_id,
                    CachedAnswer {
                        status: answer.0,
                        body: answer.1.clone(),
                    },
                    keep,
                    runtime.now(),
                );
                for waiter in waiters {
                    let _ = waiter.send(CachedAnswer {
                        status: answer.0,
                        body: answer.1.clone(),
                    });
                }
                answer
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ResponseCache<oneshot::Sender<CachedAnswer>>> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A call being handled under its txn id; finished as failed if dropped.
struct InFlight<'a> {
    calls: &'a Calls,
    endpoint: &'a str,
    txn_id: &'a str,
    now: Instant,
    done: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (status, body) = timed_out();
        let waiters = self.calls.lock().finish(
            self.endpoint,
            self.txn_id,
            CachedAnswer {
                status,
                body: body.clone(),
            },
            false,
            self.now,
        );
        for waiter in waiters {
            let _ = waiter.send(CachedAnswer {
                status,
                body: body.clone(),
            });
        }
    }
}

/// Runs `handler` by `deadline`: its answer, and whether it is a success
/// to keep for retries (Synapse keeps what `_handle_request` returned,
/// not what it raised).
async fn handle<R: Runtime>(
    runtime: &R,
    handler: &Arc<CallHandler>,
    request: ReplicationRequest,
    deadline: Instant,
) -> ((u16, String), bool) {
    let endpoint = request.endpoint.clone();
    match future::select(handler(request), runtime.sleep_until(deadline)).await {
        Either::Left((Ok(content), _)) => ((200, Value::Object(content).to_string()), true),
        Either::Left((Err(refusal), _)) => {
            tracing::debug!(endpoint, %refusal, "replication call refused by its handler");
            (error(&refusal), false)
        }
        Either::Right(_) => {
            tracing::warn!(endpoint, "replication call not handled in time");
            (timed_out(), false)
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
