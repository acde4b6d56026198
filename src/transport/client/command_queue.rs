//! Commands and writes handed to a driver from other tasks:
//! [`CommandSender`], and the bounded queue behind it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use futures::channel::mpsc;
use futures::stream::StreamExt;

use crate::wire::{Command, RawRow, StreamName, Token};

/// What a [`CommandSender`] queues for its client: a command to send, or
/// rows to write.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Queued {
    /// A command ([`CommandSender::send`]).
    Command(Command),
    /// Rows of a stream this process writes ([`CommandSender::write`]).
    Write {
        /// The stream.
        stream: StreamName,
        /// Its token once they are written.
        current: Token,
        /// The rows, sorted by token.
        updates: Vec<(Token, RawRow)>,
    },
}

/// Why a [`CommandSender`] did not queue a command or a write. Each gives
/// it back ([`CommandSendError::into_queued`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandSendError {
    /// The queue holds its capacity: the client's task has not taken what
    /// it holds yet (it is busy, or `next_event` is not being awaited).
    /// Retry later, or drop it; counted in the client's
    /// `refused_commands`.
    #[error("command queue full ({capacity} commands): the client is not taking them")]
    Full {
        /// What was refused.
        refused: Box<Queued>,
        /// The queue's capacity.
        capacity: usize,
    },
    /// The client was closed or dropped: nothing will be sent any more.
    #[error("the client is closed")]
    Closed(Box<Queued>),
}

impl CommandSendError {
    /// What was not queued.
    pub fn into_queued(self) -> Queued {
        match self {
            CommandSendError::Full { refused, .. } | CommandSendError::Closed(refused) => *refused,
        }
    }
}

/// The bound of a client's command queue, and what it refused.
#[derive(Debug)]
struct QueueCount {
    capacity: usize,
    len: AtomicUsize,
    refused: AtomicU64,
    /// [`CommandSender::shutdown`] was called.
    shutdown: AtomicBool,
}

/// Sends commands to a [`TcpClient`](crate::transport::TcpClient) or a
/// [`RedisClient`](crate::transport::RedisClient) from other tasks, and writes rows
/// through a `RedisClient`; they are sent during the client's next
/// `next_event`, in the order queued.
///
/// The queue is bounded (the clients' `command_queue` option,
/// [`CommandSender::DEFAULT_CAPACITY`] by default): when it is full,
/// [`send`](CommandSender::send) and [`write`](CommandSender::write)
/// return [`CommandSendError::Full`] with what was refused at once, and
/// the client counts it (`refused_commands`).
#[derive(Clone, Debug)]
pub struct CommandSender {
    sender: mpsc::UnboundedSender<Queued>,
    count: Arc<QueueCount>,
}

impl CommandSender {
    /// The default capacity of a client's command queue: 4096 commands.
    pub const DEFAULT_CAPACITY: usize = 4096;

    /// Queues `command`, or gives it back: [`CommandSendError::Full`] when
    /// the queue holds its capacity, [`CommandSendError::Closed`] once the
    /// client is closed or dropped. Never waits.
    pub fn send(&self, command: Command) -> Result<(), CommandSendError> {
        self.queue(Queued::Command(command))
    }

    /// Queues rows of `stream` up to its `current` token, for the client to
    /// write as its own `write` does (published, and kept in the writer's
    /// history if it has one), or gives them back as
    /// [`send`](CommandSender::send) does. A write the writer refuses when
    /// the client takes it (tokens out of order, a stream this process may
    /// not write) is reported as the client's `WriteFailed` event.
    pub fn write(
        &self,
        stream: &StreamName,
        current: Token,
        updates: impl IntoIterator<Item = (Token, RawRow)>,
    ) -> Result<(), CommandSendError> {
        self.queue(Queued::Write {
            stream: stream.clone(),
            current,
            updates: updates.into_iter().collect(),
        })
    }

    fn queue(&self, queued: Queued) -> Result<(), CommandSendError> {
        let count = &self.count;
        let mut len = count.len.load(Ordering::Acquire);
        loop {
            if len >= count.capacity {
                count.refused.fetch_add(1, Ordering::Relaxed);
                return Err(CommandSendError::Full {
                    refused: Box::new(queued),
                    capacity: count.capacity,
                });
            }
            match count
                .len
                .compare_exchange_weak(len, len + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => len = now,
            }
        }
        self.sender.unbounded_send(queued).map_err(|error| {
            count.len.fetch_sub(1, Ordering::AcqRel);
            CommandSendError::Closed(Box::new(error.into_inner()))
        })
    }

    /// The most commands the queue holds.
    pub fn capacity(&self) -> usize {
        self.count.capacity
    }

    /// Stops the client from another task: its `next_event` returns `None`
    /// from its next call on (waking it if it waits), after closing its
    /// connections without waiting for what is unsent (use the client's
    /// own `close` for that). Commands sent from now on are refused
    /// ([`CommandSendError::Closed`]).
    pub fn shutdown(&self) {
        self.count.shutdown.store(true, Ordering::Release);
        self.sender.close_channel();
    }
}

/// The client's end of the command queue.
pub(crate) struct CommandQueue {
    receiver: mpsc::UnboundedReceiver<Queued>,
    count: Arc<QueueCount>,
}

impl CommandQueue {
    /// A queue of `capacity` commands, and a sender to clone.
    pub(crate) fn new(capacity: usize) -> (CommandQueue, CommandSender) {
        let (sender, receiver) = mpsc::unbounded();
        let count = Arc::new(QueueCount {
            capacity,
            len: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
        });
        let queue = CommandQueue {
            receiver,
            count: Arc::clone(&count),
        };
        (queue, CommandSender { sender, count })
    }

    /// The next command or write queued, if any.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Queued>> {
        let next = self.receiver.poll_next_unpin(cx);
        if let Poll::Ready(Some(_)) = &next {
            self.count.len.fetch_sub(1, Ordering::AcqRel);
        }
        next
    }

    /// Refuses every command from now on ([`CommandSendError::Closed`]).
    pub(crate) fn close(&mut self) {
        self.receiver.close();
    }

    /// Whether [`CommandSender::shutdown`] was called.
    pub(crate) fn shutdown_requested(&self) -> bool {
        self.count.shutdown.load(Ordering::Acquire)
    }

    /// Commands refused because the queue was full.
    pub(crate) fn refused(&self) -> u64 {
        self.count.refused.load(Ordering::Relaxed)
    }
}
