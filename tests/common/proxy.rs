//! A TCP proxy of the test's own between clients and a server, that can
//! cut the network both ways while every socket stays open: what a
//! partition looks like to a client (unlike a closed socket, or a server
//! stopped by SIGSTOP, whose kernel still acknowledges every byte).
//!
//! While [`Proxy::partition`] holds, nothing crosses in either direction:
//! bytes already read are held, and the rest wait in the kernel's buffers,
//! where TCP would keep them while it retransmits. Connections made
//! meanwhile are accepted (the listener is local) and get no further.
//! [`Proxy::heal`] lets everything held through, in order, as TCP delivers
//! it once the network is back; a connection its client gave up meanwhile
//! is then closed towards the server too. Plain threads, no runtime.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// How often an idle thread looks again at the proxy's state.
const TICK: Duration = Duration::from_millis(20);

#[derive(Default)]
struct Shared {
    partitioned: Mutex<bool>,
    changed: Condvar,
    stop: AtomicBool,
    accepted: AtomicUsize,
}

impl Shared {
    /// Waits while the network is cut; false once the proxy stops.
    fn wait_healed(&self) -> bool {
        let mut partitioned = self
            .partitioned
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while *partitioned && !self.stop.load(Ordering::Relaxed) {
            partitioned = self
                .changed
                .wait_timeout(partitioned, TICK)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        !self.stop.load(Ordering::Relaxed)
    }
}

/// A proxy on a free loopback port, forwarding to `127.0.0.1:upstream`.
/// Stops (and closes every connection) when dropped.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts forwarding to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a proxy port");
        let port = listener.local_addr().expect("the proxy's address").port();
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let shared = Arc::new(Shared::default());
        let acceptor = {
            let shared = shared.clone();
            thread::spawn(move || accept(listener, upstream, shared))
        };
        Proxy {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Cuts the network both ways; sockets stay open.
    pub fn partition(&self) {
        self.set(true);
    }

    /// Lets everything through again, what was held first.
    pub fn heal(&self) {
        self.set(false);
    }

    fn set(&self, partitioned: bool) {
        *self
            .shared
            .partitioned
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = partitioned;
        self.shared.changed.notify_all();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.changed.notify_all();
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// Accepts until the proxy stops; each connection's two pipes run on
/// their own threads, which end once they see the stop (each then shuts
/// both its sockets, which ends a write the other one is blocked in).
fn accept(listener: TcpListener, upstream: u16, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::Relaxed) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(error) if error.kind() == ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(error) => panic!("proxy accept: {error}"),
        };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        let Ok(server) = TcpStream::connect((Ipv4Addr::LOCALHOST, upstream)) else {
            // Nothing listens upstream: the client sees its socket closed.
            continue;
        };
        let _ = client.set_nonblocking(false);
        for (from, to) in [(&client, &server), (&server, &client)] {
            let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                continue;
            };
            let shared = shared.clone();
            thread::spawn(move || pipe(from, to, &shared));
        }
    }
}

/// Forwards `from` to `to` while the network is up; holds what it read
/// while it is cut. An end or error on `from` closes `to` for writing (the
/// other direction then sees its end); an error on `to` closes both.
fn pipe(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let _ = from.set_read_timeout(Some(TICK));
    let mut buffer = vec![0; 64 << 10];
    loop {
        if !shared.wait_healed() {
            break;
        }
        let n = match from.read(&mut buffer) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => n,
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                continue;
            }
            Err(_) => {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
        };
        // Cut while reading: held until the network is back.
        if !shared.wait_healed() {
            break;
        }
        if to.write_all(&buffer[..n]).is_err() {
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
    }
    // The proxy stops: every connection is closed.
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
