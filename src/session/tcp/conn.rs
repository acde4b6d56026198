//! One direct TCP connection: its lines in, its queue out, its timers.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant, SystemTime};

use bytes::{BufMut, Bytes, BytesMut};

use crate::wire::Command;

use super::super::SendError;
use super::super::lines::Lines;
use super::{ConnectionState, TcpSessionConfig};

/// Maps the session's `Instant`s to wall-clock milliseconds for `PING`.
#[derive(Clone, Copy, Debug)]
pub(super) struct PingClock {
    pub(super) at: Instant,
    unix: Duration,
}

impl PingClock {
    pub(super) fn line(&self, now: Instant) -> Bytes {
        let ms = (self.unix + now.saturating_duration_since(self.at)).as_millis();
        let mut line = BytesMut::with_capacity(24);
        line.put_slice(b"PING ");
        line.put_slice(ms.to_string().as_bytes());
        line.put_u8(b'\n');
        line.freeze()
    }
}

pub(super) fn clock_at(clock: &mut Option<PingClock>, now: Instant) -> PingClock {
    *clock.get_or_insert(PingClock {
        at: now,
        unix: Duration::ZERO,
    })
}

pub(super) fn wall_clock(now: Instant, wall: SystemTime) -> PingClock {
    PingClock {
        at: now,
        unix: wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    }
}

/// Encodes a command as one line with its `\n`, within the length limit.
pub(super) fn encode_line(command: &Command, max: usize) -> Result<Bytes, SendError> {
    let mut line = BytesMut::new();
    command.encode(&mut line)?;
    if line.len() > max {
        return Err(SendError::LineTooLong {
            len: line.len(),
            max,
        });
    }
    line.put_u8(b'\n');
    Ok(line.freeze())
}

/// An `ERROR` line, whatever the message.
fn error_line(message: &str) -> Bytes {
    let mut line = BytesMut::with_capacity(message.len() + 7);
    line.put_slice(b"ERROR ");
    line.put_slice(message.replace(['\n', '\r'], " ").as_bytes());
    line.put_u8(b'\n');
    line.freeze()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    Open,
    /// `abort_at` is `None` for a close timeout beyond the clock's range:
    /// the last bytes are given as long as they take.
    Closing {
        abort_at: Option<Instant>,
    },
    Aborted,
}

/// The outcome of queueing a line.
pub(super) enum Queued {
    Ok,
    /// The queue went over a limit: the connection must fail.
    Overflow {
        commands: usize,
        bytes: usize,
    },
    /// The connection is not open: nothing was queued.
    NotOpen,
}

/// What a timer asks for.
pub(super) enum Due {
    Nothing,
    Ping,
    Silent(Duration),
}

/// One connection's line buffer, output queue and timers: what both roles
/// share. Its [`Debug`] output shows the sizes of its buffers, never their
/// lines (a `USER_IP` line carries an access token).
pub(super) struct Conn {
    pub(super) lines: Lines,
    pub(super) out: VecDeque<Bytes>,
    out_bytes: usize,
    pub(super) last_sent: Instant,
    pub(super) last_received: Instant,
    pub(super) state: State,
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn")
            .field("lines", &self.lines)
            .field("queued_lines", &self.out.len())
            .field("queued_bytes", &self.out_bytes)
            .field("last_sent", &self.last_sent)
            .field("last_received", &self.last_received)
            .field("state", &self.state)
            .finish()
    }
}

impl Conn {
    pub(super) fn new(config: &TcpSessionConfig, now: Instant) -> Conn {
        Conn {
            lines: Lines::new(config.max_line_len),
            out: VecDeque::new(),
            out_bytes: 0,
            last_sent: now,
            last_received: now,
            state: State::Open,
        }
    }

    pub(super) fn is_open(&self) -> bool {
        self.state == State::Open
    }

    pub(super) fn public_state(&self) -> ConnectionState {
        match self.state {
            State::Open => ConnectionState::Open,
            State::Closing { .. } => ConnectionState::Closing,
            State::Aborted => ConnectionState::Aborted,
        }
    }

    pub(super) fn queue(&mut self, line: Bytes, config: &TcpSessionConfig, now: Instant) -> Queued {
        if !self.is_open() {
            return Queued::NotOpen;
        }
        self.out_bytes += line.len();
        self.out.push_back(line);
        self.last_sent = now;
        if self.out.len() > config.max_queued_commands || self.out_bytes > config.max_queued_bytes {
            return Queued::Overflow {
                commands: self.out.len(),
                bytes: self.out_bytes,
            };
        }
        Queued::Ok
    }

    /// Fatal: drop what is queued and input still buffered, queue the
    /// `ERROR` line alone.
    pub(super) fn fail(&mut self, message: &str, config: &TcpSessionConfig, now: Instant) {
        if !self.is_open() {
            return;
        }
        self.lines.clear();
        self.out.clear();
        let line = error_line(message);
        self.out_bytes = line.len();
        self.out.push_back(line);
        self.last_sent = now;
        let close = config.close_timeout.max(TcpSessionConfig::MIN_TIMER);
        let abort_at = now.checked_add(close);
        self.state = State::Closing { abort_at };
    }

    pub(super) fn deadline(&self, config: &TcpSessionConfig) -> Option<Instant> {
        match self.state {
            State::Open => {
                let ping = self.last_sent.checked_add(config.effective_ping_interval());
                let silence = self.last_received.checked_add(config.ping_timeout);
                match (ping, silence) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
            State::Closing { abort_at } => abort_at,
            State::Aborted => None,
        }
    }

    /// Advances the timers to `now`; the caller sends the `PING` or fails.
    pub(super) fn on_timeout(&mut self, config: &TcpSessionConfig, now: Instant) -> Due {
        match self.state {
            State::Open => {
                let silent = now.saturating_duration_since(self.last_received);
                if silent >= config.ping_timeout {
                    return Due::Silent(silent);
                }
                if now.saturating_duration_since(self.last_sent) >= config.effective_ping_interval()
                {
                    return Due::Ping;
                }
                Due::Nothing
            }
            State::Closing { abort_at } => {
                if abort_at.is_some_and(|abort_at| now >= abort_at) {
                    self.state = State::Aborted;
                    self.out.clear();
                    self.out_bytes = 0;
                }
                Due::Nothing
            }
            State::Aborted => Due::Nothing,
        }
    }

    pub(super) fn poll_transmit(&mut self, max: usize) -> Option<Bytes> {
        if self.state == State::Aborted {
            return None;
        }
        let first = self.out.pop_front()?;
        self.out_bytes -= first.len();
        let Some(next) = self.out.front() else {
            return Some(first);
        };
        if first.len() + next.len() > max {
            return Some(first);
        }
        let mut chunk = BytesMut::with_capacity(max.min(first.len() + self.out_bytes));
        chunk.put_slice(&first);
        while let Some(next) = self.out.front() {
            if chunk.len() + next.len() > max {
                break;
            }
            chunk.put_slice(next);
            self.out_bytes -= next.len();
            self.out.pop_front();
        }
        Some(chunk.freeze())
    }
}
