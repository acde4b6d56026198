//! Redis URLs: `redis://`, `rediss://`, `unix://`, `redis+sentinel://`
//! and their spellings.

use super::allow::parse_allowed_masters;
use super::auth::RedisAuth;
use super::endpoint::Endpoint;
use super::error::{ConfigError, snippet};
use super::redis::RedisConfig;
use super::sentinel::{DEFAULT_SENTINEL_PORT, MAX_SENTINELS};
use super::tls::TlsConfig;

impl RedisConfig {
    /// Reads a Redis URL, in the forms redis-rs and redis-py accept:
    ///
    /// - `redis://[[username]:password@]host[:port][/database]`, TCP; the
    ///   host may be an IPv6 literal in brackets, `[::1]`; the port is
    ///   6379 unless given;
    /// - `rediss://...`, the same over TLS, verified against the system's
    ///   root certificates (use [`RedisConfig::with_tls`] for other CAs);
    /// - `unix:///path/to/redis.sock[?db=N&username=U&password=P]` (also
    ///   `unix:/path`, `redis+unix://`, and `user`, `pass` for the
    ///   parameters, as in redis-rs);
    /// - `redis+sentinel://[[username]:password@]host[:port][,host[:port]...]/service_name[/database][?sentinel_username=U&sentinel_password=P]`,
    ///   the master named `service_name` that the listed sentinels
    ///   (port 26379 unless given) monitor (see [`RedisConfig::sentinel`]);
    ///   the credentials before `@` are the data nodes', the
    ///   `sentinel_` parameters the sentinels'; `rediss+sentinel://` is
    ///   TLS to both. This is the form redis-py's Sentinel URL packages,
    ///   redis-vl and Celery's kombu use (`redis+sentinel`, like
    ///   `redis+unix`, names the transport after the `+`); redis-rs has no
    ///   Sentinel URL, and fred's `redis-sentinel://` puts the service in
    ///   a query parameter and the database in the path, which reads
    ///   less like the deployment.
    ///
    /// User names, passwords, socket paths and parameter values are
    /// percent-decoded (`%40` is `@`; `+` stays `+`). An empty password is
    /// no password.
    pub fn from_url(url: &str) -> Result<RedisConfig, ConfigError> {
        let (scheme, rest) = url.split_once(':').ok_or(ConfigError::MissingScheme)?;
        match scheme.to_ascii_lowercase().as_str() {
            "redis" => parse_tcp_url(rest, false),
            "rediss" => parse_tcp_url(rest, true),
            "unix" | "redis+unix" => parse_unix_url(rest),
            "redis+sentinel" => parse_sentinel_url(rest, false),
            "rediss+sentinel" => parse_sentinel_url(rest, true),
            _ => {
                let looks_like_scheme = !scheme.is_empty()
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
                if looks_like_scheme {
                    Err(ConfigError::UnknownScheme(snippet(scheme)))
                } else {
                    // Whatever came before the colon may be a password.
                    Err(ConfigError::MissingScheme)
                }
            }
        }
    }
}

/// `//[userinfo@]host[:port][/db]` after `redis:` or `rediss:`.
fn parse_tcp_url(rest: &str, tls: bool) -> Result<RedisConfig, ConfigError> {
    let rest = rest
        .strip_prefix("//")
        .ok_or(ConfigError::InvalidUrl("expected // after the scheme"))?;
    // The last `@` ends the credentials, so that a password may hold an
    // unescaped `@`, `/` or `?`; nothing after it is ever quoted in an
    // error together with the password.
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (rest.get(..at), rest.get(at + 1..).unwrap_or_default()),
        None => (None, rest),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (host, port) = parse_authority(authority)?;
    if tail.contains('#') {
        return Err(ConfigError::InvalidUrl("unexpected #fragment"));
    }
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    if let Some(query) = query {
        if let Some(parameter) = query.split('&').find(|parameter| !parameter.is_empty()) {
            let name = parameter.split('=').next().unwrap_or_default();
            return Err(ConfigError::UnknownParameter(snippet(name)));
        }
    }
    let database = match path.strip_prefix('/') {
        None | Some("") => None,
        Some(database) => Some(parse_database(database)?),
    };
    let auth = match userinfo {
        None => None,
        Some(userinfo) => {
            let (username, password) = match userinfo.split_once(':') {
                Some((username, password)) => (username, Some(password)),
                None => (userinfo, None),
            };
            let username = percent_decode(username, "username")?;
            let password = password
                .map(|password| percent_decode(password, "password"))
                .transpose()?;
            credentials(Some(username), password)?
        }
    };
    let mut config = RedisConfig::tcp(host, port);
    config.auth = auth;
    config.database = database;
    if tls {
        config = config.with_tls(TlsConfig::default());
    }
    Ok(config)
}

/// `host[:port]` or `[ipv6][:port]`.
fn parse_authority(authority: &str) -> Result<(String, u16), ConfigError> {
    parse_authority_port(authority, RedisConfig::DEFAULT_PORT)
}

/// One `host[:port]` of a list, `port` unless given.
pub(super) fn parse_authority_with(authority: &str, port: u16) -> Result<Endpoint, ConfigError> {
    let (host, port) = parse_authority_port(authority, port)?;
    Ok(Endpoint::Tcp { host, port })
}

fn parse_authority_port(authority: &str, default_port: u16) -> Result<(String, u16), ConfigError> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| ConfigError::InvalidHost {
                key: None,
                value: snippet(authority),
            })?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(ConfigError::InvalidHost {
                key: None,
                value: snippet(host),
            });
        }
        let port = match after {
            "" => None,
            after => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| ConfigError::InvalidHost {
                        key: None,
                        value: snippet(authority),
                    })?,
            ),
        };
        (host, port)
    } else {
        match authority.split_once(':') {
            Some((host, port)) => {
                if port.contains(':') {
                    // An IPv6 literal needs brackets.
                    return Err(ConfigError::InvalidHost {
                        key: None,
                        value: snippet(authority),
                    });
                }
                (host, Some(port))
            }
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(ConfigError::MissingHost { key: None });
    }
    if host.contains(['%', ' ', '\\']) {
        return Err(ConfigError::InvalidHost {
            key: None,
            value: snippet(host),
        });
    }
    let port = match port {
        None | Some("") => default_port,
        Some(port) => parse_port(port)?,
    };
    Ok((host.to_owned(), port))
}

fn parse_port(port: &str) -> Result<u16, ConfigError> {
    match port.parse::<u16>() {
        Ok(number) if number != 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(number),
        _ => Err(ConfigError::InvalidPort {
            key: None,
            value: snippet(port),
        }),
    }
}

fn parse_database(database: &str) -> Result<u32, ConfigError> {
    if !database.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ConfigError::InvalidDatabase(snippet(database)));
    }
    database
        .parse()
        .map_err(|_| ConfigError::InvalidDatabase(snippet(database)))
}

/// Credentials from a URL: none, a password, or a user and a password.
fn credentials(
    username: Option<String>,
    password: Option<String>,
) -> Result<Option<RedisAuth>, ConfigError> {
    let username = username.filter(|username| !username.is_empty());
    let password = password.filter(|password| !password.is_empty());
    match (username, password) {
        (username, Some(password)) => Ok(Some(RedisAuth { username, password })),
        (Some(_), None) => Err(ConfigError::UsernameWithoutPassword { key: None }),
        (None, None) => Ok(None),
    }
}

/// `///path[?query]`, `//path` or `/path` after `unix:` or `redis+unix:`.
fn parse_unix_url(rest: &str) -> Result<RedisConfig, ConfigError> {
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    if rest.contains('#') {
        return Err(ConfigError::InvalidUrl("unexpected #fragment"));
    }
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, query),
        None => (rest, ""),
    };
    if path.is_empty() {
        return Err(ConfigError::MissingPath);
    }
    if !path.starts_with('/') {
        return Err(ConfigError::InvalidUrl(
            "a unix url needs an absolute socket path, as in unix:///run/redis.sock",
        ));
    }
    let path = percent_decode(path, "socket path")?;
    let mut database = None;
    let mut username = None;
    let mut password = None;
    for parameter in query.split('&').filter(|parameter| !parameter.is_empty()) {
        let (name, value) = parameter.split_once('=').unwrap_or((parameter, ""));
        match name {
            "db" => database = Some(parse_database(value)?),
            "username" | "user" => username = Some(percent_decode(value, "username")?),
            "password" | "pass" => password = Some(percent_decode(value, "password")?),
            _ => return Err(ConfigError::UnknownParameter(snippet(name))),
        }
    }
    let mut config = RedisConfig::unix(path);
    config.auth = credentials(username, password)?;
    config.database = database;
    Ok(config)
}

/// `//[userinfo@]host[:port][,host[:port]...]/service[/db][?params]` after
/// `redis+sentinel:` or `rediss+sentinel:`.
fn parse_sentinel_url(rest: &str, tls: bool) -> Result<RedisConfig, ConfigError> {
    let rest = rest
        .strip_prefix("//")
        .ok_or(ConfigError::InvalidUrl("expected // after the scheme"))?;
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (rest.get(..at), rest.get(at + 1..).unwrap_or_default()),
        None => (None, rest),
    };
    let hosts_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (hosts, tail) = rest.split_at(hosts_end);
    if tail.contains('#') {
        return Err(ConfigError::InvalidUrl("unexpected #fragment"));
    }
    let mut sentinels = Vec::new();
    for host in hosts.split(',') {
        sentinels.push(parse_authority_with(host, DEFAULT_SENTINEL_PORT)?);
        if sentinels.len() > MAX_SENTINELS {
            return Err(ConfigError::TooManySentinels(sentinels.len()));
        }
    }
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, query),
        None => (tail, ""),
    };
    let path = path.strip_prefix('/').unwrap_or(path);
    let (service, database) = match path.split_once('/') {
        Some((service, "")) => (service, None),
        Some((service, database)) => (service, Some(parse_database(database)?)),
        None => (path, None),
    };
    let service = percent_decode(service, "service name")?;
    if service.is_empty() {
        return Err(ConfigError::MissingServiceName { key: None });
    }
    let auth = match userinfo {
        None => None,
        Some(userinfo) => {
            let (username, password) = match userinfo.split_once(':') {
                Some((username, password)) => (username, Some(password)),
                None => (userinfo, None),
            };
            let username = percent_decode(username, "username")?;
            let password = password
                .map(|password| percent_decode(password, "password"))
                .transpose()?;
            credentials(Some(username), password)?
        }
    };
    let mut sentinel_username = None;
    let mut sentinel_password = None;
    let mut allowed_masters = None;
    let mut master_server_name = None;
    for parameter in query.split('&').filter(|parameter| !parameter.is_empty()) {
        let (name, value) = parameter.split_once('=').unwrap_or((parameter, ""));
        match name {
            "sentinel_username" => {
                sentinel_username = Some(percent_decode(value, "sentinel_username")?);
            }
            "sentinel_password" => {
                sentinel_password = Some(percent_decode(value, "sentinel_password")?);
            }
            "allowed_masters" => {
                let value = percent_decode(value, "allowed_masters")?;
                allowed_masters = Some(parse_allowed_masters(value.split(','))?);
            }
            "master_server_name" => {
                master_server_name = Some(percent_decode(value, "master_server_name")?);
            }
            _ => return Err(ConfigError::UnknownParameter(snippet(name))),
        }
    }
    let mut config = RedisConfig::sentinel_endpoints(service, sentinels);
    config.auth = auth;
    config.database = database;
    if let Some(auth) = credentials(sentinel_username, sentinel_password)? {
        config = config.with_sentinel_auth(auth);
    }
    if let Some(allowed) = allowed_masters {
        config = config.with_sentinel_allowed_masters(allowed);
    }
    if tls {
        let master_tls = TlsConfig {
            server_name: master_server_name,
            ..TlsConfig::default()
        };
        config = config
            .with_tls(master_tls)
            .with_sentinel_tls(TlsConfig::default());
    } else if master_server_name.is_some() {
        return Err(ConfigError::MasterServerNameWithoutTls { key: None });
    }
    Ok(config)
}

/// Decodes `%XX` escapes; the result must be UTF-8.
fn percent_decode(text: &str, part: &'static str) -> Result<String, ConfigError> {
    if !text.contains('%') {
        return Ok(text.to_owned());
    }
    let invalid = || ConfigError::InvalidPercentEncoding(part);
    let mut bytes = text.bytes();
    let mut out = Vec::with_capacity(text.len());
    while let Some(byte) = bytes.next() {
        if byte != b'%' {
            out.push(byte);
            continue;
        }
        let high = bytes.next().and_then(hex_digit).ok_or_else(invalid)?;
        let low = bytes.next().and_then(hex_digit).ok_or_else(invalid)?;
        out.push((high << 4) | low);
    }
    String::from_utf8(out).map_err(|_| invalid())
}

fn hex_digit(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|digit| u8::try_from(digit).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::redis::tests::{auth, tcp, url};

    fn url_error(text: &str) -> ConfigError {
        match RedisConfig::from_url(text) {
            Ok(config) => panic!("{text} parsed as {config:?}"),
            Err(error) => error,
        }
    }

    #[test]
    fn plain_urls() {
        let config = url("redis://localhost");
        assert_eq!(config.endpoint(), &tcp("localhost", 6379));
        assert_eq!(config.auth(), None);
        assert_eq!(config.database(), None);
        assert_eq!(config.tls(), None);

        assert_eq!(url("redis://localhost/").database(), None);
        assert_eq!(
            url("redis://localhost:").endpoint(),
            &tcp("localhost", 6379)
        );
        assert_eq!(
            url("REDIS://redis.internal:6380/15").endpoint(),
            &tcp("redis.internal", 6380)
        );
        assert_eq!(url("redis://redis.internal:6380/15").database(), Some(15));
        assert_eq!(url("redis://127.0.0.1:1/0").database(), Some(0));
        assert_eq!(
            url("redis://127.0.0.1:65535").endpoint(),
            &tcp("127.0.0.1", 65535)
        );
        assert_eq!(
            "redis://h:7/3".parse::<RedisConfig>().ok(),
            Some(RedisConfig::tcp("h", 7).with_database(3))
        );
    }

    #[test]
    fn credentials_in_urls() {
        assert_eq!(
            url("redis://:secret@h").auth(),
            auth(None, "secret").as_ref()
        );
        assert_eq!(
            url("redis://worker:secret@h:1/2").auth(),
            auth(Some("worker"), "secret").as_ref()
        );
        // A password may hold colons; the last `@` ends it.
        assert_eq!(
            url("redis://u:a:b@c@h").auth(),
            auth(Some("u"), "a:b@c").as_ref()
        );
        assert_eq!(url("redis://u:a:b@c@h").endpoint(), &tcp("h", 6379));
        assert_eq!(url("redis://:@h").auth(), None);
        assert!(matches!(
            url_error("redis://worker@h"),
            ConfigError::UsernameWithoutPassword { .. }
        ));
        assert!(matches!(
            url_error("redis://worker:@h"),
            ConfigError::UsernameWithoutPassword { .. }
        ));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(
            url("redis://us%65r:p%40ss%2Fw%3Ard%25%20x@h").auth(),
            auth(Some("user"), "p@ss/w:rd% x").as_ref()
        );
        // `+` is not a space, and UTF-8 escapes decode.
        assert_eq!(
            url("redis://:a+b%C3%A9@h").auth(),
            auth(None, "a+bé").as_ref()
        );
        assert_eq!(
            url("unix:///run/redis%20dir/redis.sock?password=p%26q").endpoint(),
            &Endpoint::Unix("/run/redis dir/redis.sock".into())
        );
        assert_eq!(
            url("unix:///r.sock?password=p%26q").auth(),
            auth(None, "p&q").as_ref()
        );
        for bad in [
            "redis://:abc%@h",
            "redis://:abc%4@h",
            "redis://:abc%zz@h",
            "redis://:%+1@h",
            "redis://:%ff@h",
        ] {
            match url_error(bad) {
                ConfigError::InvalidPercentEncoding("password") => {}
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert!(matches!(
            url_error("redis://%zz:pw@h"),
            ConfigError::InvalidPercentEncoding("username")
        ));
        assert!(matches!(
            url_error("unix:///r%zz.sock"),
            ConfigError::InvalidPercentEncoding("socket path")
        ));
    }

    #[test]
    fn ipv6_hosts() {
        assert_eq!(url("redis://[::1]").endpoint(), &tcp("::1", 6379));
        assert_eq!(url("redis://[::1]:6380/1").endpoint(), &tcp("::1", 6380));
        assert_eq!(
            url("rediss://:pw@[2001:db8::7]:7000").endpoint(),
            &tcp("2001:db8::7", 7000)
        );
        assert_eq!(tcp("::1", 6380).to_string(), "[::1]:6380");
        assert_eq!(tcp("h", 1).to_string(), "h:1");
        for bad in [
            "redis://[::1",
            "redis://[nope]:1",
            "redis://[::1]x",
            "redis://::1",
        ] {
            assert!(
                matches!(url_error(bad), ConfigError::InvalidHost { .. }),
                "{bad}"
            );
        }
    }

    #[test]
    fn tls_urls() {
        let config = url("rediss://:pw@redis.example.com:6380/1");
        assert_eq!(config.tls(), Some(&TlsConfig::default()));
        assert_eq!(config.endpoint(), &tcp("redis.example.com", 6380));
        assert_eq!(config.auth(), auth(None, "pw").as_ref());
        assert_eq!(url("RedisS://h").tls(), Some(&TlsConfig::default()));
    }

    #[test]
    fn unix_urls() {
        let socket = Endpoint::Unix("/run/redis/redis.sock".into());
        for text in [
            "unix:///run/redis/redis.sock",
            "unix:/run/redis/redis.sock",
            "redis+unix:///run/redis/redis.sock",
            "unix:///run/redis/redis.sock?",
        ] {
            let config = url(text);
            assert_eq!(config.endpoint(), &socket, "{text}");
            assert_eq!(config.auth(), None, "{text}");
            assert_eq!(config.database(), None, "{text}");
        }
        let config = url("unix:///run/redis/redis.sock?db=3&username=w&password=pw");
        assert_eq!(config.endpoint(), &socket);
        assert_eq!(config.database(), Some(3));
        assert_eq!(config.auth(), auth(Some("w"), "pw").as_ref());
        let config = url("redis+unix:///run/redis/redis.sock?user=w&pass=pw&db=0");
        assert_eq!(config.auth(), auth(Some("w"), "pw").as_ref());
        assert_eq!(config.database(), Some(0));
        assert_eq!(socket.to_string(), "unix:/run/redis/redis.sock");

        assert!(matches!(url_error("unix://"), ConfigError::MissingPath));
        assert!(matches!(url_error("unix:"), ConfigError::MissingPath));
        assert!(matches!(
            url_error("unix://run/redis.sock"),
            ConfigError::InvalidUrl(_)
        ));
        assert!(matches!(
            url_error("unix:///r.sock?db=x"),
            ConfigError::InvalidDatabase(db) if db == "x"
        ));
        assert!(matches!(
            url_error("unix:///r.sock?timeout=3"),
            ConfigError::UnknownParameter(name) if name == "timeout"
        ));
        assert!(matches!(
            url_error("unix:///r.sock?user=w"),
            ConfigError::UsernameWithoutPassword { .. }
        ));
    }

    #[test]
    fn bad_urls() {
        for (text, check) in [
            ("localhost:6379", "unknown redis url scheme \"localhost\""),
            ("http://h", "unknown redis url scheme \"http\""),
            ("redis-sentinel://h", "unknown redis url scheme"),
            ("h", "has no scheme"),
            ("", "has no scheme"),
            ("redis:h", "expected //"),
            ("redis://", "no host"),
            ("redis:///0", "no host"),
            ("redis://:pw@", "no host"),
            ("redis://:6379", "no host"),
            ("redis://h:0", "invalid redis port \"0\""),
            ("redis://h:65536", "invalid redis port \"65536\""),
            ("redis://h:-1", "invalid redis port \"-1\""),
            ("redis://h:+1", "invalid redis port \"+1\""),
            ("redis://h:port", "invalid redis port \"port\""),
            ("redis://h/x", "invalid redis database \"x\""),
            ("redis://h/-1", "invalid redis database \"-1\""),
            ("redis://h/1/2", "invalid redis database \"1/2\""),
            ("redis://h/99999999999", "invalid redis database"),
            (
                "redis://h/0?protocol=resp3",
                "unsupported redis url parameter \"protocol\"",
            ),
            ("redis://h/0#x", "fragment"),
            ("redis://h h", "invalid redis host"),
        ] {
            let message = url_error(text).to_string();
            assert!(message.contains(check), "{text}: {message}");
        }
        let long = format!("redis://h/{}", "x".repeat(200));
        let message = url_error(&long).to_string();
        assert!(message.len() < 120, "{message}");
    }

    #[test]
    fn errors_never_show_the_password() {
        for text in [
            "hunter2",
            "hunter2@h",
            "x:hunter2@h:bad",
            "redis://u:hunter2@h:bad",
            "redis://u:hunter2@h/bad",
            "redis://u:hunter2@[bad",
            "redis://u:hunter2%zz@h",
            "redis://u:hunter2@h?x=1",
            "redis://u:hunter2@h:1/1#f",
            "redis://u:hunter2@",
            "unix:///s?password=hunter2&db=z",
            "unix:///s?password=hunter2&other=1",
            "unix:///s?password=hunter2%z",
        ] {
            let error = url_error(text);
            let shown = format!("{error} {error:?}");
            assert!(!shown.contains("hunter2"), "{text}: {shown}");
        }
    }
}
