//! Drives the direct TCP sessions, both roles, with arbitrary byte chunks
//! (mostly lines, sometimes anything), sends, time steps, connections and
//! catch-up answers, under small limits, and checks after every step what
//! the sessions promise:
//!
//! - nothing panics;
//! - `poll_timeout` is never before the last `now` given, and handling a
//!   timeout at the deadline moves it strictly forward (no busy loop);
//! - no more than the line limit is buffered for an unfinished line;
//! - after a fatal error, nothing but one `ERROR` line is transmitted;
//! - every transmit is whole lines.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use synapse_replication::config::StreamWriters;
use synapse_replication::positions::{
    CatchUpPage, CatchUpRequest, Follower, FollowerEvent, Writer,
};
use synapse_replication::session::{
    ConnectionState, TcpClientEvent, TcpClientId, TcpClientSession, TcpServerSession,
    TcpSessionConfig,
};
use synapse_replication::wire::{Command, InstanceName, RawRow, StreamName, Token};

const MAX_LINE: usize = 128;

/// Lines that reach the interesting states quickly.
const LINES: [&[u8]; 16] = [
    b"SERVER example.com",
    b"PING 12",
    b"POSITION caches master 0 3",
    b"POSITION typing master 5 5",
    b"RDATA caches master batch [\"a\"]",
    b"RDATA caches master 4 [\"b\",null]",
    b"RDATA typing master 6 [\"!r\",[]]",
    b"REMOTE_SERVER_UP x.org",
    b"ERROR oops",
    b"NAME w",
    b"REPLICATE ",
    b"USER_SYNC w @a:x d start 1",
    b"FEDERATION_ACK w 3",
    b"LOCK_RELEASED [\"w\",\"l\",\"k\"]",
    b"",
    b"POSITION caches other 1 2",
];

fn config() -> TcpSessionConfig {
    let mut config = TcpSessionConfig::default();
    config.max_line_len = MAX_LINE;
    config.max_queued_commands = 12;
    config.max_queued_bytes = 1024;
    config.max_transmit_len = 100;
    config.close_timeout = Duration::from_millis(700);
    config
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*first)
    }

    fn bytes(&mut self) -> Option<&[u8]> {
        let len = usize::from(self.byte()?).min(self.0.len());
        let (taken, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(taken)
    }

    /// A chunk: mostly known lines, sometimes raw bytes.
    fn chunk(&mut self) -> Option<Vec<u8>> {
        let kind = self.byte()?;
        if kind < 64 {
            return self.bytes().map(<[u8]>::to_vec);
        }
        let mut chunk = Vec::new();
        for _ in 0..=kind % 6 {
            chunk.extend_from_slice(LINES[usize::from(self.byte()?) % LINES.len()]);
            chunk.push(b'\n');
        }
        if kind & 0x80 != 0 {
            // Split the chunk somewhere.
            let cut = usize::from(self.byte()?) % (chunk.len() + 1);
            chunk.truncate(cut);
        }
        Some(chunk)
    }
}

/// What one connection sent after its fatal error.
#[derive(Default)]
struct AfterFatal(Vec<u8>);

impl AfterFatal {
    fn check(&self) {
        if self.0.is_empty() {
            return;
        }
        assert!(
            self.0.starts_with(b"ERROR "),
            "{:?}",
            String::from_utf8_lossy(&self.0)
        );
        assert_eq!(self.0.iter().filter(|b| **b == b'\n').count(), 1);
    }
}

fn whole_lines(bytes: &[u8]) {
    assert_eq!(bytes.last(), Some(&b'\n'), "a transmit is whole lines");
}

fn registry() -> Arc<StreamWriters> {
    Arc::new(StreamWriters::default())
}

fn client(mut input: Input<'_>) {
    let mut now = Instant::now();
    let follower = Follower::new(InstanceName::from("worker1"), registry());
    let mut session = TcpClientSession::with_config("example.com", follower, config()).unwrap();
    session.connect(now);
    let mut after = AfterFatal::default();
    let mut catch_ups: Vec<CatchUpRequest> = Vec::new();
    while let Some(op) = input.byte() {
        match op % 9 {
            0 | 1 => {
                let Some(chunk) = input.chunk() else { break };
                session.handle_input(&chunk, now);
            }
            2 => {
                let Some(ms) = input.byte() else { break };
                now += Duration::from_millis(u64::from(ms) * 200);
                session.handle_timeout(now);
            }
            3 => {
                if let Some(deadline) = session.poll_timeout() {
                    now = deadline;
                    session.handle_timeout(deadline);
                    if let Some(next) = session.poll_timeout() {
                        assert!(next > deadline, "the deadline did not move forward");
                    }
                }
            }
            4 => {
                let Some(line) = input.bytes() else { break };
                if let Ok(Some(command)) = Command::decode(Bytes::copy_from_slice(line)) {
                    let _ = session.send(command);
                }
            }
            5 => {
                let closing = session.state() != Some(ConnectionState::Open);
                let Some(n) = input.byte() else { break };
                for _ in 0..n % 5 {
                    let Some(bytes) = session.poll_transmit() else {
                        break;
                    };
                    whole_lines(&bytes);
                    if closing {
                        after.0.extend_from_slice(&bytes);
                    }
                }
            }
            6 => {
                after.check();
                after = AfterFatal::default();
                session.connect(now);
            }
            7 => {
                after.check();
                after = AfterFatal::default();
                session.disconnected();
            }
            _ => {
                let Some(how) = input.byte() else { break };
                for request in std::mem::take(&mut catch_ups) {
                    if how % 3 == 0 {
                        let _ = session.catch_up_failed(request.id);
                        continue;
                    }
                    let updates = if how % 3 == 1 {
                        vec![(request.to, RawRow::new(&b"[1]"[..]).unwrap())]
                    } else {
                        // Sometimes out of range: refused whole.
                        vec![(
                            Token(request.to.0.saturating_add(1)),
                            RawRow::new(&b"[]"[..]).unwrap(),
                        )]
                    };
                    let page = CatchUpPage {
                        updates,
                        upto: request.to,
                        limited: how & 0x80 != 0,
                    };
                    let _ = session.handle_catch_up(request.id, page);
                }
            }
        }
        while let Some(event) = session.poll_event() {
            if let TcpClientEvent::Follower(FollowerEvent::CatchUp(request)) = event {
                catch_ups.push(request);
            }
        }
        if let Some(deadline) = session.poll_timeout() {
            assert!(deadline >= now, "deadline in the past");
        }
        assert!(session.buffered_input() <= MAX_LINE);
        after.check();
    }
}

fn server(mut input: Input<'_>) {
    let mut now = Instant::now();
    let mut writer = Writer::new(InstanceName::master(), registry());
    writer.advance(&StreamName::Caches, Token(0)).unwrap();
    writer.advance(&StreamName::Typing, Token(0)).unwrap();
    let mut session = TcpServerSession::with_config("example.com", writer, config(), now).unwrap();
    let mut ids: Vec<TcpClientId> = Vec::new();
    let mut after: HashMap<TcpClientId, AfterFatal> = HashMap::new();
    let mut token = 0i64;
    while let Some(op) = input.byte() {
        let pick =
            |ids: &[TcpClientId], b: u8| (!ids.is_empty()).then(|| ids[usize::from(b) % ids.len()]);
        match op % 10 {
            0 => ids.push(session.accept(now)),
            1 | 2 => {
                let Some(b) = input.byte() else { break };
                let Some(chunk) = input.chunk() else { break };
                if let Some(id) = pick(&ids, b) {
                    session.handle_input(id, &chunk, now);
                }
            }
            3 => {
                let Some(ms) = input.byte() else { break };
                now += Duration::from_millis(u64::from(ms) * 200);
                session.handle_timeout(now);
            }
            4 => {
                if let Some(deadline) = session.poll_timeout() {
                    now = deadline;
                    session.handle_timeout(deadline);
                    if let Some(next) = session.poll_timeout() {
                        assert!(next > deadline, "the deadline did not move forward");
                    }
                }
            }
            5 => {
                let Some(b) = input.byte() else { break };
                // Rows, sometimes batched, sometimes too long for a line.
                let rows: Vec<(Token, RawRow)> = (0..b % 4)
                    .map(|i| {
                        let row = if b & 0x80 != 0 && i == 1 {
                            RawRow::new(format!("[\"{}\"]", "x".repeat(MAX_LINE))).unwrap()
                        } else {
                            RawRow::new(format!("[{i}]")).unwrap()
                        };
                        (Token(token + 1 + i64::from(i / 2)), row)
                    })
                    .collect();
                token += 2;
                let stream = if b & 0x40 != 0 {
                    StreamName::Typing
                } else {
                    StreamName::Caches
                };
                let _ = session.write(&stream, Token(token), rows);
            }
            6 => {
                let Some(b) = input.byte() else { break };
                let Some(line) = input.bytes() else { break };
                if let Ok(Some(command)) = Command::decode(Bytes::copy_from_slice(line)) {
                    match pick(&ids, b) {
                        Some(id) if b & 1 == 0 => {
                            let _ = session.send_to(id, command);
                        }
                        _ => {
                            let _ = session.send(command);
                        }
                    }
                }
            }
            7 => {
                let Some(b) = input.byte() else { break };
                if let Some(id) = pick(&ids, b) {
                    session.close(id, "bye");
                }
            }
            8 => {
                let Some(b) = input.byte() else { break };
                if let Some(id) = pick(&ids, b) {
                    let closing = session.client_state(id) != Some(ConnectionState::Open);
                    for _ in 0..b % 5 {
                        let Some(bytes) = session.poll_transmit(id) else {
                            break;
                        };
                        whole_lines(&bytes);
                        if closing {
                            after.entry(id).or_default().0.extend_from_slice(&bytes);
                        }
                    }
                }
            }
            _ => {
                let Some(b) = input.byte() else { break };
                if let Some(id) = pick(&ids, b) {
                    session.disconnected(id);
                    ids.retain(|i| *i != id);
                    if let Some(after) = after.remove(&id) {
                        after.check();
                    }
                }
            }
        }
        while session.poll_event().is_some() {}
        if let Some(deadline) = session.poll_timeout() {
            assert!(deadline >= now, "deadline in the past");
        }
        for after in after.values() {
            after.check();
        }
    }
}

/// Runs one input through the checks; panics where one fails.
pub fn check(data: &[u8]) {
    let mut input = Input(data);
    match input.byte() {
        Some(role) if role & 1 == 0 => client(input),
        Some(_) => server(input),
        None => {}
    }
}
