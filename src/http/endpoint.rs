//! What one endpoint of Synapse's replication HTTP API declares, and the
//! path a call to it takes.

use std::fmt;

/// The path every endpoint's starts with.
pub(super) const PREFIX: &str = "/_synapse/replication/";

/// The HTTP method of an endpoint (Synapse allows these three).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// `GET`: no body; arguments in the query.
    Get,
    /// `POST`.
    Post,
    /// `PUT`.
    Put,
}

impl Method {
    /// `GET`, `POST` or `PUT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
        }
    }

    /// Whether a request's `method` is this one (`HEAD` is served as `GET`,
    /// as Synapse's HTTP layer does).
    pub fn accepts(self, method: &str) -> bool {
        method == self.as_str() || (self == Method::Get && method == "HEAD")
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One endpoint, as a subclass of Synapse's `ReplicationEndpoint`
/// (`replication/http/_base.py`) declares it: its `NAME`, `METHOD` and
/// `PATH_ARGS`, whether it caches answers per txn id (`CACHE`, the
/// default) and whether calls carry and answer stream positions
/// (`WAIT_FOR_STREAMS`, the default).
///
/// Its path is `/_synapse/replication/<NAME>/<arg>/.../<txn_id>`: one
/// segment per path argument, percent-encoded, then the txn id when it
/// caches. With no path argument and no cache it is
/// `/_synapse/replication/<NAME>/`, trailing slash included, as Synapse's
/// pattern has it.
///
/// ```
/// use synapse_replication::http::{Method, ReplicationEndpoint};
///
/// let endpoint = ReplicationEndpoint::fed_send_edu();
/// assert_eq!(endpoint.method(), Method::Post);
/// assert_eq!(
///     endpoint.path(&["m.typing"], Some("AbCdEfGhIj")),
///     "/_synapse/replication/fed_send_edu/m.typing/AbCdEfGhIj",
/// );
/// let presence = ReplicationEndpoint::presence_set_state();
/// assert_eq!(
///     presence.path(&["@alice:example.com"], None),
///     "/_synapse/replication/presence_set_state/%40alice%3Aexample.com",
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicationEndpoint {
    name: String,
    method: Method,
    path_args: Vec<String>,
    cache: bool,
    wait_for_streams: bool,
}

impl ReplicationEndpoint {
    /// The endpoint `name` (Synapse's `NAME`) taking `method` and these
    /// path arguments (`PATH_ARGS`, by name), caching answers and carrying
    /// positions, as Synapse's endpoints do unless they say otherwise.
    pub fn new(method: Method, name: &str, path_args: &[&str]) -> ReplicationEndpoint {
        ReplicationEndpoint {
            name: name.to_owned(),
            method,
            path_args: path_args.iter().map(|arg| (*arg).to_owned()).collect(),
            cache: true,
            wait_for_streams: true,
        }
    }

    /// One that keeps no answers (`CACHE = False`): its path has no txn
    /// id, and a retried call is handled again.
    #[must_use]
    pub fn without_cache(mut self) -> ReplicationEndpoint {
        self.cache = false;
        self
    }

    /// One whose calls carry no positions (`WAIT_FOR_STREAMS = False`):
    /// the callee does not wait, and answers none.
    #[must_use]
    pub fn without_waits(mut self) -> ReplicationEndpoint {
        self.wait_for_streams = false;
        self
    }

    /// `POST /_synapse/replication/fed_send_edu/<edu_type>/<txn_id>`
    /// (`ReplicationFederationSendEduRestServlet`): an EDU the process that
    /// received a federation transaction forwards to the instance that
    /// handles its type; body `{"origin", "content"}`.
    pub fn fed_send_edu() -> ReplicationEndpoint {
        ReplicationEndpoint::new(Method::Post, "fed_send_edu", &["edu_type"])
    }

    /// `POST /_synapse/replication/presence_set_state/<user_id>`
    /// (`ReplicationPresenceSetState`), on the presence writer: body
    /// `{"device_id", "state": {"presence", "status_msg"?}, "force_notify",
    /// "is_sync"}`, answered `{}` once the presence is set. It keeps no
    /// answers (`CACHE = False`): a retried call sets the state again.
    pub fn presence_set_state() -> ReplicationEndpoint {
        ReplicationEndpoint::new(Method::Post, "presence_set_state", &["user_id"]).without_cache()
    }

    /// Its `NAME`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its method.
    pub fn method(&self) -> Method {
        self.method
    }

    /// The names of its path arguments, in order.
    pub fn path_args(&self) -> impl Iterator<Item = &str> {
        self.path_args.iter().map(String::as_str)
    }

    /// Whether it keeps answers per txn id.
    pub fn caches(&self) -> bool {
        self.cache
    }

    /// Whether its calls carry positions and wait for them.
    pub fn waits_for_streams(&self) -> bool {
        self.wait_for_streams
    }

    /// The path of a call with these path arguments (percent-encoded here,
    /// as Synapse's `urllib.parse.quote(arg, safe="")` does) and, when the
    /// endpoint caches, this txn id. Extra arguments are ignored and
    /// missing ones are empty: give as many as [`path_args`](Self::path_args)
    /// names.
    pub fn path(&self, args: &[&str], txn_id: Option<&str>) -> String {
        let mut path = String::with_capacity(64);
        path.push_str(PREFIX);
        path.push_str(&self.name);
        path.push('/');
        let mut segments: Vec<&str> = (0..self.path_args.len())
            .map(|index| args.get(index).copied().unwrap_or(""))
            .collect();
        if self.cache {
            segments.push(txn_id.unwrap_or(""));
        }
        for (index, segment) in segments.iter().enumerate() {
            if index > 0 {
                path.push('/');
            }
            quote_into(&mut path, segment);
        }
        path
    }

    /// How many path segments follow the name: the arguments, and the txn
    /// id when it caches.
    pub(super) fn segments(&self) -> usize {
        self.path_args.len() + usize::from(self.cache)
    }

    pub(super) fn arg_names(&self) -> &[String] {
        &self.path_args
    }
}

/// Python's `urllib.parse.quote(text, safe="")`: every byte but ASCII
/// letters, digits and `_.-~` as `%XX`.
fn quote_into(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'-' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_as_synapse_writes_them() {
        let edu = ReplicationEndpoint::fed_send_edu();
        assert_eq!(
            edu.path(&["m.typing"], Some("abc")),
            "/_synapse/replication/fed_send_edu/m.typing/abc"
        );
        let plain = ReplicationEndpoint::new(Method::Post, "ping", &[]).without_cache();
        assert_eq!(plain.path(&[], None), "/_synapse/replication/ping/");
        let cached = ReplicationEndpoint::new(Method::Post, "ping", &[]);
        assert_eq!(cached.path(&[], Some("t")), "/_synapse/replication/ping/t");
        let spaced = ReplicationEndpoint::new(Method::Put, "x", &["a"]);
        assert_eq!(
            spaced.path(&["a b/ü~"], Some("t")),
            "/_synapse/replication/x/a%20b%2F%C3%BC~/t"
        );
    }

    #[test]
    fn head_is_served_as_get() {
        assert!(Method::Get.accepts("HEAD"));
        assert!(!Method::Post.accepts("HEAD"));
        assert!(Method::Put.accepts("PUT"));
        assert!(!Method::Put.accepts("put"));
    }
}
