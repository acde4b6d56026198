//! Commands handed to a driver from other tasks: [`CommandSender`], and
//! the bounded queue behind it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use futures::channel::mpsc;
use futures::stream::StreamExt;

use crate::wire::Command;

/// Why a [`CommandSender`] did not queue a command. Each gives the command
/// back ([`CommandSendError::into_command`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandSendError {
    /// The queue holds its capacity of commands: the client's task has not
    /// taken them yet (it is busy, or `next_event` is not being awaited).
    /// Retry later, or drop the command; counted in the client's
    /// `refused_commands`.
    #[error("command queue full ({capacity} commands): the client is not taking them")]
    Full {
        /// The command.
        command: Box<Command>,
        /// The queue's capacity.
        capacity: usize,
    },
    /// The client was closed or dropped: no command will be sent any more.
    #[error("the client is closed")]
    Closed(Box<Command>),
}

impl CommandSendError {
    /// The command that was not queued.
    pub fn into_command(self) -> Command {
        match self {
            CommandSendError::Full { command, .. } | CommandSendError::Closed(command) => *command,
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

/// Sends commands to a [`TcpClient`](super::TcpClient) or a [`RedisClient`](super::RedisClient)
/// from other tasks; they are sent during the client's next `next_event`.
///
/// The queue is bounded (the clients' `command_queue` option,
/// [`CommandSender::DEFAULT_CAPACITY`] by default): when it is full,
/// [`send`](CommandSender::send) returns [`CommandSendError::Full`] with
/// the command at once, and the client counts it (`refused_commands`).
#[derive(Clone, Debug)]
pub struct CommandSender {
    sender: mpsc::UnboundedSender<Command>,
    count: Arc<QueueCount>,
}

impl CommandSender {
    /// The default capacity of a client's command queue: 4096 commands.
    pub const DEFAULT_CAPACITY: usize = 4096;

    /// Queues `command`, or gives it back: [`CommandSendError::Full`] when
    /// the queue holds its capacity, [`CommandSendError::Closed`] once the
    /// client is closed or dropped. Never waits.
    pub fn send(&self, command: Command) -> Result<(), CommandSendError> {
        let count = &self.count;
        let mut len = count.len.load(Ordering::Acquire);
        loop {
            if len >= count.capacity {
                count.refused.fetch_add(1, Ordering::Relaxed);
                return Err(CommandSendError::Full {
                    command: Box::new(command),
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
        self.sender.unbounded_send(command).map_err(|error| {
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
pub(super) struct CommandQueue {
    receiver: mpsc::UnboundedReceiver<Command>,
    count: Arc<QueueCount>,
}

impl CommandQueue {
    /// A queue of `capacity` commands, and a sender to clone.
    pub(super) fn new(capacity: usize) -> (CommandQueue, CommandSender) {
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

    /// The next command queued, if any.
    pub(super) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Command>> {
        let next = self.receiver.poll_next_unpin(cx);
        if let Poll::Ready(Some(_)) = &next {
            self.count.len.fetch_sub(1, Ordering::AcqRel);
        }
        next
    }

    /// Refuses every command from now on ([`CommandSendError::Closed`]).
    pub(super) fn close(&mut self) {
        self.receiver.close();
    }

    /// Whether [`CommandSender::shutdown`] was called.
    pub(super) fn shutdown_requested(&self) -> bool {
        self.count.shutdown.load(Ordering::Acquire)
    }

    /// Commands refused because the queue was full.
    pub(super) fn refused(&self) -> u64 {
        self.count.refused.load(Ordering::Relaxed)
    }
}
