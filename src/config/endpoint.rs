//! [`Endpoint`]: where a server listens, whatever it speaks.

use std::fmt;
use std::path::PathBuf;

/// Where a server listens: a TCP address or a Unix socket. Redis, its
/// sentinels and the HTTP replication listeners of `instance_map` are all
/// reached at one (the dialer in `transport` opens it, with TLS if
/// configured).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Endpoint {
    /// A TCP address.
    Tcp {
        /// A name to resolve, or an IP literal (IPv6 without brackets).
        host: String,
        /// The port.
        port: u16,
    },
    /// A Unix domain socket (Redis' `unixsocket`, an `instance_map`
    /// entry's `path`).
    Unix(PathBuf),
}

impl Endpoint {
    /// `host:port`, with brackets around an IPv6 host, as
    /// `Runtime::connect` takes it.
    pub(crate) fn tcp_address(host: &str, port: u16) -> String {
        if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    }
}

impl fmt::Display for Endpoint {
    /// `host:port` (`[::1]:6379` for IPv6), or `unix:/path`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp { host, port } => f.write_str(&Endpoint::tcp_address(host, *port)),
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}
