//! A JSON recogniser: says whether bytes are one valid JSON value, without
//! building anything.
//!
//! serde_json stays the parser for values; this exists because validating
//! every row at line rate is the decoder's hot path, and serde_json's
//! `IgnoredAny` runs at a third of the speed needed (see `benches/decode.rs`).
//! It accepts exactly what `serde_json::from_slice::<IgnoredAny>` accepts on
//! valid UTF-8 (property-tested and fuzzed against serde_json), but for
//! integers of more than 4300 digits, which Python refuses; so lone
//! surrogate escapes and huge numbers pass as in Python. It is iterative:
//! nesting depth costs one bit per level, never stack.

/// Why bytes are not one JSON value. Positions are byte offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Invalid {
    pub(crate) at: usize,
    pub(crate) problem: &'static str,
}

/// Checks that `bytes` are valid UTF-8 holding exactly one JSON value,
/// optionally surrounded by JSON whitespace.
#[cfg(test)]
pub(crate) fn validate(bytes: &[u8]) -> Result<(), Invalid> {
    validate_with(bytes, true)
}

/// [`validate`], refusing `\n` even as whitespace when `newline_ok` is false
/// (a row inside a wire line cannot hold one).
pub(crate) fn validate_with(bytes: &[u8], newline_ok: bool) -> Result<(), Invalid> {
    let mut recogniser = Recogniser {
        bytes,
        at: 0,
        newline_ok,
    };
    recogniser.run()?;
    // Outside strings only ASCII is valid JSON, so checking UTF-8 once for
    // the whole text covers every string in it; the word-at-a-time ASCII
    // check settles the common case.
    if !bytes.is_ascii() {
        if let Err(error) = std::str::from_utf8(bytes) {
            return Err(Invalid {
                at: error.valid_up_to(),
                problem: "invalid UTF-8",
            });
        }
    }
    Ok(())
}

/// Python refuses to read integers of more digits (`sys.int_info`), so
/// Synapse refuses rows holding one; so does this recogniser, the one place
/// it is stricter than serde_json.
const PYTHON_INT_MAX_DIGITS: usize = 4300;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// A mask whose lowest set bit is the high bit of the first byte of `word`
/// (little-endian) below `n` (n <= 128); zero if there is none. Bits above
/// the lowest may be spurious (borrows), so only the lowest is used.
const fn bytes_below(word: u64, n: u8) -> u64 {
    word.wrapping_sub(ONES * n as u64) & !word & HIGHS
}

/// As [`bytes_below`], for bytes equal to `byte`.
const fn bytes_equal(word: u64, byte: u8) -> u64 {
    bytes_below(word ^ (ONES * byte as u64), 1)
}

struct Recogniser<'a> {
    bytes: &'a [u8],
    at: usize,
    newline_ok: bool,
}

/// One bit per open container: set for an object, clear for an array.
struct Nesting {
    inline: u64,
    spill: Vec<u64>,
    depth: usize,
}

impl Nesting {
    fn push(&mut self, object: bool) {
        if self.depth > 0 && self.depth % 64 == 0 {
            self.spill.push(self.inline);
            self.inline = 0;
        }
        self.inline = (self.inline << 1) | u64::from(object);
        self.depth += 1;
    }

    /// Pops the innermost container; true if it was an object.
    fn pop(&mut self) -> bool {
        let object = self.inline & 1 == 1;
        self.inline >>= 1;
        self.depth -= 1;
        if self.depth > 0 && self.depth % 64 == 0 {
            self.inline = self.spill.pop().unwrap_or(0);
        }
        object
    }

    fn in_object(&self) -> bool {
        self.inline & 1 == 1
    }
}

impl Recogniser<'_> {
    fn fail<T>(&self, problem: &'static str) -> Result<T, Invalid> {
        Err(Invalid {
            at: self.at,
            problem,
        })
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) -> Option<u8> {
        while let Some(byte) = self.peek() {
            // Compact JSON (all Synapse writes) has no whitespace: one
            // comparison settles it.
            if byte > b' ' {
                return Some(byte);
            }
            let whitespace = byte == b' '
                || byte == b'\t'
                || byte == b'\r'
                || (byte == b'\n' && self.newline_ok);
            if !whitespace {
                return Some(byte);
            }
            self.at += 1;
        }
        None
    }

    fn run(&mut self) -> Result<(), Invalid> {
        let mut nesting = Nesting {
            inline: 0,
            spill: Vec::new(),
            depth: 0,
        };
        'value: loop {
            // A value is expected here. An if-chain in order of frequency
            // in rows, rather than a match: a jump table's indirect branch
            // mispredicts on every value.
            let Some(byte) = self.skip_whitespace() else {
                return self.fail("expected a value");
            };
            if byte == b'"' {
                self.string()?;
            } else if byte == b'n' {
                self.literal(b"null")?;
            } else if byte.is_ascii_digit() || byte == b'-' {
                self.number()?;
            } else if byte == b'[' {
                self.at += 1;
                if self.skip_whitespace() == Some(b']') {
                    self.at += 1;
                } else {
                    nesting.push(false);
                    continue 'value;
                }
            } else if byte == b'{' {
                self.at += 1;
                match self.skip_whitespace() {
                    Some(b'}') => self.at += 1,
                    Some(b'"') => {
                        nesting.push(true);
                        self.key()?;
                        continue 'value;
                    }
                    _ => return self.fail("expected a string key or `}`"),
                }
            } else if byte == b'f' {
                self.literal(b"false")?;
            } else if byte == b't' {
                self.literal(b"true")?;
            } else {
                return self.fail("expected a value");
            }
            // A value ended: close containers until one wants another value.
            loop {
                if nesting.depth == 0 {
                    return match self.skip_whitespace() {
                        None => Ok(()),
                        Some(_) => self.fail("trailing characters"),
                    };
                }
                let object = nesting.in_object();
                match self.skip_whitespace() {
                    Some(b',') => {
                        self.at += 1;
                        if object {
                            if self.skip_whitespace() != Some(b'"') {
                                return self.fail("expected a string key");
                            }
                            self.key()?;
                        }
                        continue 'value;
                    }
                    Some(b']') if !object => {
                        self.at += 1;
                        nesting.pop();
                    }
                    Some(b'}') if object => {
                        self.at += 1;
                        nesting.pop();
                    }
                    _ => return self.fail("expected `,` or the end of the container"),
                }
            }
        }
    }

    /// A key and its colon; the cursor is on the key's opening quote.
    fn key(&mut self) -> Result<(), Invalid> {
        self.string()?;
        if self.skip_whitespace() != Some(b':') {
            return self.fail("expected `:`");
        }
        self.at += 1;
        Ok(())
    }

    /// A string; the cursor is on its opening quote.
    #[inline(always)]
    fn string(&mut self) -> Result<(), Invalid> {
        self.at += 1;
        loop {
            // Skip eight plain bytes at a time: no quote, backslash or
            // control character. Non-ASCII bytes are plain here; UTF-8 is
            // checked once for the whole text, at the end.
            while let Some(chunk) = self.bytes.get(self.at..self.at + 8) {
                let mut word = [0u8; 8];
                word.copy_from_slice(chunk);
                let word = u64::from_le_bytes(word);
                let special =
                    bytes_equal(word, b'"') | bytes_equal(word, b'\\') | bytes_below(word, 0x20);
                if special != 0 {
                    // Jump to the first special byte.
                    self.at += special.trailing_zeros() as usize / 8;
                    break;
                }
                self.at += 8;
            }
            let Some(&byte) = self.bytes.get(self.at) else {
                return self.fail("unterminated string");
            };
            match byte {
                b'"' => {
                    self.at += 1;
                    return Ok(());
                }
                b'\\' => self.escape()?,
                0..0x20 => return self.fail("control character in string"),
                _ => self.at += 1,
            }
        }
    }

    /// An escape; the cursor is on its backslash.
    fn escape(&mut self) -> Result<(), Invalid> {
        self.at += 1;
        match self.peek() {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.at += 1,
            Some(b'u') => {
                let hex = self.bytes.get(self.at + 1..self.at + 5);
                if !hex.is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)) {
                    return self.fail("invalid \\u escape");
                }
                // Any code unit, lone surrogates included, as Python accepts.
                self.at += 5;
            }
            _ => return self.fail("invalid escape"),
        }
        Ok(())
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
        self.at - start
    }

    fn number(&mut self) -> Result<(), Invalid> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.at += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return self.fail("leading zero in number");
                }
            }
            Some(b'1'..=b'9') => {
                let start = self.at;
                if self.digits() > PYTHON_INT_MAX_DIGITS
                    && !matches!(self.peek(), Some(b'.' | b'e' | b'E'))
                {
                    self.at = start;
                    return self.fail("integer longer than Python's 4300-digit limit");
                }
            }
            _ => return self.fail("invalid number"),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return self.fail("invalid number");
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if self.digits() == 0 {
                return self.fail("invalid number");
            }
        }
        Ok(())
    }

    fn literal(&mut self, word: &'static [u8]) -> Result<(), Invalid> {
        if self.bytes[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(())
        } else {
            self.fail("invalid literal")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::validate;
    use proptest::prelude::*;
    use serde::de::IgnoredAny;

    fn oracle(bytes: &[u8]) -> bool {
        std::str::from_utf8(bytes).is_ok() && serde_json::from_slice::<IgnoredAny>(bytes).is_ok()
    }

    #[test]
    fn agrees_with_serde_json_on_edge_cases() {
        let cases: &[&[u8]] = &[
            b"",
            b" ",
            b"[]",
            b"{}",
            b"[ ]",
            b"{ }",
            b"[1,]",
            b"{\"a\":1,}",
            b"[,1]",
            b"{,}",
            b"0",
            b"-0",
            b"01",
            b"-01",
            b"1.",
            b".5",
            b"1e",
            b"1e+",
            b"1E-2",
            b"-",
            b"--1",
            b"1.5e300",
            b"1e400",
            b"true",
            b"tru",
            b"truex",
            b"nul",
            b"null ",
            b" null",
            b"\"\\ud800\"",
            b"\"\\u12\"",
            b"\"\\uzzzz\"",
            b"\"\\x\"",
            b"\"\x01\"",
            b"\"\x7f\"",
            b"\"caf\xc3\xa9\"",
            b"\"\xff\"",
            b"\xc3\xa9",
            b"[1] x",
            b"[1]\n",
            b"\t[1]\r\n",
            b"{\"a\" : [1, {\"b\": null}] }",
            b"{\"a\"}",
            b"{\"a\":}",
            b"{1:2}",
            b"[\"a\":1]",
            b"[1 2]",
            b"{\"a\":1 \"b\":2}",
            b"\"unterminated",
            b"[",
            b"]",
            b"}",
            b"[[[]]]",
            b"[[[]]",
            b"{\"a\":{\"b\":{}}}}",
            b"NaN",
            b"Infinity",
            b"-Infinity",
            b"\"\\\"\"",
        ];
        for case in cases {
            assert_eq!(
                validate(case).is_ok(),
                oracle(case),
                "disagreement on {:?}",
                String::from_utf8_lossy(case)
            );
        }
    }

    #[test]
    fn integers_longer_than_python_reads_are_refused() {
        let digits = |n| "9".repeat(n);
        assert!(validate(digits(4300).as_bytes()).is_ok());
        assert!(validate(format!("[-{}]", digits(4300)).as_bytes()).is_ok());
        assert!(validate(digits(4301).as_bytes()).is_err());
        assert!(validate(format!("[-{}]", digits(4301)).as_bytes()).is_err());
        // Floats have no such limit in Python.
        assert!(validate(format!("{}.5", digits(5000)).as_bytes()).is_ok());
        assert!(validate(format!("{}e3", digits(5000)).as_bytes()).is_ok());
    }

    #[test]
    fn deep_nesting_uses_no_stack() {
        for depth in [63, 64, 65, 127, 128, 129, 100_000] {
            let mut text = Vec::new();
            for level in 0..depth {
                text.extend_from_slice(if level % 3 == 0 { b"{\"k\":" } else { b"[" });
            }
            text.push(b'0');
            for level in (0..depth).rev() {
                text.push(if level % 3 == 0 { b'}' } else { b']' });
            }
            assert!(validate(&text).is_ok(), "depth {depth}");
            text.pop();
            assert!(validate(&text).is_err(), "unbalanced at depth {depth}");
        }
    }

    /// JSON-like text: tokens that make valid JSON often, and broken JSON
    /// near the valid ones.
    fn jsonish() -> impl Strategy<Value = Vec<u8>> {
        let token = prop::sample::select(vec![
            "[",
            "]",
            "{",
            "}",
            ",",
            ":",
            " ",
            "\"",
            "\"a\"",
            "\"\\u00e9\"",
            "\"\\ud800\"",
            "\\",
            "\\u",
            "0",
            "1",
            "-",
            ".",
            "e",
            "+",
            "12.5e-3",
            "true",
            "false",
            "null",
            "é",
            "\n",
            "\u{1}",
            "x",
        ]);
        prop::collection::vec(token, 0..24).prop_map(|tokens| tokens.concat().into_bytes())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn agrees_with_serde_json_on_jsonish_text(text in jsonish()) {
            prop_assert_eq!(validate(&text).is_ok(), oracle(&text));
        }

        #[test]
        fn agrees_with_serde_json_on_any_bytes(text in prop::collection::vec(any::<u8>(), 0..32)) {
            prop_assert_eq!(validate(&text).is_ok(), oracle(&text));
        }

        #[test]
        fn accepts_whatever_serde_json_writes(value in arbitrary_value()) {
            let text = serde_json::to_vec(&value).unwrap();
            prop_assert!(validate(&text).is_ok());
        }
    }

    fn arbitrary_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            ".*".prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::vec((".*", inner), 0..8)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }
}
