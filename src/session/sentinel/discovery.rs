//! One round of asking the sentinels where the master is.

use std::fmt;

use bytes::Bytes;

use crate::resp::Incoming;

use super::RedisAuth;

use super::{
    AllowedMasters, DiscoveryError, DiscoveryStep, Exchange, Expect, MasterAddr, NodeRole,
    SentinelError, SentinelTarget, error_reply, parse_master_addr, parse_role,
};

/// One round of master discovery over a deployment's sentinels (see the
/// [module docs](crate::session::sentinel)).
///
/// # Call order
///
/// Call [`poll_step`](Self::poll_step); for
/// [`DiscoveryStep::Connect`], open the connection and call
/// [`connected`](Self::connected) (then write what
/// [`poll_transmit`](Self::poll_transmit) gives, give every byte read to
/// [`handle_input`](Self::handle_input), and call `poll_step` again after
/// each), or [`connect_failed`](Self::connect_failed) if it could not be
/// opened. A connection that closes, fails or times out is
/// [`connect_failed`](Self::connect_failed) too (or
/// [`timed_out`](Self::timed_out)). The round ends with
/// [`DiscoveryStep::Found`] or [`DiscoveryStep::Failed`]; later calls
/// return `None`.
///
/// Each sentinel is asked at most once per round, so a round ends after at
/// most two connections per sentinel.
///
/// A sentinel may name only a node the [`AllowedMasters`] allow (by
/// default the private address ranges; see
/// [`with_allowed_masters`](Self::with_allowed_masters)); the node is
/// asked `ROLE` before it is sent any credentials, and sent them only if
/// it refuses to answer without.
#[derive(Debug)]
pub struct SentinelDiscovery {
    service: String,
    sentinel_auth: Option<RedisAuth>,
    master_auth: Option<RedisAuth>,
    allowed: AllowedMasters,
    /// Whether the node being checked was sent the credentials.
    sent_master_auth: bool,
    count: usize,
    first: usize,
    /// Sentinels asked so far (the current one included).
    asked: usize,
    failures: Vec<(usize, SentinelError)>,
    state: RoundState,
    /// The sentinel whose answer is being checked.
    checking_for: Option<usize>,
    exchange: Exchange,
}

#[derive(Debug)]
enum RoundState {
    /// The next sentinel is to be asked.
    Next,
    /// Waiting for a connection to the target.
    Connecting(SentinelTarget),
    /// Asking the sentinel.
    Asking(usize),
    /// Checking the role of the node the sentinel named.
    Checking(usize, MasterAddr),
    /// A step is ready.
    Step(DiscoveryStep),
    Done,
}

impl SentinelDiscovery {
    /// A round for `service` over `sentinels` sentinels, starting with the
    /// one at index `first` (the one that answered last time; taken
    /// modulo `sentinels`), with the sentinels' and the data nodes'
    /// credentials.
    pub fn new(
        service: impl Into<String>,
        sentinels: usize,
        first: usize,
        sentinel_auth: Option<RedisAuth>,
        master_auth: Option<RedisAuth>,
    ) -> SentinelDiscovery {
        SentinelDiscovery {
            service: service.into(),
            sentinel_auth,
            master_auth,
            allowed: AllowedMasters::default(),
            sent_master_auth: false,
            count: sentinels,
            first: first.checked_rem(sentinels).unwrap_or(0),
            asked: 0,
            failures: Vec::new(),
            state: RoundState::Next,
            checking_for: None,
            exchange: Exchange::new(),
        }
    }

    /// Only nodes these allow may be taken for the master (default
    /// [`AllowedMasters::private_networks`]); a sentinel that names
    /// another fails with [`SentinelError::NotAllowed`], and the node is
    /// not connected to.
    #[must_use]
    pub fn with_allowed_masters(mut self, allowed: AllowedMasters) -> SentinelDiscovery {
        self.allowed = allowed;
        self
    }

    /// What to do next; `None` while waiting for I/O, and once the round
    /// has ended.
    #[must_use]
    pub fn poll_step(&mut self) -> Option<DiscoveryStep> {
        if let RoundState::Next = self.state {
            self.state = if self.asked < self.count {
                let sentinel = (self.first + self.asked) % self.count;
                self.asked += 1;
                let target = SentinelTarget::Sentinel(sentinel);
                self.state = RoundState::Connecting(target.clone());
                return Some(DiscoveryStep::Connect(target));
            } else {
                RoundState::Step(DiscoveryStep::Failed(DiscoveryError {
                    service: self.service.clone(),
                    failures: std::mem::take(&mut self.failures),
                }))
            };
        }
        match std::mem::replace(&mut self.state, RoundState::Done) {
            RoundState::Step(step) => {
                if let DiscoveryStep::Connect(target) = &step {
                    self.state = RoundState::Connecting(target.clone());
                }
                Some(step)
            }
            other => {
                self.state = other;
                None
            }
        }
    }

    /// The sentinel being asked, or whose answer is being checked.
    fn current(&self) -> Option<usize> {
        match &self.state {
            RoundState::Connecting(SentinelTarget::Sentinel(sentinel))
            | RoundState::Asking(sentinel)
            | RoundState::Checking(sentinel, _) => Some(*sentinel),
            _ => None,
        }
    }

    /// The sentinels asked so far in this round that did not do, and why
    /// (all of them, in [`DiscoveryStep::Failed`]).
    pub fn failures(&self) -> &[(usize, SentinelError)] {
        &self.failures
    }

    /// The connection asked for is open: the question is queued.
    pub fn connected(&mut self) {
        let RoundState::Connecting(target) = &self.state else {
            return;
        };
        self.exchange = Exchange::new();
        match target.clone() {
            SentinelTarget::Sentinel(sentinel) => {
                self.exchange.auth(self.sentinel_auth.as_ref());
                self.exchange.ask(
                    &[
                        b"SENTINEL",
                        b"get-master-addr-by-name",
                        self.service.as_bytes(),
                    ],
                    Expect::MasterAddr,
                );
                self.state = RoundState::Asking(sentinel);
            }
            SentinelTarget::Master(addr) => {
                // The role first: credentials go only to a node that will
                // not say without them.
                self.sent_master_auth = false;
                self.exchange.ask(&[b"ROLE"], Expect::Role);
                let sentinel = self.checking_for.take().unwrap_or_default();
                self.state = RoundState::Checking(sentinel, addr);
            }
        }
    }

    /// The connection asked for could not be opened, or the one in use
    /// failed or closed (`reason` says why): the next sentinel is asked.
    pub fn connect_failed(&mut self, reason: impl fmt::Display) {
        self.fail(SentinelError::Unreachable(reason.to_string()));
    }

    /// The connection in use answered nothing in the driver's time limit:
    /// the next sentinel is asked.
    pub fn timed_out(&mut self) {
        self.fail(SentinelError::Timeout);
    }

    fn fail(&mut self, error: SentinelError) {
        let sentinel = match &self.state {
            RoundState::Connecting(SentinelTarget::Master(_)) => self.checking_for.take(),
            _ => self.current(),
        };
        if let Some(sentinel) = sentinel {
            self.failures.push((sentinel, error));
            self.state = RoundState::Next;
        }
    }

    /// Bytes to write on the connection in use.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        self.exchange.transmit()
    }

    /// Bytes read from the connection in use, in any chunks.
    pub fn handle_input(&mut self, data: &[u8]) {
        if !matches!(self.state, RoundState::Asking(_) | RoundState::Checking(..)) {
            return;
        }
        self.exchange.input.extend_from_slice(data);
        loop {
            let (expect, incoming) = match self.exchange.next() {
                Ok(Some(reply)) => reply,
                Ok(None) => return,
                Err(error) => return self.fail(error),
            };
            let frame = match incoming {
                Incoming::Frame(frame) => frame,
                Incoming::Pong(_) | Incoming::Message(_) | Incoming::Subscription { .. } => {
                    return self.fail(SentinelError::Malformed(
                        "a pub/sub reply to a question".to_owned(),
                    ));
                }
            };
            match expect {
                None => {}
                Some(Expect::Auth) => {
                    if let Some(error) = error_reply(&frame) {
                        return self.fail(SentinelError::Refused(error));
                    }
                }
                Some(Expect::MasterAddr) => {
                    let RoundState::Asking(sentinel) = self.state else {
                        return;
                    };
                    match parse_master_addr(&frame, &self.service) {
                        Ok(addr) if !self.allowed.allows(&addr.host) => {
                            self.fail(SentinelError::NotAllowed { addr });
                        }
                        Ok(addr) => {
                            self.checking_for = Some(sentinel);
                            self.state = RoundState::Step(DiscoveryStep::Connect(
                                SentinelTarget::Master(addr),
                            ));
                        }
                        Err(error) => self.fail(error),
                    }
                    return;
                }
                Some(Expect::Role) => {
                    let RoundState::Checking(sentinel, addr) =
                        std::mem::replace(&mut self.state, RoundState::Done)
                    else {
                        return;
                    };
                    match parse_role(&frame) {
                        Err(SentinelError::Refused(error))
                            if !self.sent_master_auth
                                && self.master_auth.is_some()
                                && matches!(error.code.as_str(), "NOAUTH" | "NOPERM") =>
                        {
                            // It will not say without the credentials: the
                            // allow list is what vouched for it.
                            self.sent_master_auth = true;
                            self.exchange.auth(self.master_auth.as_ref());
                            self.exchange.ask(&[b"ROLE"], Expect::Role);
                            self.state = RoundState::Checking(sentinel, addr);
                        }
                        Ok(NodeRole::Master) => {
                            self.state = RoundState::Step(DiscoveryStep::Found {
                                master: addr,
                                sentinel,
                            });
                        }
                        Ok(role) => {
                            self.state = RoundState::Checking(sentinel, addr.clone());
                            self.fail(SentinelError::NotMaster { addr, role });
                        }
                        Err(error) => {
                            self.state = RoundState::Checking(sentinel, addr);
                            self.fail(error);
                        }
                    }
                    return;
                }
                Some(other) => {
                    return self.fail(SentinelError::Malformed(format!(
                        "a reply for {other:?} in discovery"
                    )));
                }
            }
        }
    }
}
