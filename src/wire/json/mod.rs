//! JSON as Synapse writes it.
//!
//! Synapse encodes with Python's `json.JSONEncoder(allow_nan=False,
//! separators=(",", ":"))`: compact, every character outside printable ASCII
//! escaped as `\uXXXX` with lowercase hex (astral characters as a surrogate
//! pair, DEL as `\u007f`), floats as Python's `repr`, NaN and infinities
//! refused.
//!
//! One difference remains: serde_json writes a non-finite `f64` field as
//! `null` before a formatter sees it, where Python raises. No row type of
//! this crate holds a float, and `serde_json::Value` cannot hold NaN; types
//! of your own should not either. Reading, NaN and infinities are refused.
//!
//! [`to_vec`] and [`to_writer`] write exactly that with serde_json
//! and [`SynapseFormatter`]; re-encoding a value Synapse wrote gives back the
//! same bytes.

use std::borrow::Cow;
use std::io;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::ser::{CharEscape, Formatter};

mod validate;

pub(crate) use validate::ascii_string_specials;

/// A JSON value that could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JsonError {
    /// The text is not one valid JSON value (as serde_json reports it).
    #[error("invalid JSON: {0}")]
    Syntax(#[from] serde_json::Error),
    /// The text is not one valid JSON value (found while validating a row).
    #[error("invalid JSON: {problem} at byte {at}")]
    Invalid {
        /// The byte offset where the text stopped being JSON.
        at: usize,
        /// What was wrong there.
        problem: &'static str,
    },
    /// The JSON text spans several lines, which no wire line may.
    #[error("JSON text contains a newline")]
    Newline,
    /// A number that cannot be re-encoded exactly (an integer beyond 64 bits).
    #[error("number {0} is outside the 64-bit range and cannot be re-encoded exactly")]
    InexactNumber(f64),
}

/// Checks that `bytes` hold exactly one JSON value on one line, without
/// building it.
///
/// Accepts exactly what serde_json accepts, so it matches what Synapse's
/// decoder accepts, and checks UTF-8. Validation is iterative, so any
/// nesting depth is accepted without using stack (parsing a row into values
/// later refuses nesting beyond 128 levels). Lone surrogate
/// escapes and numbers beyond `f64` range (`1e400`) are accepted, as in
/// Python; they fail only when the value is parsed.
pub fn validate(bytes: &[u8]) -> Result<(), JsonError> {
    validate_row(bytes)
}

/// [`validate`] in one pass: a newline anywhere is [`JsonError::Newline`].
pub(crate) fn validate_row(bytes: &[u8]) -> Result<(), JsonError> {
    validate::validate_with(bytes, false).map_err(|invalid| {
        if bytes.get(invalid.at) == Some(&b'\n') {
            JsonError::Newline
        } else {
            JsonError::Invalid {
                at: invalid.at,
                problem: invalid.problem,
            }
        }
    })
}

/// Parses JSON text into `T`.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, JsonError> {
    Ok(serde_json::from_slice(bytes)?)
}

/// Parses JSON text into `T`, reading a lone surrogate escape (which Python
/// writes and reads, and Rust strings cannot hold) as U+FFFD.
///
/// Used for the JSON of `USER_IP` and `LOCK_RELEASED`, so that one odd user
/// agent cannot cost a connection. Text without lone surrogates parses
/// exactly as with [`from_slice`].
pub fn from_slice_lossy<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, JsonError> {
    from_slice_borrowed::<T, T>(bytes, |value| value)
}

/// [`from_slice_lossy`] for fields read as [`Text`]: `T` borrows every
/// string without escapes from `bytes`. Only text with a lone surrogate
/// escape (the lossy case) is parsed a second time, as the owned `O`, and
/// turned into a `T` by `own`.
pub(crate) fn from_slice_borrowed<'a, T, O>(
    bytes: &'a [u8],
    own: impl FnOnce(O) -> T,
) -> Result<T, JsonError>
where
    T: Deserialize<'a>,
    O: DeserializeOwned,
{
    match serde_json::from_slice(bytes) {
        Ok(value) => Ok(value),
        Err(error) => match replace_lone_surrogates(bytes) {
            Some(replaced) => Ok(own(serde_json::from_slice(&replaced)?)),
            None => Err(error.into()),
        },
    }
}

/// A JSON string read by [`from_slice_borrowed`]: borrowed from the text
/// when it holds no escape (no copy, no allocation), else unescaped into
/// its own `String`.
#[derive(Debug)]
pub(crate) enum Text<'a> {
    /// The string as it stands in the text.
    Borrowed(&'a str),
    /// The unescaped string.
    Owned(String),
}

impl Text<'_> {
    /// The string.
    pub(crate) fn as_str(&self) -> &str {
        match self {
            Text::Borrowed(text) => text,
            Text::Owned(text) => text,
        }
    }
}

impl From<String> for Text<'_> {
    fn from(text: String) -> Self {
        Text::Owned(text)
    }
}

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;

        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Text<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Text<'de>, E> {
                Ok(Text::Borrowed(text))
            }

            fn visit_str<E>(self, text: &str) -> Result<Text<'de>, E> {
                Ok(Text::Owned(text.to_owned()))
            }

            fn visit_string<E>(self, text: String) -> Result<Text<'de>, E> {
                Ok(Text::Owned(text))
            }
        }

        deserializer.deserialize_str(Visitor)
    }
}

/// `bytes` with every lone surrogate escape replaced by `\ufffd`, or `None`
/// if there is none.
fn replace_lone_surrogates(bytes: &[u8]) -> Option<Vec<u8>> {
    fn unit(bytes: &[u8], at: usize) -> Option<u16> {
        let hex = bytes.get(at..at + 6)?;
        if !hex.starts_with(b"\\u") {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16).ok()
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut replaced = false;
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'\\' {
            out.push(bytes[at]);
            at += 1;
            continue;
        }
        let Some(first) = unit(bytes, at) else {
            // Another escape (or a broken one): copy it, both bytes.
            out.extend_from_slice(&bytes[at..(at + 2).min(bytes.len())]);
            at += 2;
            continue;
        };
        let pair = (0xD800..0xDC00).contains(&first)
            && unit(bytes, at + 6).is_some_and(|second| (0xDC00..0xE000).contains(&second));
        if pair {
            out.extend_from_slice(&bytes[at..at + 12]);
            at += 12;
        } else if (0xD800..0xE000).contains(&first) {
            out.extend_from_slice(b"\\ufffd");
            replaced = true;
            at += 6;
        } else {
            out.extend_from_slice(&bytes[at..at + 6]);
            at += 6;
        }
    }
    replaced.then_some(out)
}

/// Encodes `value` as Synapse would.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, JsonError> {
    let mut out = Vec::with_capacity(128);
    to_writer(&mut out, value)?;
    Ok(out)
}

/// Encodes `value` as Synapse would, into `writer`.
pub fn to_writer<W: io::Write, T: Serialize + ?Sized>(
    writer: W,
    value: &T,
) -> Result<(), JsonError> {
    let mut serializer = serde_json::Serializer::with_formatter(writer, SynapseFormatter);
    Ok(value.serialize(&mut serializer)?)
}

/// `text` with the sign of every integer `-0` dropped: serde_json reads `-0`
/// as the float `-0.0`, which would be written back as `-0.0` where Python,
/// reading the integer 0, writes `0`.
pub(crate) fn without_negative_zero(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let mut zeros = Vec::new();
    let mut in_string = false;
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'\\' if in_string => index += 1,
            b'"' => in_string = !in_string,
            b'-' if !in_string
                && bytes.get(index + 1) == Some(&b'0')
                && !matches!(bytes.get(index + 2), Some(b'0'..=b'9' | b'.' | b'e' | b'E'))
                && !matches!(index.checked_sub(1).map(|i| bytes[i]), Some(b'e' | b'E')) =>
            {
                zeros.push(index);
            }
            _ => {}
        }
        index += 1;
    }
    if zeros.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut fixed = String::with_capacity(text.len());
    let mut from = 0;
    for zero in zeros {
        fixed.push_str(&text[from..zero]);
        from = zero + 1;
    }
    fixed.push_str(&text[from..]);
    Cow::Owned(fixed)
}

/// Refuses floats that stand for integers beyond 64 bits: serde_json reads
/// them as `f64`, so writing them back would change their text.
pub(crate) fn check_exact_numbers(value: &serde_json::Value) -> Result<(), JsonError> {
    match value {
        serde_json::Value::Number(number) => match number.as_f64() {
            Some(float) if number.is_f64() && float.fract() == 0.0 && float.abs() >= 9.2e18 => {
                Err(JsonError::InexactNumber(float))
            }
            _ => Ok(()),
        },
        serde_json::Value::Array(items) => items.iter().try_for_each(check_exact_numbers),
        serde_json::Value::Object(map) => map.values().try_for_each(check_exact_numbers),
        _ => Ok(()),
    }
}

/// A serde_json [`Formatter`] that writes JSON the way Python's `json` module
/// does with Synapse's settings.
///
/// ```
/// use synapse_replication::wire::json;
///
/// let text = json::to_vec(&("café 🎉", 1e16, 0.5, None::<u8>)).unwrap();
/// assert_eq!(text, br#"["caf\u00e9 \ud83c\udf89",1e+16,0.5,null]"#);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct SynapseFormatter;

impl Formatter for SynapseFormatter {
    fn write_f64<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        write_python_float(writer, value)
    }

    fn write_f32<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f32) -> io::Result<()> {
        write_python_float(writer, f64::from(value))
    }

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let bytes = fragment.as_bytes();
        let mut start = 0;
        for (index, ch) in fragment.char_indices() {
            if ch.is_ascii() && ch != '\u{7f}' {
                continue;
            }
            writer.write_all(&bytes[start..index])?;
            let mut units = [0u16; 2];
            for unit in ch.encode_utf16(&mut units) {
                write_u_escape(writer, *unit)?;
            }
            start = index + ch.len_utf8();
        }
        writer.write_all(&bytes[start..])
    }

    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        escape: CharEscape,
    ) -> io::Result<()> {
        // Python's ESCAPE_DCT: the same short forms as serde_json, and
        // `\u00XX` with lowercase hex for the other control characters.
        let short: &[u8] = match escape {
            CharEscape::Quote => b"\\\"",
            CharEscape::ReverseSolidus => b"\\\\",
            CharEscape::Solidus => b"/",
            CharEscape::Backspace => b"\\b",
            CharEscape::FormFeed => b"\\f",
            CharEscape::LineFeed => b"\\n",
            CharEscape::CarriageReturn => b"\\r",
            CharEscape::Tab => b"\\t",
            CharEscape::AsciiControl(byte) => return write_u_escape(writer, u16::from(byte)),
        };
        writer.write_all(short)
    }
}

/// Writes `value` as Synapse's `encode_canonical_json` does (the body of
/// every replication call its processes make): object keys sorted by code
/// point, compact, text as UTF-8 (only `"`, `\\` and control characters
/// escaped, as Python's `ensure_ascii=False`), floats as Python's `repr`.
pub(crate) fn to_canonical_string(value: &serde_json::Value) -> String {
    struct Sorted<'a>(&'a serde_json::Value);

    impl Serialize for Sorted<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            use serde::ser::{SerializeMap, SerializeSeq};
            match self.0 {
                serde_json::Value::Object(object) => {
                    // UTF-8 byte order is code point order, as Python sorts.
                    let mut entries: Vec<_> = object.iter().collect();
                    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                    let mut map = serializer.serialize_map(Some(entries.len()))?;
                    for (key, value) in entries {
                        map.serialize_entry(key, &Sorted(value))?;
                    }
                    map.end()
                }
                serde_json::Value::Array(items) => {
                    let mut seq = serializer.serialize_seq(Some(items.len()))?;
                    for item in items {
                        seq.serialize_element(&Sorted(item))?;
                    }
                    seq.end()
                }
                other => other.serialize(serializer),
            }
        }
    }

    struct CanonicalFormatter;

    impl Formatter for CanonicalFormatter {
        fn write_f64<W: ?Sized + io::Write>(
            &mut self,
            writer: &mut W,
            value: f64,
        ) -> io::Result<()> {
            write_python_float(writer, value)
        }

        fn write_char_escape<W: ?Sized + io::Write>(
            &mut self,
            writer: &mut W,
            escape: CharEscape,
        ) -> io::Result<()> {
            SynapseFormatter.write_char_escape(writer, escape)
        }
    }

    let mut out = Vec::with_capacity(128);
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, CanonicalFormatter);
    // A `Value` always serializes (its floats are finite, its keys strings),
    // and the text is UTF-8 as serde_json writes it.
    match Sorted(value).serialize(&mut serializer) {
        Ok(()) => String::from_utf8(out).unwrap_or_default(),
        Err(_) => String::new(),
    }
}

fn write_u_escape<W: ?Sized + io::Write>(writer: &mut W, unit: u16) -> io::Result<()> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = [
        b'\\',
        b'u',
        HEX[usize::from(unit >> 12)],
        HEX[usize::from((unit >> 8) & 0xf)],
        HEX[usize::from((unit >> 4) & 0xf)],
        HEX[usize::from(unit & 0xf)],
    ];
    writer.write_all(&digits)
}

/// Writes `value` as Python's `repr(float)`: the shortest digits that read
/// back to the same value, in fixed notation when the decimal exponent is in
/// `-4..16`, else as `d.ddde+XX`.
fn write_python_float<W: ?Sized + io::Write>(writer: &mut W, value: f64) -> io::Result<()> {
    // serde_json only hands finite floats to a formatter.
    // Rust's `{:e}` gives the same shortest round-trip digits as Python's
    // repr; only the layout differs.
    let scientific = format!("{:e}", value.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let point = exponent + 1; // digits are 0.DDD x 10^point
    let mut out = String::with_capacity(digits.len() + 8);
    if value.is_sign_negative() {
        out.push('-');
    }
    if !(-4 < point && point <= 16) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let sign = if exponent < 0 { '-' } else { '+' };
        out.push_str(&format!("e{sign}{:02}", exponent.abs()));
    } else if point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', point.unsigned_abs() as usize));
        out.push_str(&digits);
    } else {
        let point = point as usize;
        if point < digits.len() {
            out.push_str(&digits[..point]);
            out.push('.');
            out.push_str(&digits[point..]);
        } else {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', point - digits.len()));
            out.push_str(".0");
        }
    }
    writer.write_all(out.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float(value: f64) -> String {
        String::from_utf8(to_vec(&value).unwrap()).unwrap()
    }

    #[test]
    fn canonical_json_as_encode_canonical_json_writes_it() {
        // Python: encode_canonical_json({"b": 1, "a": {"z": [1.5e16, "é\n"], "y": None}})
        let value = serde_json::json!({"b": 1, "a": {"z": [1.5e16, "é\n\u{1}"], "y": null}});
        assert_eq!(
            to_canonical_string(&value),
            "{\"a\":{\"y\":null,\"z\":[1.5e+16,\"é\\n\\u0001\"]},\"b\":1}"
        );
    }

    #[test]
    fn floats_match_python_repr() {
        // Expected values are Python 3.11's repr() of the same floats.
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (1.5, "1.5"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e16, "1.5e+16"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (123456789.123, "123456789.123"),
            (1e22, "1e+22"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (-2.5e-7, "-2.5e-07"),
            (1234567890123456.7, "1234567890123456.8"),
            (12345678901234567.0, "1.2345678901234568e+16"),
        ];
        for (value, expected) in cases {
            assert_eq!(float(value), expected, "repr of {value:e}");
        }
    }

    #[test]
    fn non_finite_is_refused_when_reading() {
        for text in ["NaN", "[Infinity]", "-Infinity"] {
            assert!(validate(text.as_bytes()).is_err(), "{text}");
        }
        assert!(serde_json::Number::from_f64(f64::NAN).is_none());
    }

    #[test]
    fn lone_surrogates_read_as_replacement_characters() {
        let text = br#"["a\ud800b","\udfff","\ud83d\ude00","\\ud800"]"#;
        assert!(from_slice::<Vec<String>>(text).is_err());
        let read: Vec<String> = from_slice_lossy(text).unwrap();
        assert_eq!(read, ["a\u{fffd}b", "\u{fffd}", "😀", "\\ud800"]);
        let plain: Vec<String> = from_slice_lossy(br#"["\u00e9"]"#).unwrap();
        assert_eq!(plain, ["é"]);
    }

    #[test]
    fn strings_escape_like_python() {
        let text = to_vec("a\"b\\c/\n\r\t\u{8}\u{c}\u{1}\u{7f}é€😀").unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            r#""a\"b\\c/\n\r\t\b\f\u0001\u007f\u00e9\u20ac\ud83d\ude00""#
        );
    }

    #[test]
    fn validate_accepts_json_and_refuses_the_rest() {
        assert!(validate(br#"["a", {"b": [1, 2.5, null, true]}]"#).is_ok());
        assert!(
            validate(br#""\ud800""#).is_ok(),
            "lone surrogates pass, as in Python"
        );
        assert!(validate(b"[1] x").is_err());
        assert!(validate(b"[NaN]").is_err());
        assert!(validate(b"[1,\n2]").is_err());
        assert!(validate(b"").is_err());
        assert!(validate(b"[1e400]").is_ok(), "Python reads it as inf");
        let nested = |depth| [vec![b'['; depth], vec![b']'; depth]].concat();
        // Validation is iterative: deep nesting costs memory bounded by the
        // line, never stack.
        assert!(validate(&nested(100_000)).is_ok());
        assert!(
            from_slice::<serde_json::Value>(&nested(129)).is_err(),
            "parsing is bounded"
        );
        assert!(
            validate(b"\"\x01\"").is_err(),
            "raw control characters are refused"
        );
    }
}
