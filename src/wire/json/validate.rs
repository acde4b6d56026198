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
//! whitespace. Strings and digits are skipped eight bytes at a time, by a
//! loop whose one test a word compares the offset with the last word's;
//! literals are compared as one word where a word is left. And for ASCII,
//! which is all Synapse writes too (`\uXXXX` escapes), nested less than 64
//! levels deep, longer than a word: other text is recognised (again) by a
//! general variant.
//!
//! Not sixteen bytes at a time: SSE2's intrinsics need `unsafe` outside a
//! `#[target_feature]` function, and the block test LLVM vectorises from
//! safe code (compare, `pmovmskb`) leaves the first special byte to be
//! found a word at a time; strings in rows, some 20 bytes, lose more there
//! than the blocks save.

use std::num::NonZeroU64;

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
    // Rows are longer than a word. Shorter texts go to the general
    // recogniser, so that in the fast one the word loops know that the
    // text holds a word and need not test it per string.
    if bytes.len() < 8 {
        return validate_general(bytes, newline_ok);
    }
    let fast = if newline_ok {
        Recogniser::<true, true> { bytes }.run()
    } else {
        Recogniser::<false, true> { bytes }.run()
    };
    match fast {
        // Outside strings only ASCII is valid JSON, and the recogniser saw
        // every byte inside strings: the text is ASCII, valid UTF-8.
        Ok(()) => Ok(()),
        Err(stop) if stop == RETRY => validate_general(bytes, newline_ok),
        Err(invalid) => Err(invalid),
    }
}

/// [`validate_with`] for a text shorter than a word, or one the fast
/// recogniser stopped at (a non-ASCII byte in a string, or nesting deeper
/// than 63 levels): recognised (again) from the start by the general one; then, since strings may hold
/// non-ASCII bytes, UTF-8 is checked once for the whole text, which covers
/// every string in it.
fn validate_general(bytes: &[u8], newline_ok: bool) -> Result<(), Invalid> {
    if newline_ok {
        Recogniser::<true, false> { bytes }.run()?;
    } else {
        Recogniser::<false, false> { bytes }.run()?;
    }
    if let Err(error) = std::str::from_utf8(bytes) {
        return Err(Invalid {
            at: error.valid_up_to(),
            problem: "invalid UTF-8",
        });
    }
    Ok(())
}

/// Not an error: what the fast recogniser returns for a text it leaves to
/// the general one. (No text has a byte at offset `usize::MAX`.)
const RETRY: Invalid = Invalid {
    at: usize::MAX,
    problem: "not for the fast recogniser",
};

/// Python refuses to read integers of more digits (`sys.int_info`), so
/// Synapse refuses rows holding one; so does this recogniser, the one place
/// it is stricter than serde_json.
const PYTHON_INT_MAX_DIGITS: usize = 4300;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;
/// The high bit of a word's last byte (little-endian).
const LAST_BYTE: NonZeroU64 = NonZeroU64::new(1 << 63).unwrap();

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
/// ASCII text that Synapse writes. No byte but a flagged one can borrow,
/// and the two subtractions flag every non-ASCII byte between them (the
/// backslash test leaves one, 0xdc, at 0x7f; the quote test flags it): two
/// operations fewer than testing for them apart.
pub(crate) const fn ascii_string_specials(word: u64) -> u64 {
    ((word ^ (ONES * 0x02)).wrapping_sub(ONES * 0x21)
        | (word ^ (ONES * b'\\' as u64)).wrapping_sub(ONES))
        & HIGHS
}

/// As [`bytes_below`], for bytes that are not ASCII digits: below `0`
/// (the subtraction borrows), or above `9` (0x46 added sets the high bit,
/// for 0x3a to 0xb9; the bytes above, the subtraction flags). Digits
/// neither borrow nor carry, so the lowest flag is exact.
const fn non_digits(word: u64) -> u64 {
    (word.wrapping_sub(ONES * b'0' as u64) | word.wrapping_add(ONES * 0x46)) & HIGHS
}

fn fail<T>(at: usize, problem: &'static str) -> Result<T, Invalid> {
    Err(Invalid { at, problem })
}

/// `word` (at most eight bytes) as a little-endian word, zero-padded.
const fn literal_word(word: &[u8]) -> u64 {
    let mut bits = 0;
    let mut index = word.len();
    while index > 0 {
        index -= 1;
        bits = (bits << 8) | word[index] as u64;
    }
    bits
}

/// [`fail`] where a value ended.
fn fail_after_value<T>(at: usize) -> Result<T, Invalid> {
    fail(at, "expected `,` or the end of the container")
}

/// The eight bytes of `bytes` from `at` as a little-endian word, `at` being
/// less than eight bytes from the end; bytes past the end read as zero.
fn tail_word(bytes: &[u8], at: usize) -> u64 {
    // Callers are within eight bytes of the end; `& 7` keeps the shifts
    // below in range whatever they pass.
    debug_assert!(at <= bytes.len() && bytes.len() - at < 8);
    let rest = bytes.len().wrapping_sub(at) & 7;
    match bytes.last_chunk::<8>() {
        // Load the text's last eight bytes and shift out those before
        // `at`: at least one, so two shifts, neither of 64 bits.
        Some(last) => (u64::from_le_bytes(*last) >> 8) >> (8 * (7 - rest as u32)),
        None => short_word(bytes.get(at..).unwrap_or_default()),
    }
}

/// [`tail_word`] for a text of fewer than eight bytes: `rest`
/// as a little-endian word, zero-padded.
fn short_word(rest: &[u8]) -> u64 {
    let mut word = [0; 8];
    for (to, from) in word.iter_mut().zip(rest) {
        *to = *from;
    }
    u64::from_le_bytes(word)
}

/// The recogniser: the cursor is an offset into `bytes`, kept in a local.
///
/// The `FAST` one is for what Synapse writes, ASCII (`\uXXXX` escapes) and
/// shallow: it stops with [`RETRY`] at a non-ASCII byte in a string, or at
/// a 64th level of nesting. So its string loop tests one operation less,
/// it needs no flag for whether UTF-8 must be checked, and its nesting is
/// one word, with no spill vector to keep; which leaves the registers its
/// loops need. The general one takes non-ASCII bytes in strings as plain,
/// and spills nesting to the heap.
struct Recogniser<'a, const NEWLINE_OK: bool, const FAST: bool> {
    bytes: &'a [u8],
}

/// The open containers: one bit each (set for an object, clear for an
/// array) above a sentinel bit, innermost lowest; every 63 levels spill to
/// the heap (the fast recogniser stops instead). A plain word, so that it
/// lives in a register.
#[derive(Clone, Copy)]
struct Nesting(u64);

impl Nesting {
    const EMPTY: Nesting = Nesting(1);

    /// Pushes a container; false if the fast recogniser would need more
    /// than one word.
    fn push<const FAST: bool>(&mut self, object: bool, spill: &mut Vec<u64>) -> bool {
        if self.0 >> 63 != 0 {
            if FAST {
                return false;
            }
            spill.push(self.0);
            *self = Self::EMPTY;
        }
        self.0 = (self.0 << 1) | u64::from(object);
        true
    }

    /// Pops the innermost container; true if it was the outermost.
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

impl<const NEWLINE_OK: bool, const FAST: bool> Recogniser<'_, NEWLINE_OK, FAST> {
    fn byte(&self, at: usize) -> Option<u8> {
        self.bytes.get(at).copied()
    }

    fn is_whitespace(byte: u8) -> bool {
        byte == b' ' || byte == b'\t' || byte == b'\r' || (NEWLINE_OK && byte == b'\n')
    }

    /// Skips whitespace from `at`.
    fn skip_whitespace(&self, at: usize) -> usize {
        // Compact JSON has none, and everything else JSON has outside
        // strings is above b' ': one test.
        match self.byte(at) {
            Some(byte) if byte > b' ' => at,
            _ => self.skip_any_whitespace(at),
        }
    }

    /// [`Recogniser::skip_whitespace`], out of line: its test does not
    /// hold a register in the loops.
    #[inline(never)]
    fn skip_any_whitespace(&self, mut at: usize) -> usize {
        while let Some(byte) = self.byte(at) {
            if !Self::is_whitespace(byte) {
                break;
            }
            at += 1;
        }
        at
    }

    /// Recognises the text. Inlined into its one caller for rows,
    /// [`validate_with`], which then needs no call and no returned
    /// `Result` in memory.
    fn run(&self) -> Result<(), Invalid> {
        let mut at = 0;
        let mut nesting = Nesting::EMPTY;
        let mut spill = Vec::new();
        // Rows are arrays (or objects) without whitespace around: one test,
        // and an array is opened here, on to its first value, with no
        // dispatch.
        match self.bytes.first() {
            Some(b'[') => {
                nesting = Nesting(Nesting::EMPTY.0 << 1);
                at = 1;
            }
            Some(b'{') => {}
            _ => {
                at = self.skip_any_whitespace(0);
                if !matches!(self.byte(at), Some(b'[' | b'{')) {
                    return self.scalar(at);
                }
            }
        }
        'value: loop {
            // A value is expected at `at`. An if-chain in order of
            // frequency in rows.
            let Some(byte) = self.byte(at) else {
                return fail(at, "expected a value");
            };
            if byte == b'"' {
                at = self.string(at + 1)?;
                // In arrays a string is most often followed by another:
                // on to it, without the loops' tests.
                while !nesting.in_object() && self.word_left_starts_with(at, *b",\"") {
                    at = self.string(at + 2)?;
                }
            } else if byte == b'n' {
                at = self.literal(at, b"null")?;
            } else if byte == b'[' {
                if !nesting.push::<FAST>(false, &mut spill) {
                    return Err(RETRY);
                }
                // Arrays are seldom empty: on to their first value, where
                // a `]` is taken as closing an empty one (below).
                at += 1;
                continue 'value;
            } else if byte == b'f' {
                at = self.literal(at, b"false")?;
            } else if matches!(byte, b'-' | b'0'..=b'9') {
                at = self.number(at, byte)?;
            } else if byte == b'{' {
                if !nesting.push::<FAST>(true, &mut spill) {
                    return Err(RETRY);
                }
                at = self.skip_whitespace(at + 1);
                match self.byte(at) {
                    Some(b'"') => {
                        at = self.key(at + 1)?;
                        continue 'value;
                    }
                    // An empty object: the loop below closes it.
                    Some(b'}') => {}
                    _ => return fail(at, "expected a string key or `}`"),
                }
            } else if byte == b't' {
                at = self.literal(at, b"true")?;
            } else if byte <= b' ' && Self::is_whitespace(byte) {
                at = self.skip_any_whitespace(at + 1);
                continue 'value;
            } else if byte == b']' && self.closes_empty_array(at) {
                // The loop below closes it.
            } else {
                return fail(at, "expected a value");
            }
            // A value ended: close containers until one wants another value.
            loop {
                let Some(byte) = self.byte(at) else {
                    return fail_after_value(at);
                };
                if byte == b',' {
                    at += 1;
                    if nesting.in_object() {
                        at = self.skip_whitespace(at);
                        if self.byte(at) != Some(b'"') {
                            return fail(at, "expected a string key");
                        }
                        at = self.key(at + 1)?;
                    }
                    continue 'value;
                }
                if byte == nesting.closer() {
                    at += 1;
                    if nesting.pop(&mut spill) {
                        return self.end(at);
                    }
                } else if byte <= b' ' && Self::is_whitespace(byte) {
                    at = self.skip_any_whitespace(at + 1);
                } else {
                    return fail_after_value(at);
                }
            }
        }
    }

    /// Whether the `]` at `at`, where a value is expected, closes an empty
    /// array: whether the last byte before it but whitespace is `[` (and
    /// not `,` or `:`).
    fn closes_empty_array(&self, at: usize) -> bool {
        let before = self.bytes.get(..at).unwrap_or_default();
        before
            .iter()
            .rev()
            .find(|&&byte| !Self::is_whitespace(byte))
            == Some(&b'[')
    }

    /// A whole text that is not an array or object: [`Recogniser::run`]
    /// for it.
    #[inline(never)]
    fn scalar(&self, at: usize) -> Result<(), Invalid> {
        let at = match self.byte(at) {
            Some(b'"') => self.string(at + 1)?,
            Some(b'n') => self.literal(at, b"null")?,
            Some(byte @ (b'0'..=b'9' | b'-')) => self.number(at, byte)?,
            Some(b'f') => self.literal(at, b"false")?,
            Some(b't') => self.literal(at, b"true")?,
            _ => return fail(at, "expected a value"),
        };
        self.end(at)
    }

    /// The end of the text: only whitespace may follow the value.
    fn end(&self, at: usize) -> Result<(), Invalid> {
        if at == self.bytes.len() {
            return Ok(());
        }
        let at = self.skip_any_whitespace(at);
        if at == self.bytes.len() {
            Ok(())
        } else {
            fail(at, "trailing characters")
        }
    }

    /// A key and its colon; `at` follows the key's opening quote. Returns
    /// the offset after the colon.
    #[inline(always)]
    fn key(&self, at: usize) -> Result<usize, Invalid> {
        let mut at = self.string(at)?;
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
    #[inline(always)]
    fn string(&self, mut at: usize) -> Result<usize, Invalid> {
        loop {
            // Skip plain bytes: no quote, backslash, control character
            // (nor, when fast, non-ASCII byte).
            at = self.skip_words(at, Self::specials);
            // The special byte is read again rather than taken from the
            // word, which the loop then need not keep.
            match self.byte(at) {
                Some(b'"') => return Ok(at + 1),
                byte => at = self.string_special(at, byte)?,
            }
        }
    }

    /// The offset of the first byte from `at` that `flags` flags (as
    /// [`bytes_below`] does), or the text's length if none does; eight
    /// bytes at a time.
    fn skip_words(&self, mut at: usize, flags: impl Fn(u64) -> u64) -> usize {
        // Whole words while eight bytes are left: an offset compared with
        // the last word's, one induction variable and one test a word.
        if let Some(last) = self.bytes.len().checked_sub(8) {
            while at <= last {
                let Some(chunk) = self.bytes.get(at..).and_then(<[u8]>::first_chunk::<8>) else {
                    break;
                };
                if let Some(flagged) = NonZeroU64::new(flags(u64::from_le_bytes(*chunk))) {
                    // Non-zero, the count needs no check for zero.
                    return at + flagged.trailing_zeros() as usize / 8;
                }
                at += 8;
            }
        }
        if at > self.bytes.len() {
            return at;
        }
        // Fewer than eight bytes left. The tail word's bytes past the end
        // are zero (flagged by every mask here), its last one always.
        let word = tail_word(self.bytes, at);
        at + (LAST_BYTE | flags(word)).trailing_zeros() as usize / 8
    }

    /// The bytes of `word` that end a run of plain string bytes, as
    /// [`bytes_below`] flags them.
    fn specials(word: u64) -> u64 {
        if FAST {
            ascii_string_specials(word)
        } else {
            string_specials(word)
        }
    }

    /// A special byte at `at` in a string, other than its closing quote: an
    /// escape, a non-ASCII byte, or an error (`None`: the end). Returns the
    /// offset to go on scanning from.
    #[inline(never)]
    fn string_special(&self, at: usize, byte: Option<u8>) -> Result<usize, Invalid> {
        match byte {
            Some(b'\\') => self.escape(at),
            Some(0x80..) => Err(RETRY),
            Some(_) => fail(at, "control character in string"),
            None => fail(at, "unterminated string"),
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
    fn digits(&self, at: usize) -> usize {
        self.skip_words(at, non_digits)
    }

    /// A number; `at` is on its first byte, `byte`. Returns the offset
    /// after it.
    #[inline(always)]
    fn number(&self, mut at: usize, mut byte: u8) -> Result<usize, Invalid> {
        if byte == b'-' {
            at += 1;
            byte = self.byte(at).unwrap_or(0);
        }
        if byte == b'0' {
            at += 1;
            if let Some(b'0'..=b'9') = self.byte(at) {
                return fail(at, "leading zero in number");
            }
        } else if byte.is_ascii_digit() {
            let start = at;
            at = self.digits(at);
            if at - start > PYTHON_INT_MAX_DIGITS
                && !matches!(self.byte(at), Some(b'.' | b'e' | b'E'))
            {
                return fail(start, "integer longer than Python's 4300-digit limit");
            }
        } else {
            return fail(at, "invalid number");
        }
        // Synapse's rows hold integers: one test for the common case.
        match self.byte(at) {
            Some(b'.' | b'e' | b'E') => self.fraction_exponent(at),
            _ => Ok(at),
        }
    }

    /// The fraction and exponent of a number, if any; `at` follows its
    /// integer part. Returns the offset after the number.
    fn fraction_exponent(&self, mut at: usize) -> Result<usize, Invalid> {
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

    /// Whether the text holds `prefix` at `at`, where a word is left (else
    /// false): one test of the offset, against the last word's.
    fn word_left_starts_with<const N: usize>(&self, at: usize, prefix: [u8; N]) -> bool {
        let Some(last) = self.bytes.len().checked_sub(8) else {
            return false;
        };
        at <= last && self.bytes.get(at..).and_then(<[u8]>::first_chunk::<N>) == Some(&prefix)
    }

    /// The literal `word`; `at` is on its first byte. Returns the offset
    /// after it.
    fn literal(&self, at: usize, word: &'static [u8]) -> Result<usize, Invalid> {
        // Where a word is left (in rows, all but at the very end), its
        // first bytes compared at once, bounded by a test of the offset
        // against the last word's, which the fast recogniser also tells
        // the test for the next byte.
        if let Some(last) = self.bytes.len().checked_sub(8)
            && at <= last
            && let Some(chunk) = self.bytes.get(at..).and_then(<[u8]>::first_chunk::<8>)
        {
            let bits = 8 * word.len() as u32;
            let mask = u64::MAX >> (64 - bits);
            if u64::from_le_bytes(*chunk) & mask != literal_word(word) {
                return fail(at, "invalid literal");
            }
            return Ok(at + word.len());
        }
        match self.bytes.get(at..) {
            Some(rest) if rest.starts_with(word) => Ok(at + word.len()),
            _ => fail(at, "invalid literal"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Recogniser, ascii_string_specials, non_digits, string_specials, validate};
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
            b"[ [ ] ]",
            b"[[],[]]",
            b"[[] ]",
            b"[] ]",
            b"[1, ]",
            b"[ ,]",
            b"{\"a\":]",
            b"{\"a\": ]",
            b"{\"a\":[]}",
            b"[\t\r\n]",
            b"[\x01]",
            b"[\"\xc3\xa9\",]",
        ];
        for case in cases {
            // As they are, most shorter than a word (the general
            // recogniser); and padded with whitespace past a word, after
            // and before (the fast one, with and without its first byte an
            // array's).
            let padded = [
                case.to_vec(),
                [case, &b" ".repeat(8)[..]].concat(),
                [&b"\t".repeat(8)[..], case].concat(),
            ];
            for text in padded {
                assert_eq!(
                    validate(&text).is_ok(),
                    oracle(&text),
                    "disagreement on {:?}",
                    String::from_utf8_lossy(&text)
                );
            }
        }
    }

    /// The offset of the byte a mask's lowest flag marks, if any.
    fn first_flagged(mask: u64) -> Option<usize> {
        (mask != 0).then(|| mask.trailing_zeros() as usize / 8)
    }

    /// The word loop, from every offset of texts of every length up to
    /// three words, with a flagged byte at every place (or none): it stops
    /// at the first flagged byte from the offset, else at the end; whole
    /// words, the tail word, and texts shorter than a word.
    #[test]
    fn word_loop_stops_at_the_first_flagged_byte_from_any_offset() {
        /// A word mask, bytes it flags, and which bytes it should flag.
        type Case = (fn(u64) -> u64, &'static [u8], fn(u8) -> bool);
        let masks: [Case; 3] = [
            (ascii_string_specials, b"\"\\\x01\x80\xff", |b| {
                b < 0x20 || b == b'"' || b == b'\\' || b >= 0x80
            }),
            (string_specials, b"\"\\\x1f", |b| {
                b < 0x20 || b == b'"' || b == b'\\'
            }),
            (non_digits, b"a.\x00", |b| !b.is_ascii_digit()),
        ];
        for (mask, flagged, is_flagged) in masks {
            let plain = if is_flagged(b'a') { b'5' } else { b'a' };
            for len in 0..=24 {
                for place in (0..len).map(Some).chain([None]) {
                    for &byte in flagged {
                        let mut bytes = vec![plain; len];
                        if let Some(place) = place {
                            bytes[place] = byte;
                        }
                        let recogniser = Recogniser::<true, true> { bytes: &bytes };
                        for at in 0..=len {
                            let expected = (at..len).find(|&i| is_flagged(bytes[i])).unwrap_or(len);
                            assert_eq!(
                                recogniser.skip_words(at, mask),
                                expected,
                                "{bytes:02x?} from {at}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Literals, whole, cut short or wrong in any byte, with every number of
    /// bytes after them: compared as a word where one is left, else byte
    /// by byte.
    #[test]
    fn literals_agree_with_serde_json_wherever_the_text_ends() {
        for literal in [&b"null"[..], b"true", b"false"] {
            let mut variants = vec![literal.to_vec()];
            for cut in 0..literal.len() {
                variants.push(literal[..cut].to_vec());
                let mut wrong = literal.to_vec();
                wrong[cut] ^= 0x20;
                variants.push(wrong);
            }
            for variant in variants {
                for after in 0..10 {
                    for text in [
                        [b"[", &variant[..], b",0".repeat(after).as_slice(), b"]"].concat(),
                        [b"[0,", &variant[..], &b" ".repeat(after), b"]"].concat(),
                        [b"{\"key\":", &variant[..], &b"}".repeat(after.min(1))].concat(),
                    ] {
                        assert_eq!(
                            validate(&text).is_ok(),
                            oracle(&text),
                            "disagreement on {:?}",
                            String::from_utf8_lossy(&text)
                        );
                    }
                }
            }
        }
    }

    /// Every text of up to four bytes from JSON's alphabet (and a few
    /// others): texts shorter than a word go to the general recogniser.
    #[test]
    fn agrees_with_serde_json_on_every_short_text() {
        let alphabet = b"[]{}\",:0-1e.n \n\\\x01\xc3";
        let mut texts = vec![Vec::new()];
        for _ in 0..4 {
            let longer: Vec<Vec<u8>> = texts
                .iter()
                .flat_map(|text| {
                    alphabet
                        .iter()
                        .map(move |&byte| [&text[..], &[byte]].concat())
                })
                .collect();
            for text in &longer {
                assert_eq!(
                    validate(text).is_ok(),
                    oracle(text),
                    "disagreement on {:?}",
                    String::from_utf8_lossy(text)
                );
            }
            texts = longer;
        }
    }

    /// Each special byte, after every run of plain bytes and before any
    /// byte at all: the lowest flag of each word mask marks exactly the
    /// first special byte (borrows and carries only spoil the flags above
    /// it).
    #[test]
    fn word_masks_flag_the_first_special_byte() {
        let plain = [b'a', b'0', b'~', b' ', b'#', b'!', b'[', b'\x7f'];
        for byte in 0..=255u8 {
            for at in 0..8 {
                for after in [0u8, b'a', b'"', b'\\', 0x80, 0xff, b'5', b'9' + 1] {
                    for fill in plain {
                        let mut bytes = [fill; 8];
                        bytes[at] = byte;
                        bytes[at + 1..].fill(after);
                        let word = u64::from_le_bytes(bytes);
                        let string_special = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
                        assert_eq!(
                            first_flagged(ascii_string_specials(word)),
                            bytes.iter().position(|&b| string_special(b) || b >= 0x80),
                            "{bytes:02x?}"
                        );
                        assert_eq!(
                            first_flagged(string_specials(word)),
                            bytes.iter().position(|&b| string_special(b)),
                            "{bytes:02x?}"
                        );
                        assert_eq!(
                            first_flagged(non_digits(word)),
                            bytes.iter().position(|&b| !b.is_ascii_digit()),
                            "{bytes:02x?}"
                        );
                    }
                }
            }
        }
    }

    /// Strings, escapes, literals and numbers ending at every offset
    /// modulo eight, at the end of the text and not, in texts shorter than
    /// a word and longer: where the word scans start and stop.
    #[test]
    fn agrees_with_serde_json_wherever_words_fall() {
        let pieces: &[&[u8]] = &[
            b"\"\"",
            b"\"abcdefg\"",
            b"\"abcdefgh\"",
            b"\"\\n\"",
            b"\"\\\\\"",
            b"\"a\\u00e9b\"",
            b"\"\\ud800\"",
            b"\"\\u00\"",
            b"\"\\x\"",
            b"\"\\",
            b"\"\\u",
            b"\"abc",
            b"\"",
            "\"caf\u{e9}\"".as_bytes(),
            "\"\u{e9}\\n\u{e9}\"".as_bytes(),
            b"\"\xc3\"",
            b"\"\xff\"",
            b"\"a\x01\"",
            b"\"a\x7f\"",
            b"\"a\nb\"",
            b"null",
            b"nul",
            b"nulll",
            b"true",
            b"tru",
            b"false",
            b"fals",
            b"0",
            b"-0",
            b"-",
            b"01",
            b"12345678",
            b"123456789012345",
            b"1.5",
            b"1.",
            b"1e5",
            b"1E+",
            b"1.5e-3x",
            b"[]",
            b"{}",
            b"[ ]",
            b"{\"k\":1}",
            b"{\"k\"}",
            b"\xc3\xa9",
        ];
        let mut texts = Vec::new();
        for pad in 0..17 {
            let run = "x".repeat(pad);
            for piece in pieces {
                for (open, close) in [
                    ("", ""),
                    ("[", "]"),
                    ("[", ""),
                    ("[", ",1]"),
                    ("{\"k\":", "}"),
                ] {
                    // After a string that moves the piece along the text.
                    texts.push(
                        [
                            format!("[\"{run}\",{open}").as_bytes(),
                            piece,
                            close.as_bytes(),
                            b"]",
                        ]
                        .concat(),
                    );
                    // After whitespace; the piece alone at the end.
                    texts.push(
                        [
                            " ".repeat(pad).as_bytes(),
                            open.as_bytes(),
                            piece,
                            close.as_bytes(),
                        ]
                        .concat(),
                    );
                    // Inside a string.
                    texts.push([b"[\"", run.as_bytes(), piece, b"\"]"].concat());
                }
            }
        }
        for text in texts {
            let mut any_prefix = text.clone();
            while !any_prefix.is_empty() {
                assert_eq!(
                    validate(&any_prefix).is_ok(),
                    oracle(&any_prefix),
                    "disagreement on {:?}",
                    String::from_utf8_lossy(&any_prefix)
                );
                any_prefix.pop();
            }
        }
    }

    #[test]
    fn newlines_are_refused_where_rows_cannot_hold_them() {
        use super::validate_with;
        for text in [
            &b"[\n]"[..],
            b"[\n1]",
            b"[1\n]",
            b"[[]\n]",
            b"\n[]",
            b"[]\n",
        ] {
            assert!(validate_with(text, true).is_ok());
            let invalid = validate_with(text, false).unwrap_err();
            assert_eq!(text[invalid.at], b'\n', "{invalid:?}");
        }
    }

    #[test]
    fn errors_are_at_offsets_in_the_text() {
        // Never the marker by which the fast recogniser hands over.
        for text in [
            &b"[\"\xc3\xa9\", x]"[..],
            b"[\"\xff\"]",
            b"\"\xc3",
            b"[\"\xc3\xa9\x01\"]",
        ] {
            let invalid = validate(text).unwrap_err();
            assert!(invalid.at <= text.len(), "{invalid:?}");
        }
        let mut deep = b"[".repeat(70);
        deep.push(b'x');
        assert_eq!(validate(&deep).unwrap_err().at, 70);
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
        fn agrees_with_serde_json_on_strings(
            body in prop::collection::vec(string_byte(), 0..48),
            open in prop::sample::select(vec!["\"", "[\"", "[1,\"", "{\"", " \""]),
            close in prop::sample::select(vec!["\"", "\"]", "\",2]", "\":0}", "\" ", ""]),
        ) {
            let text = [open.as_bytes(), &body, close.as_bytes()].concat();
            prop_assert_eq!(validate(&text).is_ok(), oracle(&text));
            if let Err(invalid) = validate(&text) {
                prop_assert!(invalid.at <= text.len());
            }
        }

        #[test]
        fn accepts_whatever_serde_json_writes(value in arbitrary_value()) {
            let text = serde_json::to_vec(&value).unwrap();
            prop_assert!(validate(&text).is_ok());
        }
    }

    /// Bytes of strings: mostly plain, with the bytes that stop the word
    /// scans (escapes whole or broken, control characters, non-ASCII bytes
    /// valid as UTF-8 or not).
    fn string_byte() -> impl Strategy<Value = u8> {
        prop_oneof![
            8 => prop::sample::select(b"abcXYZ09:!@$.~ ".to_vec()),
            1 => prop::sample::select(b"\"\\nu0aDe\x01\x1f\x7f\xc3\xa9\x80\xff".to_vec()),
        ]
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
