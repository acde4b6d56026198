//! Arbitrary JSON inside a typed row, kept as text.

use std::fmt;
use std::hash::{Hash, Hasher};

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::wire::JsonError;
use crate::wire::json;

/// A JSON value carried inside a row without being parsed: the `data` of
/// `federation` and `receipts` rows, an unknown `events` row type's data,
/// and fields after the ones this version knows.
///
/// The text is always in Synapse's spelling (compact, non-ASCII as
/// `\uXXXX`, floats as Python's `repr`, the last of duplicate keys), so it
/// is written back byte for byte. Text Synapse wrote is only scanned, never
/// parsed; text in another spelling is re-spelt once, when it is decoded, as
/// Synapse would re-encode it.
///
/// Equality compares the text; as the spelling is canonical, two values
/// are equal exactly when their JSON values are. Two things pass through
/// here that typed fields refuse, as Python passes them: a lone UTF-16
/// surrogate escape such as `"\ud800"` and integers beyond 64 bits
/// ([`RawJson::parse`] may refuse them). Re-spelling text that holds an
/// integer beyond 64 bits fails, as it would not be exact.
///
/// ```
/// use synapse_replication::streams::RawJson;
///
/// let data = RawJson::from_text(r#"{ "ts": 1700000000000, "name": "café" }"#)?;
/// assert_eq!(data.as_str(), r#"{"ts":1700000000000,"name":"caf\u00e9"}"#);
/// let value: serde_json::Value = data.parse()?;
/// assert_eq!(value["ts"], 1700000000000_i64);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// Encodes `value` as Synapse would.
    pub fn from_value<T: Serialize + ?Sized>(value: &T) -> Result<RawJson, JsonError> {
        RawJson::from_canonical(json::to_vec(value)?)
    }

    /// Reads JSON text, re-spelling it the way Synapse writes it when it is
    /// spelt otherwise.
    pub fn from_text(text: &str) -> Result<RawJson, JsonError> {
        RawJson::from_raw(RawValue::from_string(text.to_owned())?)
    }

    /// Takes a serde_json raw value, re-spelling it the way Synapse writes
    /// it when it is spelt otherwise.
    pub fn from_raw(raw: Box<RawValue>) -> Result<RawJson, JsonError> {
        if is_canonical(raw.get().as_bytes()) {
            Ok(RawJson(raw))
        } else {
            RawJson::respell(raw.get())
        }
    }

    /// `{}`, an empty object.
    pub fn empty_object() -> RawJson {
        RawJson::known_valid("{}")
    }

    /// `null`.
    pub fn null() -> RawJson {
        RawJson::known_valid("null")
    }

    /// The JSON text, in Synapse's spelling.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The JSON text as a serde_json raw value.
    pub fn as_raw(&self) -> &RawValue {
        &self.0
    }

    /// The JSON text as a boxed serde_json raw value.
    pub fn into_raw(self) -> Box<RawValue> {
        self.0
    }

    /// Parses the text into any deserialisable type, such as
    /// `serde_json::Value`.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, JsonError> {
        json::from_slice(self.as_str().as_bytes())
    }

    fn respell(text: &str) -> Result<RawJson, JsonError> {
        let text = json::without_negative_zero(text);
        let value: serde_json::Value = json::from_slice(text.as_bytes())?;
        json::check_exact_numbers(&value)?;
        RawJson::from_value(&value)
    }

    fn from_canonical(bytes: Vec<u8>) -> Result<RawJson, JsonError> {
        // Synapse's writer only writes valid UTF-8 JSON; serde_json checks
        // again rather than trusting it.
        let text = String::from_utf8(bytes)
            .map_err(|error| serde_json::Error::io(std::io::Error::other(error)))?;
        Ok(RawJson(RawValue::from_string(text)?))
    }

    fn known_valid(text: &'static str) -> RawJson {
        match RawValue::from_string(text.to_owned()) {
            Ok(raw) => RawJson(raw),
            // Unreachable: callers pass valid JSON literals. Fall back to the
            // value serde_json itself writes for unit.
            Err(_) => RawJson(RawValue::NULL.to_owned()),
        }
    }
}

impl Default for RawJson {
    /// `{}`: the fields held as `RawJson` are JSON objects in Synapse.
    fn default() -> Self {
        RawJson::empty_object()
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for RawJson {}

impl Hash for RawJson {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RawJson").field(&self.as_str()).finish()
    }
}

impl fmt::Display for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        RawJson::from_raw(raw).map_err(D::Error::custom)
    }
}

/// Whether `text` (valid JSON) is already spelt exactly as Python's `json`
/// with Synapse's settings writes it. Conservative: `false` sends the text
/// through a parse and re-encode, which is always right, only slower.
///
/// Canonical means: no whitespace outside strings; strings hold printable
/// ASCII only, and escape exactly what Python escapes, the way it does
/// (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other controls and everything
/// from DEL up as lowercase `\uXXXX`); integers other than `-0` (Python
/// writes any integer digit for digit, so integers of any size pass); floats
/// spelt as Python's `repr` spells them.
pub(crate) fn is_canonical(text: &[u8]) -> bool {
    // The keys of the objects open around the current position, flattened;
    // `open` holds, per open container, where its keys start in `keys`
    // (`None` for an array).
    let mut keys: Vec<&[u8]> = Vec::new();
    let mut open: Vec<Option<usize>> = Vec::new();
    let mut expect_key = false;
    let mut index = 0;
    while index < text.len() {
        match text[index] {
            b'"' => {
                let Some(end) = canonical_string_end(text, index + 1) else {
                    return false;
                };
                if expect_key {
                    if let Some(Some(start)) = open.last() {
                        // Canonical strings have one spelling, so equal keys
                        // have equal bytes. Python keeps the last of
                        // duplicate keys; leave that to the slow path, and
                        // large objects too (this check is quadratic).
                        let key = &text[index..end];
                        let siblings = &keys[*start..];
                        if siblings.len() >= MAX_KEYS_CHECKED || siblings.contains(&key) {
                            return false;
                        }
                        keys.push(key);
                    }
                    expect_key = false;
                }
                index = end;
            }
            b'{' => {
                open.push(Some(keys.len()));
                expect_key = true;
                index += 1;
            }
            b'[' => {
                open.push(None);
                index += 1;
            }
            b'}' | b']' => {
                if let Some(Some(start)) = open.pop() {
                    keys.truncate(start);
                }
                expect_key = false;
                index += 1;
            }
            b',' => {
                expect_key = matches!(open.last(), Some(Some(_)));
                index += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = index;
                let mut float = false;
                while index < text.len() {
                    match text[index] {
                        b'0'..=b'9' | b'-' => {}
                        b'.' | b'e' | b'E' | b'+' => float = true,
                        _ => break,
                    }
                    index += 1;
                }
                let number = &text[start..index];
                if number == b"-0" || (float && !canonical_float(number)) {
                    return false;
                }
            }
            b' ' | b'\t' | b'\n' | b'\r' => return false,
            _ => index += 1,
        }
    }
    true
}

/// Objects with more keys than this are not checked for duplicates in the
/// fast path, but re-spelt.
const MAX_KEYS_CHECKED: usize = 64;

/// Whether a JSON float is spelt as Python's `repr` spells its value.
fn canonical_float(number: &[u8]) -> bool {
    let value = std::str::from_utf8(number)
        .ok()
        .and_then(|number| number.parse::<f64>().ok());
    match value {
        // Out of range (Python reads infinity, and cannot write it back).
        Some(value) if value.is_finite() => json::to_vec(&value).is_ok_and(|spelt| spelt == number),
        _ => false,
    }
}

/// The index just past the closing quote of a string whose contents start
/// at `index`, if the string is spelt canonically.
fn canonical_string_end(text: &[u8], mut index: usize) -> Option<usize> {
    while index < text.len() {
        match text[index] {
            b'"' => return Some(index + 1),
            b'\\' => match *text.get(index + 1)? {
                b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => index += 2,
                b'u' => {
                    let hex = text.get(index + 2..index + 6)?;
                    let mut unit: u32 = 0;
                    for digit in hex {
                        let value = match digit {
                            b'0'..=b'9' => digit - b'0',
                            b'a'..=b'f' => digit - b'a' + 10,
                            _ => return None,
                        };
                        unit = unit * 16 + u32::from(value);
                    }
                    let short_form = matches!(unit, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d);
                    if (0x20..0x7f).contains(&unit) || short_form {
                        return None;
                    }
                    index += 6;
                }
                _ => return None,
            },
            0x20..=0x7e => index += 1,
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_spellings_are_recognised() {
        for text in [
            r#"{"a":[1,-2,null,true,false,"x"]}"#,
            r#""\u00e9\ud83d\ude00\u0001\u007f\"\\\n""#,
            r#""\ud800""#,
            "123456789012345678",
            "100000000000000000000",
            "[1.5,-0.0,1e+16,2.5e-07,0.0001]",
            r#"{"a":{"a":1,"b":2},"b":[{"a":1},{"a":2}],"c":{}}"#,
            "0",
            "[]",
        ] {
            assert!(is_canonical(text.as_bytes()), "{text}");
        }
    }

    #[test]
    fn other_spellings_are_not() {
        for text in [
            r#"{"a": 1}"#,
            r#""\u00E9""#,
            r#""\u0041""#,
            r#""\u000a""#,
            r#""\/""#,
            "\"é\"",
            "\"\u{7f}\"",
            "1.50",
            "1e5",
            "1E+16",
            "1e16",
            "-0",
            "0.00001",
            "1e400",
            r#"{"a":1,"a":2}"#,
            r#"[{"b":{},"b":1}]"#,
        ] {
            assert!(!is_canonical(text.as_bytes()), "{text}");
        }
    }

    #[test]
    fn other_spellings_are_respelt() {
        let cases = [
            (
                r#"{ "a" : [1, 2.50, "\u00E9\/"] }"#,
                r#"{"a":[1,2.5,"\u00e9/"]}"#,
            ),
            ("\"\u{7f}é\"", r#""\u007f\u00e9""#),
            (r#"{"a":1,"b":3,"a":2}"#, r#"{"a":2,"b":3}"#),
            (
                r#"{"a":{"a":1},"b":[{"a":1}]}"#,
                r#"{"a":{"a":1},"b":[{"a":1}]}"#,
            ),
            (r#"[-0,-0.0,1e-0,"-0",-0]"#, r#"[0,-0.0,1.0,"-0",0]"#),
        ];
        for (text, expected) in cases {
            assert_eq!(RawJson::from_text(text).unwrap().as_str(), expected);
        }
        assert!(
            RawJson::from_text("[100000000000000000000 ]").is_err(),
            "cannot be re-spelt exactly"
        );
        assert_eq!(
            RawJson::from_text("[100000000000000000000]")
                .unwrap()
                .as_str(),
            "[100000000000000000000]",
            "already canonical: kept digit for digit, as Python does"
        );
        assert!(RawJson::from_text("[1e400]").is_err());
        assert_eq!(RawJson::default().as_str(), "{}");
        assert_eq!(RawJson::null().as_str(), "null");
    }
}
