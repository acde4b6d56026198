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
//!
//! It is written for compact JSON, which is all Synapse writes: each step
//! first tries the byte compact JSON has there, and only then skips
//! whitespace. Strings and digits are skipped eight bytes at a time.

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
#[inline(always)]
pub(crate) fn validate_with(bytes: &[u8], newline_ok: bool) -> Result<(), Invalid> {
    let non_ascii = if newline_ok {
        Recogniser::<true> { bytes }.run()?
    } else {
        Recogniser::<false> { bytes }.run()?
    };
    // Outside strings only ASCII is valid JSON, and the recogniser saw
    // every byte inside strings: unless one was not ASCII, the text is
    // ASCII. Otherwise UTF-8 is checked once for the whole text, which
    // covers every string in it.
    if non_ascii {
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

/// As [`bytes_below`], for the bytes that end a run of plain string bytes:
/// `"`, `\` and control characters. Flipping bit 1 maps `"` (0x22) to 0x20
/// and control characters onto control characters, so one comparison finds
/// both.
const fn string_specials(word: u64) -> u64 {
    bytes_below(word ^ (ONES * 0x02), 0x21) | bytes_equal(word, b'\\')
}

/// [`string_specials`], non-ASCII bytes included: the fast path, for the
/// ASCII text that Synapse writes. (Without the non-ASCII bytes, no byte
/// can borrow but those it flags.)
pub(crate) const fn ascii_string_specials(word: u64) -> u64 {
    ((word ^ (ONES * 0x02)).wrapping_sub(ONES * 0x21)
        | (word ^ (ONES * b'\\' as u64)).wrapping_sub(ONES)
        | word)
        & HIGHS
}

/// As [`bytes_below`], for bytes that are not ASCII digits: below `0`, or
/// with the high bit set once 0x46 is added (above `9`) or before.
const fn non_digits(word: u64) -> u64 {
    bytes_below(word, b'0') | ((word.wrapping_add(ONES * 0x46) | word) & HIGHS)
}

#[cold]
#[inline(never)]
fn fail<T>(at: usize, problem: &'static str) -> Result<T, Invalid> {
    Err(Invalid { at, problem })
}

/// [`Recogniser::tail_word`] for a text of fewer than eight bytes: `rest`
/// as a little-endian word, zero-padded.
#[cold]
#[inline(never)]
fn short_word(rest: &[u8]) -> u64 {
    let mut word = [0; 8];
    for (to, from) in word.iter_mut().zip(rest) {
        *to = *from;
    }
    u64::from_le_bytes(word)
}

/// The recogniser: the cursor is an offset into `bytes`, kept in a local.
struct Recogniser<'a, const NEWLINE_OK: bool> {
    bytes: &'a [u8],
}

/// The open containers: one bit each (set for an object, clear for an
/// array) above a sentinel bit, innermost lowest; every 63 levels spill to
/// the heap. A plain word, so that it lives in a register.
#[derive(Clone, Copy)]
struct Nesting(u64);

impl Nesting {
    const EMPTY: Nesting = Nesting(1);

    #[inline(always)]
    fn push(&mut self, object: bool, spill: &mut Vec<u64>) {
        if self.0 >> 63 != 0 {
            spill.push(self.0);
            *self = Self::EMPTY;
        }
        self.0 = (self.0 << 1) | u64::from(object);
    }

    /// Pops the innermost container; true if it was the outermost.
    #[inline(always)]
    fn pop(&mut self, spill: &mut Vec<u64>) -> bool {
        self.0 >>= 1;
        if self.0 == Self::EMPTY.0 {
            match spill.pop() {
                Some(bits) => self.0 = bits,
                None => return true,
            }
        }
        false
    }

    fn in_object(self) -> bool {
        self.0 & 1 == 1
    }

    /// The byte that closes the innermost container: `]` (0x5d) or `}`
    /// (0x7d).
    fn closer(self) -> u8 {
        b']' + 0x20 * (self.0 & 1) as u8
    }
}

impl<const NEWLINE_OK: bool> Recogniser<'_, NEWLINE_OK> {
    #[inline(always)]
    fn byte(&self, at: usize) -> Option<u8> {
        self.bytes.get(at).copied()
    }

    fn is_whitespace(byte: u8) -> bool {
        byte == b' ' || byte == b'\t' || byte == b'\r' || (NEWLINE_OK && byte == b'\n')
    }

    fn skip_whitespace(&self, mut at: usize) -> usize {
        while let Some(byte) = self.byte(at) {
            if !Self::is_whitespace(byte) {
                break;
            }
            at += 1;
        }
        at
    }

    /// The eight bytes from `at` as a little-endian word; bytes past the
    /// end read as zero (a control character and not a digit, so scans stop
    /// there).
    #[inline(always)]
    fn word(&self, at: usize) -> u64 {
        if let Some(chunk) = self.bytes.get(at..).and_then(<[u8]>::first_chunk::<8>) {
            return u64::from_le_bytes(*chunk);
        }
        self.tail_word(at)
    }

    /// [`Recogniser::word`] less than eight bytes from the end.
    #[inline(always)]
    fn tail_word(&self, at: usize) -> u64 {
        let rest = self.bytes.len().saturating_sub(at);
        match self.bytes.last_chunk::<8>() {
            // Load the text's last eight bytes and shift out those before
            // `at`.
            Some(last) => u64::from_le_bytes(*last)
                .checked_shr(8 * (8 - rest as u32))
                .unwrap_or(0),
            None => short_word(self.bytes.get(at..).unwrap_or_default()),
        }
    }

    /// Recognises the text; returns whether any string held a non-ASCII
    /// byte.
    fn run(&self) -> Result<bool, Invalid> {
        let mut non_ascii = false;
        let mut at = self.skip_whitespace(0);
        if !matches!(self.byte(at), Some(b'[' | b'{')) {
            return self.scalar(at);
        }
        let mut nesting = Nesting::EMPTY;
        let mut spill = Vec::new();
        'value: loop {
            // A value is expected at `at`. An if-chain in order of
            // frequency in rows.
            let Some(byte) = self.byte(at) else {
                return fail(at, "expected a value");
            };
            if byte == b'"' {
                at = self.string(at + 1, &mut non_ascii)?;
            } else if byte == b'n' {
                at = self.literal(at, b"null")?;
            } else if byte.is_ascii_digit() || byte == b'-' {
                at = self.number(at)?;
            } else if byte == b'[' {
                nesting.push(false, &mut spill);
                at = self.skip_whitespace(at + 1);
                if self.byte(at) != Some(b']') {
                    continue 'value;
                }
                // An empty array: the loop below closes it.
            } else if byte == b'{' {
                nesting.push(true, &mut spill);
                at = self.skip_whitespace(at + 1);
                match self.byte(at) {
                    Some(b'"') => {
                        at = self.key(at + 1, &mut non_ascii)?;
                        continue 'value;
                    }
                    // An empty object: the loop below closes it.
                    Some(b'}') => {}
                    _ => return fail(at, "expected a string key or `}`"),
                }
            } else if byte == b'f' {
                at = self.literal(at, b"false")?;
            } else if byte == b't' {
                at = self.literal(at, b"true")?;
            } else if Self::is_whitespace(byte) {
                at = self.skip_whitespace(at + 1);
                continue 'value;
            } else {
                return fail(at, "expected a value");
            }
            // A value ended: close containers until one wants another value.
            loop {
                let Some(byte) = self.byte(at) else {
                    return fail(at, "expected `,` or the end of the container");
                };
                if byte == b',' {
                    at += 1;
                    if nesting.in_object() {
                        at = self.skip_whitespace(at);
                        if self.byte(at) != Some(b'"') {
                            return fail(at, "expected a string key");
                        }
                        at = self.key(at + 1, &mut non_ascii)?;
                    }
                    continue 'value;
                }
                if byte == nesting.closer() {
                    at += 1;
                    if nesting.pop(&mut spill) {
                        self.end(at)?;
                        return Ok(non_ascii);
                    }
                } else if Self::is_whitespace(byte) {
                    at = self.skip_whitespace(at + 1);
                } else {
                    return fail(at, "expected `,` or the end of the container");
                }
            }
        }
    }

    /// A whole text that is not an array or object: [`Recogniser::run`]
    /// for it.
    #[inline(never)]
    fn scalar(&self, at: usize) -> Result<bool, Invalid> {
        let mut non_ascii = false;
        let at = match self.byte(at) {
            Some(b'"') => self.string(at + 1, &mut non_ascii)?,
            Some(b'n') => self.literal(at, b"null")?,
            Some(b'0'..=b'9' | b'-') => self.number(at)?,
            Some(b'f') => self.literal(at, b"false")?,
            Some(b't') => self.literal(at, b"true")?,
            _ => return fail(at, "expected a value"),
        };
        self.end(at)?;
        Ok(non_ascii)
    }

    /// The end of the text: only whitespace may follow the value.
    fn end(&self, at: usize) -> Result<(), Invalid> {
        let at = self.skip_whitespace(at);
        if at == self.bytes.len() {
            Ok(())
        } else {
            fail(at, "trailing characters")
        }
    }

    /// A key and its colon; `at` follows the key's opening quote. Returns
    /// the offset after the colon.
    #[inline(always)]
    fn key(&self, at: usize, non_ascii: &mut bool) -> Result<usize, Invalid> {
        let mut at = self.string(at, non_ascii)?;
        if self.byte(at) != Some(b':') {
            at = self.skip_whitespace(at);
            if self.byte(at) != Some(b':') {
                return fail(at, "expected `:`");
            }
        }
        Ok(at + 1)
    }

    /// The rest of a string; `at` follows its opening quote. Returns the
    /// offset after its closing quote.
    ///
    /// Its fast loop stops at non-ASCII bytes too: Synapse writes ASCII
    /// only (`\uXXXX` escapes), so the test is one operation shorter, and
    /// the first non-ASCII byte sends the rest of its string to
    /// [`Recogniser::non_ascii_string`].
    #[inline(always)]
    fn string(&self, mut at: usize, non_ascii: &mut bool) -> Result<usize, Invalid> {
        loop {
            // Skip eight plain ASCII bytes at a time: no quote, backslash,
            // control character or non-ASCII byte.
            let Some(mut rest) = self.bytes.get(at..) else {
                return fail(at, "unterminated string");
            };
            let (word, special) = loop {
                match rest.split_first_chunk::<8>() {
                    Some((chunk, tail)) => {
                        let word = u64::from_le_bytes(*chunk);
                        let special = ascii_string_specials(word);
                        if special != 0 {
                            break (word, special);
                        }
                        rest = tail;
                    }
                    None => {
                        let word = self.tail_word(self.bytes.len() - rest.len());
                        break (word, ascii_string_specials(word));
                    }
                }
            };
            // Jump to the first special byte, which the word holds.
            let shift = special.trailing_zeros() & !7;
            at = self.bytes.len() - rest.len() + shift as usize / 8;
            let byte = (word >> shift) as u8;
            if byte == b'"' {
                return Ok(at + 1);
            }
            at = self.string_special(at, byte, non_ascii)?;
        }
    }

    /// A special byte at `at` in a string, other than its closing quote: an
    /// escape, a non-ASCII byte, or an error. Returns the offset to go on
    /// scanning from.
    #[inline(never)]
    fn string_special(&self, at: usize, byte: u8, non_ascii: &mut bool) -> Result<usize, Invalid> {
        match byte {
            b'\\' => self.escape(at),
            0x80.. => {
                *non_ascii = true;
                // The rest of this string is scanned by a loop that takes
                // non-ASCII bytes as plain; going on from its closing quote
                // ends the string at once.
                self.non_ascii_string(at).map(|end| end - 1)
            }
            _ if at < self.bytes.len() => fail(at, "control character in string"),
            _ => fail(at, "unterminated string"),
        }
    }

    /// [`Recogniser::string`] from its first non-ASCII byte on: non-ASCII
    /// bytes are plain here, UTF-8 being checked once for the whole text,
    /// at the end.
    #[inline(never)]
    fn non_ascii_string(&self, mut at: usize) -> Result<usize, Invalid> {
        loop {
            let word = self.word(at);
            let special = string_specials(word);
            if special == 0 {
                at += 8;
                continue;
            }
            let shift = special.trailing_zeros() & !7;
            at += shift as usize / 8;
            match (word >> shift) as u8 {
                b'"' => return Ok(at + 1),
                b'\\' => at = self.escape(at)?,
                _ if at < self.bytes.len() => return fail(at, "control character in string"),
                _ => return fail(at, "unterminated string"),
            }
        }
    }

    /// An escape; `at` is on its backslash. Returns the offset after it.
    fn escape(&self, at: usize) -> Result<usize, Invalid> {
        let at = at + 1;
        match self.byte(at) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(at + 1),
            Some(b'u') => {
                let hex = self.bytes.get(at + 1..at + 5);
                if !hex.is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)) {
                    return fail(at, "invalid \\u escape");
                }
                // Any code unit, lone surrogates included, as Python accepts.
                Ok(at + 5)
            }
            _ => fail(at, "invalid escape"),
        }
    }

    /// Skips ASCII digits from `at`, eight at a time.
    #[inline(always)]
    fn digits(&self, mut at: usize) -> usize {
        loop {
            let others = non_digits(self.word(at));
            if others != 0 {
                return at + others.trailing_zeros() as usize / 8;
            }
            at += 8;
        }
    }

    /// A number; `at` is on its first byte. Returns the offset after it.
    #[inline(always)]
    fn number(&self, mut at: usize) -> Result<usize, Invalid> {
        if self.byte(at) == Some(b'-') {
            at += 1;
        }
        match self.byte(at) {
            Some(b'0') => {
                at += 1;
                if let Some(b'0'..=b'9') = self.byte(at) {
                    return fail(at, "leading zero in number");
                }
            }
            Some(b'1'..=b'9') => {
                let start = at;
                at = self.digits(at + 1);
                if at - start > PYTHON_INT_MAX_DIGITS
                    && !matches!(self.byte(at), Some(b'.' | b'e' | b'E'))
                {
                    return fail(start, "integer longer than Python's 4300-digit limit");
                }
            }
            _ => return fail(at, "invalid number"),
        }
        if self.byte(at) == Some(b'.') {
            let start = at + 1;
            at = self.digits(start);
            if at == start {
                return fail(at, "invalid number");
            }
        }
        if let Some(b'e' | b'E') = self.byte(at) {
            at += 1;
            if let Some(b'+' | b'-') = self.byte(at) {
                at += 1;
            }
            let start = at;
            at = self.digits(start);
            if at == start {
                return fail(at, "invalid number");
            }
        }
        Ok(at)
    }

    /// The literal `word`; `at` is on its first byte. Returns the offset
    /// after it.
    #[inline(always)]
    fn literal(&self, at: usize, word: &'static [u8]) -> Result<usize, Invalid> {
        match self.bytes.get(at..) {
            Some(rest) if rest.starts_with(word) => Ok(at + word.len()),
            _ => fail(at, "invalid literal"),
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
