//! Catch-ups in flight: what a driver fetches from its [`CatchUpSource`]
//! for the follower, and the retries of what failed.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};

use crate::positions::{CatchUpError, CatchUpId, CatchUpPage, CatchUpRequest};

use super::runtime::{BoxFuture, Runtime};
use super::{Backoff, BoxError, CatchUpSource};

/// A session whose follower takes catch-up answers.
pub(super) trait CatchUpTarget {
    fn handle_catch_up(&mut self, id: CatchUpId, page: CatchUpPage) -> Result<(), CatchUpError>;
    fn catch_up_failed(&mut self, id: CatchUpId) -> Result<(), CatchUpError>;
}

impl CatchUpTarget for crate::session::ClientSession {
    fn handle_catch_up(&mut self, id: CatchUpId, page: CatchUpPage) -> Result<(), CatchUpError> {
        crate::session::ClientSession::handle_catch_up(self, id, page)
    }

    fn catch_up_failed(&mut self, id: CatchUpId) -> Result<(), CatchUpError> {
        crate::session::ClientSession::catch_up_failed(self, id)
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
pub(super) struct Failure {
    pub(super) request: CatchUpRequest,
    pub(super) error: BoxError,
    pub(super) retry_in: Duration,
}

/// The fetches of one driver.
pub(super) struct CatchUps {
    source: Option<Arc<dyn CatchUpSource>>,
    fetches: FuturesUnordered<BoxFuture<'static, Fetched>>,
    backoff: Backoff,
}

impl CatchUps {
    pub(super) fn new(initial: Duration, max: Duration) -> CatchUps {
        CatchUps {
            source: None,
            fetches: FuturesUnordered::new(),
            backoff: Backoff::new(initial, max),
        }
    }

    pub(super) fn set_source(&mut self, source: Arc<dyn CatchUpSource>) {
        self.source = Some(source);
    }

    pub(super) fn len(&self) -> usize {
        self.fetches.len()
    }

    pub(super) fn clear(&mut self) {
        self.fetches = FuturesUnordered::new();
    }

    /// Starts fetching `request`, if there is a source.
    pub(super) fn start(&mut self, request: &CatchUpRequest) {
        if let Some(source) = &self.source {
            let request = request.clone();
            let fetch = source.fetch(request.clone());
            self.fetches
                .push(Box::pin(async move { Fetched::Page(request, fetch.await) }));
        }
    }

    /// Applies the fetches that completed to `target`; reports failures,
    /// which are asked again after a backoff. True if anything completed.
    pub(super) fn poll(
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
                            self.backoff.reset();
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
            let retry_in = self.backoff.next_delay();
            let sleep = runtime.sleep_until(runtime.now() + retry_in);
            let id = request.id;
            self.fetches.push(Box::pin(async move {
                sleep.await;
                Fetched::Retry(id)
            }));
            failed(Failure {
                request,
                error,
                retry_in,
            });
        }
        progress
    }
}
