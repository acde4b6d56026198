//! SIGTERM as a future, with nothing but the C library every Unix
//! program links anyway (the crate takes no dependency for one signal).
//!
//! The handler only stores a flag (all a signal handler may safely do);
//! [`received`] looks at it every 50 ms. A second SIGTERM while stopping
//! changes nothing: stopping is bounded in time anyway.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static TERMINATE: AtomicBool = AtomicBool::new(false);

const SIGTERM: i32 = 15;

unsafe extern "C" {
    // `sighandler_t signal(int, sighandler_t)`: on glibc and musl the
    // handler stays installed and interrupted calls restart (BSD
    // semantics), which is what a flag needs.
    fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
}

extern "C" fn on_sigterm(_: i32) {
    TERMINATE.store(true, Ordering::SeqCst);
}

/// Installs the handler: from now on SIGTERM no longer kills the process,
/// it completes [`received`].
pub fn install() {
    // SAFETY: `on_sigterm` only stores to an atomic, which is
    // async-signal-safe; `signal` is given a valid signal number.
    unsafe {
        signal(SIGTERM, on_sigterm);
    }
}

/// Completes once SIGTERM has arrived (after [`install`]).
pub async fn received() {
    while !TERMINATE.load(Ordering::SeqCst) {
        smol::Timer::after(Duration::from_millis(50)).await;
    }
}
