//! Which nodes a sentinel may name as the master.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::error::{ConfigError, snippet};

/// The addresses a sentinel may name as the master: a node outside is
/// refused (the session's `SentinelError::NotAllowed`) and never
/// connected to, so the data nodes' password never reaches it.
///
/// A sentinel is trusted to say *which* node is the master, not to send
/// the client anywhere it likes: whoever answers as a sentinel (a
/// compromised sentinel, or anyone on the path to one reached without
/// TLS) could otherwise name a host of their own, collect the password
/// and feed rows. The `ROLE` check does not stop that, since such a host
/// answers `master`; and a Redis with `requirepass` refuses `ROLE` before
/// `AUTH`, so the password must be sent to learn the role.
///
/// # The default: private addresses only
///
/// [`AllowedMasters::default`] is [`AllowedMasters::private_networks`]:
/// IP literals in the loopback, private (RFC 1918), shared (RFC 6598),
/// link-local and unique-local (`fc00::/7`) ranges. Host names and public
/// addresses are refused. So by default a sentinel can send the password
/// to any node of the private network, but not out of it, and (with TLS)
/// not to a host holding a public certificate for a name of its own
/// (public CAs do not certify private addresses). Neither the sentinels'
/// own addresses nor the service name say anything about where the master
/// may be, so they are not used to widen or narrow this.
///
/// Name the master's hosts or networks to bound it further (or to allow
/// the host names sentinels give with `announce-hostnames yes`):
///
/// ```
/// use synapse_replication::config::AllowedMasters;
///
/// let allowed = AllowedMasters::parse(["10.1.2.0/24", "redis-0.internal", "*.redis.svc"])?;
/// assert!(allowed.allows("10.1.2.7"));
/// assert!(allowed.allows("REDIS-0.internal"));
/// assert!(allowed.allows("node-1.redis.svc"));
/// assert!(!allowed.allows("10.1.3.7"));
/// assert!(!allowed.allows("127.0.0.1"));
/// assert!(!allowed.allows("redis.svc.evil.example"));
/// assert!(AllowedMasters::default().allows("192.168.0.5"));
/// assert!(!AllowedMasters::default().allows("203.0.113.9"));
/// assert!(!AllowedMasters::default().allows("redis.internal"));
/// # Ok::<(), synapse_replication::config::ConfigError>(())
/// ```
///
/// An allowed host name is resolved as usual: DNS is trusted for it.
#[derive(Clone, PartialEq, Eq)]
pub struct AllowedMasters {
    rules: Vec<Rule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    /// Any node at all.
    Any,
    /// An IP network (an address is a network of its full length).
    Network(IpAddr, u8),
    /// A host name, lowercase, without a trailing dot.
    Host(String),
    /// Names ending in `.suffix` (from `*.suffix`), lowercase.
    Suffix(String),
}

/// The ranges of [`AllowedMasters::private_networks`].
const PRIVATE: [(IpAddr, u8); 9] = [
    (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8),
    (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0)), 8),
    (IpAddr::V4(Ipv4Addr::new(172, 16, 0, 0)), 12),
    (IpAddr::V4(Ipv4Addr::new(192, 168, 0, 0)), 16),
    (IpAddr::V4(Ipv4Addr::new(100, 64, 0, 0)), 10),
    (IpAddr::V4(Ipv4Addr::new(169, 254, 0, 0)), 16),
    (IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
    (IpAddr::V6(Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0)), 7),
    (IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)), 10),
];

impl Default for AllowedMasters {
    /// [`AllowedMasters::private_networks`].
    fn default() -> AllowedMasters {
        AllowedMasters::private_networks()
    }
}

impl fmt::Debug for AllowedMasters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AllowedMasters({self})")
    }
}

impl fmt::Display for AllowedMasters {
    /// The entries, as [`AllowedMasters::parse`] reads them, comma
    /// separated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == AllowedMasters::private_networks() {
            return f.write_str("private");
        }
        for (index, rule) in self.rules.iter().enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            match rule {
                Rule::Any => f.write_str("*")?,
                Rule::Network(ip, bits) if *bits == max_bits(ip) => write!(f, "{ip}")?,
                Rule::Network(ip, bits) => write!(f, "{ip}/{bits}")?,
                Rule::Host(host) => f.write_str(host)?,
                Rule::Suffix(suffix) => write!(f, "*.{suffix}")?,
            }
        }
        if self.rules.is_empty() {
            f.write_str("none")?;
        }
        Ok(())
    }
}

fn max_bits(ip: &IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// `ip` with its last `max - bits` bits cleared.
fn mask(ip: IpAddr, bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let keep = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & keep))
        }
        IpAddr::V6(v6) => {
            let keep = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & keep))
        }
    }
}

/// A host name: dot-separated labels of letters, digits, `-` and `_`.
fn host_name(text: &str) -> Option<String> {
    let name = text.strip_suffix('.').unwrap_or(text).to_ascii_lowercase();
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    valid.then_some(name)
}

impl AllowedMasters {
    /// Only IP literals in private, loopback, shared, link-local and
    /// unique-local ranges (the default; see the type's docs).
    pub fn private_networks() -> AllowedMasters {
        AllowedMasters {
            rules: PRIVATE
                .iter()
                .map(|(ip, bits)| Rule::Network(*ip, *bits))
                .collect(),
        }
    }

    /// Any node a sentinel names: the sentinels are trusted entirely
    /// (with TLS to the master, pin its name or CA then:
    /// [`TlsConfig`](super::TlsConfig)).
    pub fn any() -> AllowedMasters {
        AllowedMasters {
            rules: vec![Rule::Any],
        }
    }

    /// The nodes these entries allow, each one of: an IP address
    /// (`10.0.0.7`, `fd00::7`), a network (`10.0.0.0/8`, `fd00::/8`), a
    /// host name (`redis.internal`, matched without regard to case), all
    /// names under a domain (`*.redis.svc`: `a.redis.svc`, not
    /// `redis.svc`), `private` ([`AllowedMasters::private_networks`]) or
    /// `*` ([`AllowedMasters::any`]). Surrounding whitespace is ignored;
    /// empty entries are skipped. No entries at all allow nothing. An
    /// entry that is none of these is a
    /// [`ConfigError::InvalidAllowedMaster`].
    pub fn parse<I, S>(entries: I) -> Result<AllowedMasters, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut rules = Vec::new();
        for entry in entries {
            let entry = entry.as_ref().trim();
            if entry.is_empty() {
                continue;
            }
            let bad = || ConfigError::InvalidAllowedMaster {
                key: None,
                entry: snippet(entry),
            };
            if entry == "*" {
                rules.push(Rule::Any);
            } else if entry.eq_ignore_ascii_case("private") {
                rules.extend(AllowedMasters::private_networks().rules);
            } else if let Some(suffix) = entry.strip_prefix("*.") {
                rules.push(Rule::Suffix(host_name(suffix).ok_or_else(bad)?));
            } else if let Some((ip, bits)) = entry.split_once('/') {
                let ip: IpAddr = ip.trim_matches(['[', ']']).parse().map_err(|_| bad())?;
                let bits: u8 = bits.parse().map_err(|_| bad())?;
                if bits > max_bits(&ip) {
                    return Err(bad());
                }
                rules.push(Rule::Network(mask(ip, bits), bits));
            } else if let Ok(ip) = entry.trim_matches(['[', ']']).parse::<IpAddr>() {
                rules.push(Rule::Network(ip, max_bits(&ip)));
            } else {
                rules.push(Rule::Host(host_name(entry).ok_or_else(bad)?));
            }
        }
        Ok(AllowedMasters { rules })
    }

    /// Whether a sentinel may name `host` (an IP literal, IPv6 without
    /// brackets, or a host name).
    /// IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`) are matched as the
    /// IPv4 address they carry.
    pub fn allows(&self, host: &str) -> bool {
        let ip = host.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
        let name = if ip.is_none() { host_name(host) } else { None };
        self.rules.iter().any(|rule| match (rule, ip, &name) {
            (Rule::Any, ..) => true,
            (Rule::Network(net, bits), Some(ip), _) => {
                net.is_ipv4() == ip.is_ipv4() && mask(ip, *bits) == *net
            }
            (Rule::Host(allowed), _, Some(name)) => allowed == name,
            (Rule::Suffix(suffix), _, Some(name)) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            _ => false,
        })
    }
}

/// An allow-list from a URL or Synapse's section: at least one entry
/// (none at all would refuse every master, surely not what was meant).
pub(super) fn parse_allowed_masters<I, S>(entries: I) -> Result<AllowedMasters, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let entries: Vec<S> = entries.into_iter().collect();
    if entries.iter().all(|entry| entry.as_ref().trim().is_empty()) {
        return Err(ConfigError::InvalidAllowedMaster {
            key: None,
            entry: String::new(),
        });
    }
    AllowedMasters::parse(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_allows_private_addresses_only() {
        let default = AllowedMasters::default();
        for host in [
            "127.0.0.1",
            "10.2.3.4",
            "172.31.255.1",
            "192.168.1.1",
            "100.64.0.1",
            "169.254.1.1",
            "::1",
            "fd12::1",
            "fe80::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(default.allows(host), "{host}");
        }
        for host in [
            "8.8.8.8",
            "172.32.0.1",
            "192.169.0.1",
            "2001:db8::1",
            "::",
            "::ffff:8.8.8.8",
            "localhost",
            "redis.internal",
            "",
        ] {
            assert!(!default.allows(host), "{host}");
        }
        assert_eq!(default.to_string(), "private");
        assert_eq!(AllowedMasters::parse(["private"]).expect("parses"), default);
    }

    #[test]
    fn entries() {
        let allowed = AllowedMasters::parse([
            " 10.0.0.0/8 ",
            "203.0.113.7",
            "[2001:db8::]/32",
            "Redis.Internal.",
            "*.svc.local",
            "",
        ])
        .expect("parses");
        assert!(allowed.allows("10.9.9.9"));
        assert!(allowed.allows("203.0.113.7"));
        assert!(!allowed.allows("203.0.113.8"));
        assert!(allowed.allows("2001:db8:1::1"));
        assert!(allowed.allows("redis.internal"));
        assert!(allowed.allows("redis.internal."));
        assert!(allowed.allows("a.b.svc.local"));
        assert!(!allowed.allows("svc.local"));
        assert!(!allowed.allows("evilsvc.local"));
        assert!(!allowed.allows("127.0.0.1"));
        assert_eq!(
            allowed.to_string(),
            "10.0.0.0/8,203.0.113.7,2001:db8::/32,redis.internal,*.svc.local"
        );
        // A network given with host bits set is the network.
        assert!(
            AllowedMasters::parse(["192.168.1.77/24"])
                .expect("parses")
                .allows("192.168.1.1")
        );
        assert!(
            AllowedMasters::parse(["*"])
                .expect("any")
                .allows("a.example")
        );
        let none = AllowedMasters::parse(Vec::<String>::new()).expect("empty");
        assert!(!none.allows("10.0.0.1"));
        assert_eq!(none.to_string(), "none");
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/x",
            "a b",
            "*.",
            "a..b",
            "x/8",
        ] {
            let error = AllowedMasters::parse([bad]).expect_err(bad);
            assert!(
                error.to_string().contains("invalid allowed master"),
                "{error}"
            );
        }
    }
}
