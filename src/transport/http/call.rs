//! Calling another process's replication endpoints (feature
//! `http-catch-up`): [`ReplicationClient`], the caller's side of
//! Synapse's replication HTTP API, as `ReplicationEndpoint.make_client`
//! does it.

use std::fmt;
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::{self, Either};
use hyper::client::conn::http1;
use hyper::header::{self, HeaderValue};
use serde_json::{Map, Value};

use super::catch_up::{Https, authority, collect, drive, txn_id};
use super::hyper_io::HyperIo;
use crate::config::{InstanceLocation, StreamWriters, SynapseConfig, TlsConfig};
use crate::http::{
    AccountDataAnswer, AccountDataRequest, Method, RemoteError, ReplicationAnswer,
    ReplicationEndpoint, StreamPositions, WAIT_FOR_POSITIONS, call_body, call_query, read_answer,
};
use crate::positions::BoxError;
use crate::transport::client::waits::PositionWaiter;
use crate::transport::runtime::{BoxFuture, Runtime, deadline_after};
use crate::wire::{InstanceName, StreamName, Token};

/// How long one attempt may take, connecting included, by default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest answer read.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// The size of the buffer bytes are read into before hyper copies them.
const READ_CHUNK: usize = 16 * 1024;

type PositionsFn = dyn Fn() -> Vec<(StreamName, Token)> + Send + Sync;
type WaitFn =
    dyn Fn(StreamName, InstanceName, Token, Instant) -> BoxFuture<'static, bool> + Send + Sync;

/// How often a call is tried again, and after how long.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallRetries {
    /// Attempts after a refused or failed connection (6: Synapse's
    /// `RETRY_ON_CONNECT_ERROR_ATTEMPTS` of 5, counted as it counts them),
    /// each after twice the last delay.
    pub connect_attempts: u32,
    /// The delay before the first of those (1 s; 63 s in all, as Synapse).
    pub first_delay: Duration,
    /// Attempts after no answer within the timeout, or a 504 (3; Synapse
    /// retries a timeout for ever), each after `timeout_delay`. The call
    /// keeps its txn id: the callee answers a retry from its cache.
    pub timeout_attempts: u32,
    /// The delay before each of those (1 s, as Synapse).
    pub timeout_delay: Duration,
}

impl Default for CallRetries {
    fn default() -> Self {
        CallRetries {
            connect_attempts: 6,
            first_delay: Duration::from_secs(1),
            timeout_attempts: 3,
            timeout_delay: Duration::from_secs(1),
        }
    }
}

/// Calls the replication endpoints of the other processes of a
/// deployment, as Synapse's processes call each other
/// (`ReplicationEndpoint.make_client` in `replication/http/_base.py`):
///
/// - to the callee's `instance_map` address (`main` for `master`),
///   HTTP, or HTTPS for an entry that says `tls: true` (feature `tls`),
///   with `Authorization: Bearer <worker_replication_secret>`;
/// - a fresh txn id per call for an endpoint that caches, kept through the
///   call's retries so that the callee handles it once;
/// - the body carries this process's positions on the streams it writes
///   ([`with_positions`](Self::with_positions)) under `_INT_STREAM_POS`,
///   for endpoints that wait for streams (not `GET`s);
/// - retried as [`CallRetries`] says: a connection refused or lost before
///   the request was sent, with backoff; no answer in time or a 504, with
///   the same txn id;
/// - once answered, the call waits until this process's follower has seen
///   the callee's positions
///   ([`with_waiter`](Self::with_waiter)), five seconds at
///   most, as Synapse does, so that a read after the call sees what the
///   call wrote; [`ReplicationAnswer::seen`] says whether it had.
///
/// Errors say which instance and endpoint ([`ReplicationCallError`]);
/// an error answer is the callee's Synapse error
/// ([`CallFailure::Remote`]). The secret never appears in
/// errors, logs or `Debug` output.
///
/// ```no_run
/// # #[cfg(feature = "runtime-smol")]
/// # async fn call(synapse: synapse_replication::config::SynapseConfig) -> Result<(), Box<dyn std::error::Error>> {
/// use serde_json::json;
/// use synapse_replication::http::ReplicationEndpoint;
/// use synapse_replication::transport::{ReplicationClient, SmolRuntime};
/// use synapse_replication::wire::InstanceName;
///
/// let client = ReplicationClient::from_synapse(SmolRuntime, &synapse, "rust1");
/// let content = json!({
///     "device_id": null,
///     "state": {"presence": "online", "status_msg": "from Rust"},
///     "force_notify": false,
///     "is_sync": false,
/// });
/// let answer = client
///     .call(
///         &InstanceName::from("presence1"),
///         &ReplicationEndpoint::presence_set_state(),
///         &["@alice:example.com"],
///         content.as_object().cloned().unwrap_or_default(),
///     )
///     .await?;
/// println!("presence1 wrote up to {:?}", answer.positions);
/// # Ok(())
/// # }
/// ```
pub struct ReplicationClient<R: Runtime> {
    runtime: Arc<R>,
    own: InstanceName,
    writers: Arc<StreamWriters>,
    authorization: Option<Result<HeaderValue, ()>>,
    https: Arc<Https>,
    timeout: Duration,
    retries: CallRetries,
    positions: Option<Arc<PositionsFn>>,
    waits: Option<Arc<WaitFn>>,
}

impl<R: Runtime> fmt::Debug for ReplicationClient<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secret = match self.authorization {
            None => "none",
            Some(_) => "<redacted>",
        };
        f.debug_struct("ReplicationClient")
            .field("own", &self.own)
            .field("secret", &secret)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> Clone for ReplicationClient<R> {
    fn clone(&self) -> Self {
        ReplicationClient {
            runtime: Arc::clone(&self.runtime),
            own: self.own.clone(),
            writers: Arc::clone(&self.writers),
            authorization: self.authorization.clone(),
            https: Arc::clone(&self.https),
            timeout: self.timeout,
            retries: self.retries.clone(),
            positions: self.positions.clone(),
            waits: self.waits.clone(),
        }
    }
}

impl<R: Runtime> ReplicationClient<R> {
    /// Calls from the process `own` to the addresses of `writers`'
    /// `instance_map`, with Synapse's `worker_replication_secret` (`None`
    /// when the deployment has none).
    pub fn new(
        runtime: R,
        writers: Arc<StreamWriters>,
        secret: Option<String>,
        own: impl Into<InstanceName>,
    ) -> ReplicationClient<R> {
        let authorization = secret.map(|secret| {
            let mut value = HeaderValue::from_str(&format!("Bearer {secret}")).map_err(|_| ())?;
            value.set_sensitive(true);
            Ok(value)
        });
        ReplicationClient {
            runtime: Arc::new(runtime),
            own: own.into(),
            writers,
            authorization,
            https: Arc::default(),
            timeout: DEFAULT_TIMEOUT,
            retries: CallRetries::default(),
            positions: None,
            waits: None,
        }
    }

    /// Calls from the process `own` of the deployment `synapse` describes.
    pub fn from_synapse(
        runtime: R,
        synapse: &SynapseConfig,
        own: impl Into<InstanceName>,
    ) -> ReplicationClient<R> {
        ReplicationClient::new(
            runtime,
            synapse.writers().clone(),
            synapse.replication_secret().map(str::to_owned),
            own,
        )
    }

    /// Sends `positions()` with each call: this process's token on each
    /// stream it writes (Synapse's `minimal_local_current_token`), which
    /// the callee waits to have seen. Without it calls carry none.
    #[must_use]
    pub fn with_positions<F>(mut self, positions: F) -> ReplicationClient<R>
    where
        F: Fn() -> Vec<(StreamName, Token)> + Send + Sync + 'static,
    {
        self.positions = Some(Arc::new(positions));
        self
    }

    /// Before a call returns, waits until this process's follower (the
    /// client `waiter` came from: [`RedisClient::waiter`](crate::transport::RedisClient::waiter))
    /// has applied the callee's positions, five seconds at most, as
    /// Synapse does.
    #[must_use]
    pub fn with_waiter(self, waiter: PositionWaiter) -> ReplicationClient<R> {
        self.with_position_waits(move |stream, writer, token, deadline| {
            waiter.reached_by(stream, writer, token, deadline)
        })
    }

    /// [`with_waiter`](Self::with_waiter) for a follower of the
    /// application's own: waits with `wait(stream, writer, token, deadline)` for each of the
    /// callee's positions before a call returns: a future that says `true`
    /// once this process's follower has seen `writer` reach `token` on
    /// `stream`, `false` when it gives up at `deadline`. Without it calls
    /// return as soon as they are answered.
    #[must_use]
    pub fn with_position_waits<F>(mut self, wait: F) -> ReplicationClient<R>
    where
        F: Fn(StreamName, InstanceName, Token, Instant) -> BoxFuture<'static, bool>
            + Send
            + Sync
            + 'static,
    {
        self.waits = Some(Arc::new(wait));
        self
    }

    /// How callees whose `instance_map` entry says `tls: true` are
    /// reached (see `HttpCatchUp::with_tls`).
    #[must_use]
    pub fn with_tls(mut self, tls: TlsConfig) -> ReplicationClient<R> {
        self.https = Arc::new(Https {
            tls,
            cache: Default::default(),
        });
        self
    }

    /// How long one attempt may take, from connecting to the last byte of
    /// the answer (60 s unless set).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> ReplicationClient<R> {
        self.timeout = timeout;
        self
    }

    /// How failed attempts are retried.
    #[must_use]
    pub fn with_retries(mut self, retries: CallRetries) -> ReplicationClient<R> {
        self.retries = retries;
        self
    }

    /// Calls `endpoint` on `instance` with these path arguments and
    /// `content` (the body, without `_INT_STREAM_POS`; for a `GET`, the
    /// query, as [`call_query`](crate::http::call_query) writes it),
    /// retrying as [`CallRetries`] says; the answer once this process has
    /// seen the callee's positions (or waited five seconds).
    pub async fn call(
        &self,
        instance: &InstanceName,
        endpoint: &ReplicationEndpoint,
        args: &[&str],
        content: Map<String, Value>,
    ) -> Result<ReplicationAnswer, ReplicationCallError> {
        let fail = Fail {
            instance: instance.clone(),
            endpoint: endpoint.name().to_owned(),
        };
        if instance == &self.own {
            return Err(fail.error(CallFailure::ToItself));
        }
        let location = self
            .writers
            .location(instance)
            .or_else(|| {
                instance
                    .is_master()
                    .then(|| self.writers.location(&InstanceName::from("main")))
                    .flatten()
            })
            .cloned()
            .ok_or_else(|| fail.error(CallFailure::NotInInstanceMap))?;
        let authorization = match &self.authorization {
            None => None,
            Some(Ok(value)) => Some(value.clone()),
            Some(Err(())) => return Err(fail.error(CallFailure::InvalidSecret)),
        };
        let txn = endpoint.caches().then(txn_id);
        let mut path = endpoint.path(args, txn.as_deref());
        if endpoint.method() == Method::Get && !content.is_empty() {
            path.push('?');
            path.push_str(&call_query(&content));
        }
        let body = if endpoint.method() == Method::Get {
            String::new()
        } else {
            let positions = endpoint.waits_for_streams().then(|| StreamPositions {
                instance: self.own.clone(),
                streams: self.positions.as_ref().map(|f| f()).unwrap_or_default(),
            });
            call_body(content, positions.as_ref())
        };
        let body = Bytes::from(body);
        let retries = &self.retries;
        let (mut connect_failures, mut timeouts) = (0u32, 0u32);
        let answer = loop {
            let attempt = self.attempt(
                &location,
                endpoint.method(),
                &path,
                &body,
                authorization.clone(),
            );
            let failure = match attempt.await {
                Ok((status, answer)) if status == 504 => CallFailure::TimedOut {
                    status: Some(status),
                    body: String::from_utf8_lossy(&answer).chars().take(200).collect(),
                },
                Ok((status, answer)) => break read_answer(status, &answer),
                Err(failure) => failure,
            };
            let delay = match &failure {
                CallFailure::Connect { .. } if connect_failures < retries.connect_attempts => {
                    let delay = retries.first_delay * 2u32.saturating_pow(connect_failures);
                    connect_failures += 1;
                    delay
                }
                CallFailure::TimedOut { .. } if timeouts < retries.timeout_attempts => {
                    timeouts += 1;
                    retries.timeout_delay
                }
                _ => return Err(fail.error(failure)),
            };
            tracing::warn!(
                instance = %instance,
                endpoint = endpoint.name(),
                error = %failure,
                retry_in = ?delay,
                "replication call failed; retrying"
            );
            self.runtime
                .sleep_until(deadline_after(self.runtime.now(), delay))
                .await;
        };
        let mut answer = answer.map_err(|error| fail.error(CallFailure::Remote(error)))?;
        answer.seen = self.wait_for(instance, &answer.positions).await;
        Ok(answer)
    }

    /// Sends `request` to the deployment's account-data writer (the
    /// instance `stream_writers.account_data` names, `master` when it
    /// names none), as Synapse's `AccountDataHandler` does when it is not
    /// that writer: the endpoint's path and body (see
    /// [`AccountDataRequest`]), this process's positions, no txn id (a
    /// retry after a timeout is handled again, as Synapse's are); the
    /// `account_data` position after the change once this process has seen
    /// the writer's positions (or waited five seconds, as Synapse does).
    ///
    /// ```no_run
    /// # #[cfg(feature = "runtime-smol")]
    /// # async fn call(client: synapse_replication::transport::ReplicationClient<synapse_replication::transport::SmolRuntime>) -> Result<(), Box<dyn std::error::Error>> {
    /// use synapse_replication::http::AccountDataRequest;
    ///
    /// let answer = client
    ///     .account_data(&AccountDataRequest::RemoveTag {
    ///         user_id: "@alice:example.com".into(),
    ///         room_id: "!room:example.com".into(),
    ///         tag: "u.work".into(),
    ///     })
    ///     .await?;
    /// println!("untagged at {}", answer.max_stream_id);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn account_data(
        &self,
        request: &AccountDataRequest,
    ) -> Result<AccountDataAnswer, ReplicationCallError> {
        let writer = self
            .writers
            .writers_of(&StreamName::AccountData)
            .and_then(|writers| writers.first())
            .cloned()
            .unwrap_or_else(InstanceName::master);
        let endpoint = request.endpoint();
        let answer = self
            .call(&writer, &endpoint, &request.args(), request.content())
            .await?;
        AccountDataAnswer::from_content(200, &answer.content).map_err(|error| {
            Fail {
                instance: writer,
                endpoint: endpoint.name().to_owned(),
            }
            .error(CallFailure::Remote(error))
        })
    }

    /// Whether this process saw `instance` reach every position within
    /// five seconds.
    async fn wait_for(&self, instance: &InstanceName, positions: &[(StreamName, Token)]) -> bool {
        if positions.is_empty() {
            return true;
        }
        let Some(waits) = &self.waits else {
            return false;
        };
        let by = self.runtime.now() + WAIT_FOR_POSITIONS;
        let all = positions
            .iter()
            .map(|(stream, token)| waits(stream.clone(), instance.clone(), *token, by));
        let seen = !future::join_all(all).await.contains(&false);
        if !seen {
            tracing::warn!(
                instance = %instance,
                "timed out waiting for the callee's stream positions; returning anyway"
            );
        }
        seen
    }

    /// One attempt, within the timeout: the status and body, or why none.
    async fn attempt(
        &self,
        location: &InstanceLocation,
        method: Method,
        path: &str,
        body: &Bytes,
        authorization: Option<HeaderValue>,
    ) -> Result<(u16, Bytes), CallFailure> {
        let deadline = deadline_after(self.runtime.now(), self.timeout);
        let exchange = pin!(self.exchange(location, method, path, body, authorization));
        match future::select(exchange, self.runtime.sleep_until(deadline)).await {
            Either::Left((result, _)) => result,
            Either::Right(((), _)) => Err(CallFailure::TimedOut {
                status: None,
                body: String::new(),
            }),
        }
    }

    async fn exchange(
        &self,
        location: &InstanceLocation,
        method: Method,
        path: &str,
        body: &Bytes,
        authorization: Option<HeaderValue>,
    ) -> Result<(u16, Bytes), CallFailure> {
        let (address, host) = match location {
            InstanceLocation::Tcp { host, port, .. } => {
                let authority = authority(host, *port);
                (authority.clone(), authority)
            }
            InstanceLocation::Unix { path } => (path.clone(), String::from("localhost")),
        };
        let request = |body: String| {
            let mut request = hyper::Request::builder()
                .method(method.as_str())
                .uri(path)
                .header(header::HOST, host.as_str())
                .header(header::CONNECTION, "close")
                .header(header::CONTENT_TYPE, "application/json")
                .body(body)
                .map_err(|error| CallFailure::Http(error.into()))?;
            if let Some(value) = authorization.clone() {
                request.headers_mut().insert(header::AUTHORIZATION, value);
            }
            Ok::<_, CallFailure>(request)
        };
        let request = request(String::from_utf8_lossy(body).into_owned())?;
        let connection = self
            .https
            .connect(&*self.runtime, location)
            .await
            .map_err(|source| CallFailure::Connect { address, source })?;
        let (mut sender, connection) = http1::handshake(HyperIo::new(connection, READ_CHUNK))
            .await
            .map_err(|error| CallFailure::Http(error.into()))?;
        let mut connection = pin!(connection);
        drive(connection.as_mut(), async {
            let response = sender.send_request(request).await?;
            let status = response.status().as_u16();
            let mut body = response.into_body();
            let (bytes, _) = collect(&mut body, MAX_ANSWER, None).await?;
            Ok((status, bytes))
        })
        .await
        .map_err(|error| CallFailure::Http(error.into()))
    }
}

/// Why a call failed, beside whom it was for.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallFailure {
    /// The callee is this process (Synapse: "Trying to send HTTP request
    /// to self").
    #[error("a process does not call itself")]
    ToItself,
    /// The callee has no `instance_map` entry.
    #[error("not in instance_map")]
    NotInInstanceMap,
    /// The secret cannot be sent in a header (it must be visible ASCII).
    #[error("worker_replication_secret is not a valid header value")]
    InvalidSecret,
    /// Connecting failed, the last of the attempts.
    #[error("cannot connect to {address}: {source}")]
    Connect {
        /// `host:port`, or the unix socket's path.
        address: String,
        /// Why.
        source: io::Error,
    },
    /// The HTTP exchange failed after the request was sent (so it is not
    /// retried: the callee may have handled it).
    #[error("HTTP request failed: {0}")]
    Http(BoxError),
    /// No answer in time, or a 504, the last of the attempts.
    #[error("timed out{}", status.map(|s| format!(" (HTTP {s}: {body})")).unwrap_or_default())]
    TimedOut {
        /// 504 when the callee said so; `None` when no answer came.
        status: Option<u16>,
        /// The start of the callee's answer.
        body: String,
    },
    /// The callee answered with an error (Synapse's error body), or an
    /// answer that is not a JSON object.
    #[error("{0}")]
    Remote(RemoteError),
}

/// A call that failed: to which instance, which endpoint, and why.
#[derive(Debug, thiserror::Error)]
#[error("replication call {endpoint} on {instance}: {failure}")]
#[non_exhaustive]
pub struct ReplicationCallError {
    /// The callee.
    pub instance: InstanceName,
    /// The endpoint's `NAME`.
    pub endpoint: String,
    /// Why.
    pub failure: CallFailure,
}

struct Fail {
    instance: InstanceName,
    endpoint: String,
}

impl Fail {
    fn error(&self, failure: CallFailure) -> ReplicationCallError {
        ReplicationCallError {
            instance: self.instance.clone(),
            endpoint: self.endpoint.clone(),
            failure,
        }
    }
}
