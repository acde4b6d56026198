//! [`RedisEndpoint`]: where Redis listens.

use std::fmt;
use std::path::PathBuf;

/// Where Redis listens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedisEndpoint {
    /// A TCP address.
    Tcp {
        /// A name to resolve, or an IP literal (IPv6 without brackets).
        host: String,
        /// The port.
        port: u16,
    },
    /// A Unix domain socket (Redis' `unixsocket`).
    Unix(PathBuf),
}

impl RedisEndpoint {
    /// `host:port`, with brackets around an IPv6 host, as
    /// [`Runtime::connect`] takes it.
    pub(crate) fn tcp_address(host: &str, port: u16) -> String {
        if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    }
}

impl fmt::Display for RedisEndpoint {
    /// `host:port` (`[::1]:6379` for IPv6), or `unix:/path`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisEndpoint::Tcp { host, port } => {
                f.write_str(&RedisEndpoint::tcp_address(host, *port))
            }
            RedisEndpoint::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}
