//! Catch-ups in flight: what a driver fetches from its [`CatchUpSource`]
//! for the follower, the retries of what failed, and which are stuck.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};

use crate::positions::{
    BoxError, CatchUpError, CatchUpId, CatchUpPage, CatchUpRequest, STUCK_AFTER_FAILURES,
    StuckCatchUp,
};
use crate::wire::{InstanceName, StreamName};

use crate::transport::client::backoff::Backoff;
use crate::transport::client::source::CatchUpSource;
use crate::transport::runtime::{BoxFuture, Runtime, deadline_after};

/// A session whose follower takes catch-up answers.
pub(crate) trait CatchUpTarget {
    fn handle_catch_up(&mut self, id: CatchUpId, page: CatchUpPage) -> Result<(), CatchUpError>;
    fn catch_up_failed(&mut self, id: CatchUpId) -> Result<(), CatchUpError>;
}

impl CatchUpTarget for crate::session::TcpClientSession {
    fn handle_catch_up(&mut self, id: CatchUpId, page: CatchUpPage) -> Result<(), CatchUpError> {
        crate::session::TcpClientSession::handle_catch_up(self, id, page)
    }

    fn catch_up_failed(&mut self, id: CatchUpId) -> Result<(), CatchUpError> {
        crate::session::TcpClientSession::catch_up_failed(self, id)
    }
}

impl CatchUpTarget for crate::session::RedisSession {
    fn handle_catch_up(&mut self, id: CatchUpId, page: CatchUpPage) -> Result<(), CatchUpError> {
        crate::session::RedisSession::handle_catch_up(self, id, page)
    }

    fn catch_up_failed(&mut self, id: CatchUpId) -> Result<(), CatchUpError> {
        crate::session::RedisSession::catch_up_failed(self, id)
    }
}

enum Fetched {
    Page(CatchUpRequest, Result<CatchUpPage, BoxError>),
    Retry(CatchUpId),
}

/// A fetch that failed; it is asked again after `retry_in`.
pub(crate) struct Failure {
    pub(crate) request: CatchUpRequest,
    pub(crate) error: BoxError,
    pub(crate) retry_in: Duration,
    /// Failures in a row of this writer's catch-up, this one included.
    pub(crate) failures: u32,
    /// Set on the failure that makes the catch-up stuck.
    pub(crate) stuck: Option<StuckCatchUp>,
}

/// A (stream, writer) whose catch-up is failing.
struct Trouble {
    since: Instant,
    failures: u32,
    backoff: Backoff,
    request: CatchUpRequest,
    error: String,
}

/// The fetches of one driver.
pub(crate) struct CatchUps {
    source: Option<Arc<dyn CatchUpSource>>,
    fetches: FuturesUnordered<BoxFuture<'static, Fetched>>,
    initial: Duration,
    max: Duration,
    /// Per (stream, writer): each failing catch-up backs off on its own.
    troubles: HashMap<(StreamName, InstanceName), Trouble>,
}

impl CatchUps {
    pub(crate) fn new(initial: Duration, max: Duration) -> CatchUps {
        CatchUps {
            source: None,
            fetches: FuturesUnordered::new(),
            initial,
            max,
            troubles: HashMap::new(),
        }
    }

    /// The catch-ups that failed [`STUCK_AFTER_FAILURES`] times or more in
    /// a row and have not succeeded since.
    pub(crate) fn stuck(&self) -> Vec<StuckCatchUp> {
        let mut stuck: Vec<StuckCatchUp> = self
            .troubles
            .values()
            .filter(|t| t.failures >= STUCK_AFTER_FAILURES)
            .map(Trouble::report)
            .collect();
        stuck.sort_by_key(|s| s.since);
        stuck
    }

    pub(crate) fn set_source(&mut self, source: Arc<dyn CatchUpSource>) {
        self.source = Some(source);
    }

    pub(crate) fn len(&self) -> usize {
        self.fetches.len()
    }

    pub(crate) fn clear(&mut self) {
        self.fetches = FuturesUnordered::new();
        self.troubles.clear();
    }

    /// Starts fetching `request`, if there is a source.
    pub(crate) fn start(&mut self, request: &CatchUpRequest) {
        if let Some(source) = &self.source {
            let request = request.clone();
            let source = Arc::clone(source);
            self.fetches.push(Box::pin(async move {
                let page = source.fetch(request.clone()).await;
                Fetched::Page(request, page)
            }));
        }
    }

    /// Applies the fetches that completed to `target`; reports failures,
    /// which are asked again after a backoff. True if anything completed.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        runtime: &dyn Runtime,
        target: &mut dyn CatchUpTarget,
        mut failed: impl FnMut(Failure),
    ) -> bool {
        let mut progress = false;
        while let Poll::Ready(Some(fetched)) = self.fetches.poll_next_unpin(cx) {
            progress = true;
            let failure = match fetched {
                Fetched::Page(request, Ok(page)) => {
                    match target.handle_catch_up(request.id, page) {
                        Ok(()) => {
                            self.troubles
                                .remove(&(request.stream.clone(), request.writer.clone()));
                            continue;
                        }
                        Err(error) => (request, Box::new(error) as BoxError),
                    }
                }
                Fetched::Page(request, Err(error)) => (request, error),
                Fetched::Retry(id) => {
                    // Unknown ids were answered meanwhile: nothing to ask.
                    let _ = target.catch_up_failed(id);
                    continue;
                }
            };
            let (request, error) = failure;
            let now = runtime.now();
            let (initial, max) = (self.initial, self.max);
            let trouble = self
                .troubles
                .entry((request.stream.clone(), request.writer.clone()))
                .or_insert_with(|| Trouble {
                    since: now,
                    failures: 0,
                    backoff: Backoff::new(initial, max),
                    request: request.clone(),
                    error: String::new(),
                });
            trouble.failures = trouble.failures.saturating_add(1);
            trouble.request = request.clone();
            trouble.error = error.to_string();
            let retry_in = trouble.backoff.next_delay();
            let stuck = (trouble.failures == STUCK_AFTER_FAILURES).then(|| trouble.report());
            let failures = trouble.failures;
            let sleep = runtime.sleep_until(deadline_after(now, retry_in));
            let id = request.id;
            self.fetches.push(Box::pin(async move {
                sleep.await;
                Fetched::Retry(id)
            }));
            failed(Failure {
                request,
                error,
                retry_in,
                failures,
                stuck,
            });
        }
        progress
    }
}

impl Trouble {
    fn report(&self) -> StuckCatchUp {
        StuckCatchUp {
            stream: self.request.stream.clone(),
            writer: self.request.writer.clone(),
            from: self.request.from,
            to: self.request.to,
            since: self.since,
            failures: self.failures,
            error: self.error.clone(),
        }
    }
}
