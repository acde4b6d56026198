//! Properties of the direct TCP sessions: any split of the byte stream
//! gives the same events and the same answer; random schedules of inputs,
//! sends and time steps never panic, never give a deadline in the past,
//! always move the deadline forward, and after a fatal error transmit
//! nothing but the `ERROR` line.

mod common;

use std::time::{Duration, Instant};

use common::pair::{SERVER_NAME, client, row, server};
use proptest::prelude::*;
use synapse_replication::positions::{CatchUpPage, FollowerEvent};
use synapse_replication::session::{
    ConnectionState, TcpClientEvent, TcpClientId, TcpClientSession, TcpServerSession,
    TcpSessionConfig,
};
use synapse_replication::wire::{Command, FederationAck, InstanceName, StreamName, Token};

/// Small limits, so that every path is reached.
fn config() -> TcpSessionConfig {
    let mut config = TcpSessionConfig::default();
    config.max_line_len = 200;
    config.max_queued_commands = 20;
    config.max_transmit_len = 64;
    config
}

/// For the split properties: a queue that does not overflow (whether it
/// does depends on when the output is drained, not on the input's framing).
fn split_config() -> TcpSessionConfig {
    let mut config = config();
    config.max_queued_commands = 100_000;
    config
}

const STREAMS: &[&str] = &["caches", "typing", "custom_stream"];
const INSTANCES: &[&str] = &["master", "worker1", "persister"];

/// A line a server could send (mostly valid, sometimes fatal).
fn server_line() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0..3usize, 0..3usize, proptest::option::of(0i64..20), 0i64..100).prop_map(
            |(s, i, token, n)| {
                let token = token.map_or("batch".to_owned(), |t| t.to_string());
                format!(r#"RDATA {} {} {token} ["row",{n}]"#, STREAMS[s], INSTANCES[i])
            }
        ),
        3 => (0..3usize, 0..3usize, 0i64..20, 0i64..20).prop_map(|(s, i, p, n)| {
            format!("POSITION {} {} {p} {n}", STREAMS[s], INSTANCES[i])
        }),
        2 => (0u64..1_000_000).prop_map(|n| format!("PING {n}")),
        1 => Just(String::new()),
        1 => Just(" \t\r".to_owned()),
        1 => "[a-z ]{0,12}".prop_map(|text| format!("ERROR {text}")),
        1 => Just("REMOTE_SERVER_UP other.org".to_owned()),
        1 => Just(r#"LOCK_RELEASED ["master","lock","key"]"#.to_owned()),
        1 => Just(format!("SERVER {SERVER_NAME}")),
        1 => prop::sample::select(vec![
            "REPLICATE",
            "BOGUS x",
            "RDATA caches master 1 [",
            "SERVER other.org",
            "POSITION caches master x 1",
        ])
        .prop_map(str::to_owned),
        1 => (190usize..210).prop_map(|n| format!("PING {}", "x".repeat(n))),
    ]
}

/// A line a client could send (mostly valid, sometimes fatal).
fn client_line() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => (0u64..1_000_000).prop_map(|n| format!("PING {n}")),
        2 => Just("REPLICATE ".to_owned()),
        1 => Just("REPLICATE".to_owned()),
        1 => "[a-z0-9]{1,8}".prop_map(|name| format!("NAME {name}")),
        2 => (0i64..100).prop_map(|ms| format!("USER_SYNC worker1 @a:x.org DEV start {ms}")),
        1 => Just("CLEAR_USER_SYNC worker1".to_owned()),
        2 => (0i64..100).prop_map(|token| format!("FEDERATION_ACK worker1 {token}")),
        1 => Just(r#"USER_IP @a:x.org ["tok","10.0.0.1","ua",null,5]"#.to_owned()),
        1 => Just("REMOTE_SERVER_UP other.org".to_owned()),
        1 => Just(r#"LOCK_RELEASED ["worker1","lock","key"]"#.to_owned()),
        1 => "[a-z ]{0,12}".prop_map(|text| format!("ERROR {text}")),
        1 => Just(String::new()),
        1 => prop::sample::select(vec![
            r#"RDATA caches master 1 ["a"]"#,
            "POSITION caches master 1 1",
            "SERVER example.com",
            "NEW_ACTIVE_TASK 1",
            "BOGUS",
            "USER_SYNC w u d maybe 1",
        ])
        .prop_map(str::to_owned),
        1 => (190usize..210).prop_map(|n| format!("PING {}", "x".repeat(n))),
    ]
}

/// A byte stream of lines, maybe ending in an unfinished line.
fn stream_of(line: impl Strategy<Value = String>, lines: usize) -> impl Strategy<Value = Vec<u8>> {
    (prop::collection::vec(line, 0..lines), "[A-Z ]{0,8}").prop_map(|(lines, tail)| {
        let mut bytes = Vec::new();
        for line in lines {
            bytes.extend_from_slice(line.as_bytes());
            bytes.push(b'\n');
        }
        bytes.extend_from_slice(tail.as_bytes());
        bytes
    })
}

/// Cuts `data` at the given points (taken modulo its length).
fn chunks(data: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    if data.is_empty() {
        return vec![Vec::new()];
    }
    let mut points: Vec<usize> = cuts.iter().map(|c| c % data.len()).collect();
    points.push(0);
    points.push(data.len());
    points.sort_unstable();
    points.dedup();
    points
        .windows(2)
        .map(|w| data[w[0]..w[1]].to_vec())
        .collect()
}

/// What a session did with some input: events, bytes sent, final state.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    events: Vec<String>,
    sent: Vec<u8>,
    state: Option<ConnectionState>,
    buffered: usize,
}

impl Outcome {
    /// The same events and state as `whole`, and the same bytes sent, but
    /// for what a fatal error dropped: in one chunk, the answers to lines
    /// before the bad one are dropped with the queue; in smaller chunks
    /// some were already taken. Either way the last line is the same
    /// `ERROR`.
    fn check_against(&self, whole: &Outcome) -> Result<(), TestCaseError> {
        prop_assert_eq!(&self.events, &whole.events);
        prop_assert_eq!(self.state, whole.state);
        prop_assert_eq!(self.buffered, whole.buffered);
        let lines = |sent: &[u8]| -> Vec<Vec<u8>> {
            sent.split_inclusive(|b| *b == b'\n')
                .map(<[u8]>::to_vec)
                .collect()
        };
        let (mine, theirs) = (lines(&self.sent), lines(&whole.sent));
        if whole.state == Some(ConnectionState::Open) {
            prop_assert_eq!(mine, theirs);
            return Ok(());
        }
        prop_assert_eq!(mine.last(), theirs.last(), "the same ERROR");
        let (before, whole_before) = (&mine[..mine.len() - 1], &theirs[..theirs.len() - 1]);
        prop_assert!(before.starts_with(whole_before), "no other difference");
        Ok(())
    }
}

fn run_client(chunks: &[Vec<u8>]) -> Outcome {
    let now = Instant::now();
    let mut session = client(SERVER_NAME, split_config());
    session.connect(now);
    let mut outcome = Outcome {
        events: Vec::new(),
        sent: Vec::new(),
        state: None,
        buffered: 0,
    };
    while let Some(bytes) = session.poll_transmit() {
        outcome.sent.extend_from_slice(&bytes);
    }
    for chunk in chunks {
        session.handle_input(chunk, now);
        while let Some(bytes) = session.poll_transmit() {
            outcome.sent.extend_from_slice(&bytes);
        }
        while let Some(event) = session.poll_event() {
            outcome.events.push(format!("{event:?}"));
        }
    }
    outcome.state = session.state();
    outcome.buffered = session.buffered_input();
    outcome
}

fn run_server(chunks: &[Vec<u8>]) -> Outcome {
    let now = Instant::now();
    let mut session = server(
        &[StreamName::Caches, StreamName::Typing],
        split_config(),
        now,
    );
    let id = session.accept(now);
    let mut outcome = Outcome {
        events: Vec::new(),
        sent: Vec::new(),
        state: None,
        buffered: 0,
    };
    while let Some(bytes) = session.poll_transmit(id) {
        outcome.sent.extend_from_slice(&bytes);
    }
    for chunk in chunks {
        session.handle_input(id, chunk, now);
        while let Some(bytes) = session.poll_transmit(id) {
            outcome.sent.extend_from_slice(&bytes);
        }
        while let Some(event) = session.poll_event() {
            outcome.events.push(format!("{event:?}"));
        }
    }
    outcome.state = session.client_state(id);
    outcome
}

/// `SERVER` first, then anything.
fn greeted(data: Vec<u8>) -> Vec<u8> {
    let mut bytes = format!("SERVER {SERVER_NAME}\n").into_bytes();
    bytes.extend(data);
    bytes
}

proptest! {
    #[test]
    fn client_split_anywhere_gives_the_same_outcome(
        data in stream_of(server_line(), 40).prop_map(greeted),
        cuts in prop::collection::vec(any::<usize>(), 0..30),
    ) {
        let whole = run_client(std::slice::from_ref(&data));
        run_client(&chunks(&data, &cuts)).check_against(&whole)?;
        let bytewise: Vec<Vec<u8>> = data.iter().map(|b| vec![*b]).collect();
        run_client(&bytewise).check_against(&whole)?;
    }

    #[test]
    fn server_split_anywhere_gives_the_same_outcome(
        data in stream_of(client_line(), 40),
        cuts in prop::collection::vec(any::<usize>(), 0..30),
    ) {
        let whole = run_server(std::slice::from_ref(&data));
        run_server(&chunks(&data, &cuts)).check_against(&whole)?;
        let bytewise: Vec<Vec<u8>> = data.iter().map(|b| vec![*b]).collect();
        run_server(&bytewise).check_against(&whole)?;
    }
}

/// Checks the bytes a connection sent after its fatal error: one `ERROR`
/// line at most.
fn check_after_fatal(after: &[u8]) -> Result<(), TestCaseError> {
    if after.is_empty() {
        return Ok(());
    }
    prop_assert!(
        after.starts_with(b"ERROR "),
        "{:?}",
        String::from_utf8_lossy(after)
    );
    prop_assert_eq!(after.iter().filter(|b| **b == b'\n').count(), 1);
    prop_assert_eq!(after.last(), Some(&b'\n'));
    Ok(())
}

#[derive(Clone, Debug)]
enum ClientOp {
    Input(Vec<u8>),
    Garbage(Vec<u8>),
    Advance(u32),
    Timeout,
    Send(u8),
    Drain(u8),
    Connect,
    Disconnect,
    AnswerCatchUps { fail: bool },
}

fn client_op() -> impl Strategy<Value = ClientOp> {
    prop_oneof![
        6 => stream_of(server_line(), 8).prop_map(ClientOp::Input),
        1 => prop::collection::vec(any::<u8>(), 0..300).prop_map(ClientOp::Garbage),
        3 => (0u32..30_000).prop_map(ClientOp::Advance),
        3 => Just(ClientOp::Timeout),
        3 => any::<u8>().prop_map(ClientOp::Send),
        4 => any::<u8>().prop_map(ClientOp::Drain),
        1 => Just(ClientOp::Connect),
        1 => Just(ClientOp::Disconnect),
        2 => any::<bool>().prop_map(|fail| ClientOp::AnswerCatchUps { fail }),
    ]
}

struct ClientRun {
    session: TcpClientSession,
    now: Instant,
    after_fatal: Vec<u8>,
    catch_ups: Vec<synapse_replication::positions::CatchUpRequest>,
}

impl ClientRun {
    fn drain_events(&mut self) {
        while let Some(event) = self.session.poll_event() {
            if let TcpClientEvent::Follower(FollowerEvent::CatchUp(request)) = event {
                self.catch_ups.push(request);
            }
        }
    }

    fn check(&self) -> Result<(), TestCaseError> {
        if let Some(deadline) = self.session.poll_timeout() {
            prop_assert!(deadline >= self.now, "deadline in the past");
        }
        prop_assert!(self.session.buffered_input() <= 200);
        check_after_fatal(&self.after_fatal)
    }

    fn apply(&mut self, op: ClientOp) -> Result<(), TestCaseError> {
        match op {
            ClientOp::Input(bytes) | ClientOp::Garbage(bytes) => {
                // Greet once per connection, so that most input gets through.
                let data = if self.session.state().is_some() && !self.session.is_ready() {
                    greeted(bytes)
                } else {
                    bytes
                };
                self.session.handle_input(&data, self.now);
            }
            ClientOp::Advance(ms) => {
                self.now += Duration::from_millis(u64::from(ms));
                self.session.handle_timeout(self.now);
            }
            ClientOp::Timeout => {
                if let Some(deadline) = self.session.poll_timeout() {
                    self.now = deadline;
                    self.session.handle_timeout(deadline);
                    if let Some(next) = self.session.poll_timeout() {
                        prop_assert!(next > deadline, "the deadline did not move forward");
                    }
                }
            }
            ClientOp::Send(n) => {
                let command = match n % 4 {
                    0 => Command::FederationAck(FederationAck {
                        instance: InstanceName::from("worker1"),
                        token: Token(i64::from(n)),
                    }),
                    1 => Command::RemoteServerUp("x.org".into()),
                    2 => Command::Ping("x".repeat(usize::from(n)).into()),
                    _ => Command::Replicate,
                };
                let _ = self.session.send(command);
            }
            ClientOp::Drain(n) => {
                let closing = self.session.state() != Some(ConnectionState::Open);
                for _ in 0..=n % 8 {
                    let Some(bytes) = self.session.poll_transmit() else {
                        break;
                    };
                    if closing {
                        self.after_fatal.extend_from_slice(&bytes);
                    }
                }
            }
            ClientOp::Connect => {
                check_after_fatal(&self.after_fatal)?;
                self.after_fatal.clear();
                self.session.connect(self.now);
            }
            ClientOp::Disconnect => {
                check_after_fatal(&self.after_fatal)?;
                self.after_fatal.clear();
                self.session.disconnected();
            }
            ClientOp::AnswerCatchUps { fail } => {
                for request in std::mem::take(&mut self.catch_ups) {
                    if fail {
                        let _ = self.session.catch_up_failed(request.id);
                    } else {
                        let page = CatchUpPage {
                            updates: vec![(request.to, row(request.to.0))],
                            upto: request.to,
                            limited: false,
                        };
                        let _ = self.session.handle_catch_up(request.id, page);
                    }
                }
            }
        }
        self.drain_events();
        self.check()
    }
}

#[derive(Clone, Debug)]
enum ServerOp {
    Accept,
    Disconnect(u8),
    Input(u8, Vec<u8>),
    Advance(u32),
    Timeout,
    Write(u8),
    Send(u8),
    Close(u8),
    Drain(u8, u8),
}

fn server_op() -> impl Strategy<Value = ServerOp> {
    prop_oneof![
        2 => Just(ServerOp::Accept),
        1 => any::<u8>().prop_map(ServerOp::Disconnect),
        6 => (any::<u8>(), stream_of(client_line(), 8)).prop_map(|(c, b)| ServerOp::Input(c, b)),
        3 => (0u32..30_000).prop_map(ServerOp::Advance),
        3 => Just(ServerOp::Timeout),
        3 => any::<u8>().prop_map(ServerOp::Write),
        1 => any::<u8>().prop_map(ServerOp::Send),
        1 => any::<u8>().prop_map(ServerOp::Close),
        4 => (any::<u8>(), any::<u8>()).prop_map(|(c, n)| ServerOp::Drain(c, n)),
    ]
}

struct ServerRun {
    session: TcpServerSession,
    now: Instant,
    ids: Vec<TcpClientId>,
    after_fatal: std::collections::HashMap<TcpClientId, Vec<u8>>,
    token: i64,
}

impl ServerRun {
    fn pick(&self, n: u8) -> Option<TcpClientId> {
        (!self.ids.is_empty()).then(|| self.ids[usize::from(n) % self.ids.len()])
    }

    fn check(&self) -> Result<(), TestCaseError> {
        if let Some(deadline) = self.session.poll_timeout() {
            prop_assert!(deadline >= self.now, "deadline in the past");
        }
        for after in self.after_fatal.values() {
            check_after_fatal(after)?;
        }
        Ok(())
    }

    fn apply(&mut self, op: ServerOp) -> Result<(), TestCaseError> {
        match op {
            ServerOp::Accept => self.ids.push(self.session.accept(self.now)),
            ServerOp::Disconnect(n) => {
                if let Some(id) = self.pick(n) {
                    self.session.disconnected(id);
                    self.ids.retain(|i| *i != id);
                    if let Some(after) = self.after_fatal.remove(&id) {
                        check_after_fatal(&after)?;
                    }
                }
            }
            ServerOp::Input(n, bytes) => {
                if let Some(id) = self.pick(n) {
                    self.session.handle_input(id, &bytes, self.now);
                }
            }
            ServerOp::Advance(ms) => {
                self.now += Duration::from_millis(u64::from(ms));
                self.session.handle_timeout(self.now);
            }
            ServerOp::Timeout => {
                if let Some(deadline) = self.session.poll_timeout() {
                    self.now = deadline;
                    self.session.handle_timeout(deadline);
                    if let Some(next) = self.session.poll_timeout() {
                        prop_assert!(next > deadline, "the deadline did not move forward");
                    }
                }
            }
            ServerOp::Write(n) => {
                let rows: Vec<_> = (0..n % 4)
                    .map(|i| (Token(self.token + 1 + i64::from(i / 2)), row(i64::from(n))))
                    .collect();
                self.token += 2;
                self.session
                    .write(&StreamName::Caches, Token(self.token), rows)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            ServerOp::Send(n) => {
                let command = match n % 3 {
                    0 => Command::RemoteServerUp("x.org".into()),
                    1 => Command::Replicate,
                    _ => Command::Ping("p".into()),
                };
                match self.pick(n) {
                    Some(id) if n % 2 == 0 => {
                        let _ = self.session.send_to(id, command);
                    }
                    _ => {
                        let _ = self.session.send(command);
                    }
                }
            }
            ServerOp::Close(n) => {
                if let Some(id) = self.pick(n) {
                    self.session.close(id, "bye");
                }
            }
            ServerOp::Drain(c, n) => {
                if let Some(id) = self.pick(c) {
                    let closing = self.session.client_state(id) != Some(ConnectionState::Open);
                    for _ in 0..=n % 8 {
                        let Some(bytes) = self.session.poll_transmit(id) else {
                            break;
                        };
                        if closing {
                            self.after_fatal
                                .entry(id)
                                .or_default()
                                .extend_from_slice(&bytes);
                        }
                    }
                }
            }
        }
        while self.session.poll_event().is_some() {}
        self.check()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn client_schedules_keep_the_invariants(ops in prop::collection::vec(client_op(), 1..60)) {
        let now = Instant::now();
        let mut run = ClientRun {
            session: client(SERVER_NAME, config()),
            now,
            after_fatal: Vec::new(),
            catch_ups: Vec::new(),
        };
        run.session.connect(now);
        for op in ops {
            run.apply(op)?;
        }
    }

    #[test]
    fn server_schedules_keep_the_invariants(ops in prop::collection::vec(server_op(), 1..60)) {
        let now = Instant::now();
        let mut run = ServerRun {
            session: server(&[StreamName::Caches, StreamName::Typing], config(), now),
            now,
            ids: Vec::new(),
            after_fatal: Default::default(),
            token: 0,
        };
        for op in ops {
            run.apply(op)?;
        }
    }
}
