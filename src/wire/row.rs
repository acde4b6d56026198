//! Raw row JSON, validated but not parsed.

use std::fmt;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::json;

/// The JSON of one `RDATA` row, kept as the bytes it arrived as.
///
/// A `RawRow` always holds one valid JSON value on a single line: decoding
/// checks it without building any value (so a row that Synapse would refuse
/// is refused at decode, and its gap is caught up later), and a row is only
/// parsed when someone asks for it. Cloning is a reference-count increment.
///
/// Rows are forwarded byte for byte: re-encoding an `RDATA` writes the row
/// exactly as received. [`RawRow::canonical`] gives the bytes Synapse would
/// write for the same value.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RawRow(Bytes);

impl RawRow {
    /// Validates `bytes` as one JSON value with no newline in it.
    ///
    /// Lone UTF-16 surrogate escapes such as `"\ud800"` are accepted here, as
    /// Python accepts them; they only fail when a string is decoded from the
    /// row (a per-row error).
    pub fn new(bytes: impl Into<Bytes>) -> Result<RawRow, json::JsonError> {
        let bytes = bytes.into();
        json::validate(&bytes)?;
        Ok(RawRow(bytes))
    }

    /// Wraps bytes the caller has already validated.
    pub(crate) fn from_validated(bytes: Bytes) -> RawRow {
        RawRow(bytes)
    }

    /// Encodes `value` the way Synapse's JSON encoder does.
    pub fn from_value<T: Serialize + ?Sized>(value: &T) -> Result<RawRow, json::JsonError> {
        Ok(RawRow(Bytes::from(json::to_vec(value)?)))
    }

    /// The row's JSON text.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The row's JSON text as a `Bytes` (a cheap clone).
    pub fn to_bytes(&self) -> Bytes {
        self.0.clone()
    }

    /// The row's JSON text as a string.
    pub fn as_str(&self) -> &str {
        // Valid JSON is valid UTF-8: serde_json checks strings, and every
        // byte outside a string is ASCII. The fallback is unreachable.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// Parses the row into any deserialisable type.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, json::JsonError> {
        json::from_slice(&self.0)
    }

    /// The bytes Synapse would write for this row's value: compact, keys in
    /// the order received, non-ASCII as `\uXXXX`.
    ///
    /// Fails for rows whose value cannot be re-encoded exactly: integers
    /// outside 64 bits, and lone surrogates.
    pub fn canonical(&self) -> Result<RawRow, json::JsonError> {
        let text = json::without_negative_zero(self.as_str());
        let value: serde_json::Value = json::from_slice(text.as_bytes())?;
        json::check_exact_numbers(&value)?;
        RawRow::from_value(&value)
    }
}

impl AsRef<[u8]> for RawRow {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for RawRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for RawRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
