//! The network under every driver: opening byte streams (TCP, a Unix
//! socket, TLS; `dial`), for Redis and HTTP alike, and one socket and one
//! timer as the drivers use them (`socket`).

pub(crate) mod dial;
#[cfg(feature = "tls")]
pub(crate) mod pem;
pub(crate) mod socket;
