//! Names of streams and of instances (processes), as they appear on the wire.

use std::fmt;
use std::sync::Arc;

use bytestring::ByteString;

macro_rules! stream_names {
    ($( $(#[$doc:meta])* $variant:ident => $name:literal / $bytes:literal, )*) => {
        /// The name of a replication stream.
        ///
        /// Every stream of Synapse 1.163.2 has a variant; any other name is
        /// carried unchanged in [`StreamName::Other`], so a newer Synapse's
        /// streams pass through. Decoding a known name allocates nothing.
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum StreamName {
            $( $(#[$doc])* $variant, )*
            /// A stream this version of the crate does not know.
            Other(Arc<str>),
        }

        impl StreamName {
            /// Every stream Synapse 1.163.2 knows, in the order of its `STREAMS_MAP`.
            pub const KNOWN: &'static [StreamName] = &[ $( StreamName::$variant, )* ];

            /// The name as written on the wire.
            pub fn as_str(&self) -> &str {
                match self {
                    $( StreamName::$variant => $name, )*
                    StreamName::Other(name) => name,
                }
            }

            /// Looks a name up among the known streams, without allocating.
            pub fn known(name: &str) -> Option<StreamName> {
                Self::known_bytes(name.as_bytes())
            }

            /// [`StreamName::known`] for a name of up to seven bytes, none
            /// zero, given as the little-endian word that holds it, zero past
            /// it: a comparison of words for each short known name. `None`
            /// for any other word.
            pub(crate) fn known_word(word: u64) -> Option<StreamName> {
                $(
                    if $bytes.len() < 8 && word == const { short_word($bytes) } {
                        return Some(StreamName::$variant);
                    }
                )*
                None
            }

            /// [`StreamName::known`] on raw bytes: the decoder's hot path,
            /// which needs no UTF-8 check since every known name is ASCII.
            #[inline(always)]
            pub(crate) fn known_bytes(name: &[u8]) -> Option<StreamName> {
                match name {
                    $( $bytes => Some(StreamName::$variant), )*
                    _ => None,
                }
            }
        }
    };
}

/// `name` as a little-endian word, zero past it, if it has fewer than
/// eight bytes; else a word no such name gives (its high byte is not zero).
const fn short_word(name: &[u8]) -> u64 {
    if name.len() >= 8 {
        return u64::MAX;
    }
    let mut word = 0;
    let mut at = name.len();
    while at > 0 {
        at -= 1;
        word = word << 8 | name[at] as u64;
    }
    word
}

stream_names! {
    /// `events`: new events and current-state changes (multi-writer).
    Events => "events" / b"events",
    /// `backfill`: events fetched from other servers' history.
    Backfill => "backfill" / b"backfill",
    /// `presence`: users' presence states.
    Presence => "presence" / b"presence",
    /// `presence_federation`: presence destined for remote servers.
    PresenceFederation => "presence_federation" / b"presence_federation",
    /// `typing`: typing notifications per room.
    Typing => "typing" / b"typing",
    /// `receipts`: read receipts (multi-writer).
    Receipts => "receipts" / b"receipts",
    /// `push_rules`: a user's push rules changed.
    PushRules => "push_rules" / b"push_rules",
    /// `pushers`: pushers added or removed.
    Pushers => "pushers" / b"pushers",
    /// `caches`: cache invalidations; every process writes it over Redis.
    Caches => "caches" / b"caches",
    /// `device_lists`: device list changes.
    DeviceLists => "device_lists" / b"device_lists",
    /// `to_device`: to-device messages.
    ToDevice => "to_device" / b"to_device",
    /// `federation`: outgoing federation traffic (EDUs).
    Federation => "federation" / b"federation",
    /// `account_data`: global and per-room account data.
    AccountData => "account_data" / b"account_data",
    /// `profile_updates`: profile field changes.
    ProfileUpdates => "profile_updates" / b"profile_updates",
    /// `sticky_events`: sticky events (MSC4354).
    StickyEvents => "sticky_events" / b"sticky_events",
    /// `thread_subscriptions`: users' thread subscriptions.
    ThreadSubscriptions => "thread_subscriptions" / b"thread_subscriptions",
    /// `un_partial_stated_room`: a room finished its partial-state join.
    UnPartialStatedRoom => "un_partial_stated_room" / b"un_partial_stated_room",
    /// `un_partial_stated_event`: an event's state became complete.
    UnPartialStatedEvent => "un_partial_stated_event" / b"un_partial_stated_event",
    /// `quarantined_media`: media quarantined or released.
    QuarantinedMedia => "quarantined_media" / b"quarantined_media",
}

impl StreamName {
    /// The stream with this name: a known variant, or [`StreamName::Other`].
    pub fn new(name: impl AsRef<str>) -> StreamName {
        StreamName::from(name.as_ref())
    }

    /// Whether this version of the crate knows the stream.
    pub fn is_known(&self) -> bool {
        !matches!(self, StreamName::Other(_))
    }
}

impl From<&str> for StreamName {
    fn from(name: &str) -> Self {
        StreamName::known(name).unwrap_or_else(|| StreamName::Other(Arc::from(name)))
    }
}

impl From<ByteString> for StreamName {
    fn from(name: ByteString) -> Self {
        StreamName::new(name)
    }
}

impl From<String> for StreamName {
    fn from(name: String) -> Self {
        StreamName::new(name)
    }
}

impl AsRef<str> for StreamName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name of a Synapse process: `master` for the main process, or a
/// worker's `worker_name`.
///
/// Names of up to 22 bytes (`master`, `event_persister12`,
/// `federation_sender1`...) are stored inline, so decoding and cloning one
/// touches no shared counter; longer names are copied once and shared. A
/// name is 24 bytes, so that the commands and events that carry one stay
/// small to move.
#[derive(Clone)]
pub struct InstanceName(Repr);

/// The longest name stored inline: with its length and the enum's tag,
/// 24 bytes, as much as a shared name.
const INLINE: usize = 22;

/// The bytes of an inline name, zero-padded.
#[derive(Clone, Copy)]
struct Inline([u8; INLINE]);

/// `bytes` padded with zeros to [`INLINE`] bytes, if no longer, and whether
/// they are all ASCII.
///
/// The bytes are read as (at most) two overlapping pieces, the first and
/// the last `n` bytes for the largest `n` of 16, 8 and 4 that fits, the
/// second shifted right by the bytes it shares with the first; then
/// written once, a word at a time: no call to `memcpy` for a few bytes,
/// and no stores that a later load would have to piece together.
fn inline_bytes(bytes: &[u8]) -> Option<(Inline, bool)> {
    let len = bytes.len();
    let words: [u64; 4] = if let (Some(head), Some(tail)) =
        (bytes.first_chunk::<16>(), bytes.last_chunk::<16>())
    {
        if len > INLINE {
            return None;
        }
        let head = u128::from_le_bytes(*head);
        let tail = u128::from_le_bytes(*tail)
            .checked_shr(8 * (32 - len) as u32)
            .unwrap_or(0);
        [
            head as u64,
            (head >> 64) as u64,
            tail as u64,
            (tail >> 64) as u64,
        ]
    } else if let (Some(head), Some(tail)) = (bytes.first_chunk::<8>(), bytes.last_chunk::<8>()) {
        let tail = u64::from_le_bytes(*tail)
            .checked_shr(8 * (16 - len) as u32)
            .unwrap_or(0);
        [u64::from_le_bytes(*head), tail, 0, 0]
    } else if let (Some(head), Some(tail)) = (bytes.first_chunk::<4>(), bytes.last_chunk::<4>()) {
        let tail = u32::from_le_bytes(*tail)
            .checked_shr(8 * (8 - len) as u32)
            .unwrap_or(0);
        [
            u64::from(u32::from_le_bytes(*head)) | u64::from(tail) << 32,
            0,
            0,
            0,
        ]
    } else {
        let word = bytes
            .iter()
            .rev()
            .fold(0, |word, byte| word << 8 | u64::from(*byte));
        [word, 0, 0, 0]
    };
    // `words` lay the bytes out in 32; a name of at most INLINE (< 24)
    // bytes fills only the first three words.
    let mut inline = [0; INLINE];
    let [first, second, third, _] = words;
    inline[..8].copy_from_slice(&first.to_le_bytes());
    inline[8..16].copy_from_slice(&second.to_le_bytes());
    inline[16..].copy_from_slice(&third.to_le_bytes()[..INLINE - 16]);
    let high = (words[0] | words[1] | words[2] | words[3]) & 0x8080_8080_8080_8080;
    Some((Inline(inline), high == 0))
}

#[derive(Clone)]
enum Repr {
    Inline { len: u8, bytes: Inline },
    Shared(Arc<str>),
}

impl InstanceName {
    /// The main process's name on the wire.
    ///
    /// Configuration may call it `main`; on the wire it is always `master`.
    pub const MASTER: &'static str = "master";

    /// Wraps a name.
    pub fn new(name: impl AsRef<str>) -> Self {
        InstanceName::from(name.as_ref())
    }

    /// The main process, `master`.
    pub fn master() -> Self {
        InstanceName::from(Self::MASTER)
    }

    /// A name read from a line: copied inline when short, else into a
    /// shared allocation. `None` if it is not UTF-8.
    pub(crate) fn from_line(name: &[u8]) -> Option<Self> {
        if let Some((bytes, ascii)) = inline_bytes(name) {
            if !ascii {
                std::str::from_utf8(name).ok()?;
            }
            return Some(InstanceName(Repr::Inline {
                len: name.len() as u8,
                bytes,
            }));
        }
        Self::shared(name)
    }

    /// A name of `len` (at most eight) ASCII bytes, given as the
    /// little-endian word that holds it, zero past the name; `None` if
    /// the name is not ASCII. As [`InstanceName::from_line`] reads the
    /// same bytes.
    pub(crate) fn from_word(word: u64, len: usize) -> Option<Self> {
        if word & 0x8080_8080_8080_8080 != 0 || len > 8 {
            return None;
        }
        let mut bytes = [0; INLINE];
        bytes[..8].copy_from_slice(&word.to_le_bytes());
        Some(InstanceName(Repr::Inline {
            len: len as u8,
            bytes: Inline(bytes),
        }))
    }

    /// A name too long to store inline, or `None` if it is not UTF-8.
    fn shared(name: &[u8]) -> Option<Self> {
        std::str::from_utf8(name)
            .ok()
            .map(|name| InstanceName(Repr::Shared(Arc::from(name))))
    }

    /// `bytes` (valid UTF-8) stored inline, if short enough.
    fn inline(bytes: &[u8]) -> Option<Self> {
        Some(InstanceName(Repr::Inline {
            len: bytes.len() as u8,
            bytes: inline_bytes(bytes)?.0,
        }))
    }

    /// The name as written on the wire.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Inline bytes were valid UTF-8 when stored; the fallback is
            // unreachable.
            Repr::Inline { .. } => std::str::from_utf8(self.as_bytes()).unwrap_or_default(),
            Repr::Shared(name) => name,
        }
    }

    /// The name's bytes (UTF-8).
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes.0[..usize::from(*len).min(INLINE)],
            Repr::Shared(name) => name.as_bytes(),
        }
    }

    /// Whether this is the main process.
    pub fn is_master(&self) -> bool {
        self.as_bytes() == Self::MASTER.as_bytes()
    }
}

impl PartialEq for InstanceName {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            // Zero-padded: equal names have equal arrays. A fixed-size
            // comparison, where the slices' would call `memcmp`; the
            // follower compares names for every command.
            (
                Repr::Inline { len, bytes },
                Repr::Inline {
                    len: other_len,
                    bytes: other_bytes,
                },
            ) => len == other_len && bytes.0 == other_bytes.0,
            _ => self.as_bytes() == other.as_bytes(),
        }
    }
}

impl Eq for InstanceName {}

impl std::hash::Hash for InstanceName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialOrd for InstanceName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InstanceName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl fmt::Debug for InstanceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("InstanceName").field(&self.as_str()).finish()
    }
}

impl From<&str> for InstanceName {
    fn from(name: &str) -> Self {
        Self::inline(name.as_bytes()).unwrap_or_else(|| InstanceName(Repr::Shared(Arc::from(name))))
    }
}

impl From<String> for InstanceName {
    fn from(name: String) -> Self {
        InstanceName::new(name)
    }
}

impl From<ByteString> for InstanceName {
    fn from(name: ByteString) -> Self {
        InstanceName::new(name)
    }
}

impl AsRef<str> for InstanceName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq<str> for InstanceName {
    fn eq(&self, other: &str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<&str> for InstanceName {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl fmt::Display for InstanceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_stream_names_are_known_by_their_word() {
        let mut short = 0;
        for stream in StreamName::KNOWN {
            let name = stream.as_str().as_bytes();
            if name.len() < 8 {
                short += 1;
                assert_eq!(
                    StreamName::known_word(short_word(name)).as_ref(),
                    Some(stream)
                );
            }
            // Any other word of a name's bytes, shorter, longer or
            // changed, is not a known name.
            for len in 1..name.len().min(8) {
                let word = short_word(&name[..len]);
                assert_eq!(
                    StreamName::known_word(word),
                    StreamName::known_bytes(&name[..len])
                );
            }
            for at in 0..name.len().min(7) {
                let mut other = name[..name.len().min(7)].to_vec();
                other[at] ^= 0x20;
                assert_eq!(
                    StreamName::known_word(short_word(&other)),
                    StreamName::known_bytes(&other)
                );
            }
        }
        assert_eq!(short, 4, "events, typing, caches, pushers");
        assert_eq!(StreamName::known_word(0), None);
        assert_eq!(StreamName::known_word(u64::MAX), None);
    }

    #[test]
    fn short_and_long_names_behave_alike() {
        let long = "a_worker_name_longer_than_thirty_bytes_é";
        // Around the inline limit (22 bytes), and on either side of it
        // with a multi-byte character at the end.
        let at_limit = "federation_sender_1234";
        let over_limit = "federation_sender_12345";
        assert_eq!((at_limit.len(), over_limit.len()), (INLINE, INLINE + 1));
        for name in [
            "master",
            "",
            "event_persister1",
            "ünïcödé",
            at_limit,
            over_limit,
            "federation_sender_12é",
            "federation_sender_123é",
            long,
        ] {
            let line = bytes::Bytes::copy_from_slice(name.as_bytes());
            let decoded = InstanceName::from_line(&line).unwrap();
            assert_eq!(decoded.as_str(), name);
            assert_eq!(decoded, InstanceName::from(name));
            assert_eq!(decoded, InstanceName::from(name.to_string()));
            assert_eq!(decoded.to_string(), name);
        }
        assert!(InstanceName::from_line(b"\xff").is_none());
        assert!(InstanceName::master().is_master());
    }
}
