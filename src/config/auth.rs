//! [`RedisAuth`]: a password for Redis, and its user.

use std::fmt;

/// A password for Redis, and the ACL user it belongs to (none: Redis'
/// `default` user, the `requirepass` password). Its [`Debug`] output hides
/// the password, so it can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisAuth {
    /// The ACL user (Redis 6 and later); none for `requirepass`.
    pub username: Option<String>,
    /// The password.
    pub password: String,
}

impl fmt::Debug for RedisAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisAuth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}
