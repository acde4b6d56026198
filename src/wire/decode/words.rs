//! Eight bytes at a time: the word-wise searches and conversions the
//! decoder's paths share (spaces, field ends, digits).

use super::*;

/// The offset of the first space in `bytes` from `at`, eight bytes at a
/// time.
pub(super) fn next_space(bytes: &[u8], mut at: usize) -> Option<usize> {
    while at < bytes.len() {
        // Bytes past the end read as zero, which is not a space.
        let word = word_at(bytes, at) ^ (ONES * u64::from(b' '));
        // The lowest high bit set marks the first zero byte, that is the
        // first space (a borrow only runs upwards).
        let spaces = word.wrapping_sub(ONES) & !word & HIGHS;
        if spaces != 0 {
            return Some(at + spaces.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    None
}

/// `-?[0-9]+` within `i64`, and nothing else (no `+`, spaces or `_`).
pub(super) fn parse_i64(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, text),
    };
    if digits.is_empty() {
        return None;
    }
    // Eight to sixteen digits (timestamps in ms have thirteen), eight
    // bytes at a time: the last eight, and those before them in the high
    // bytes of the first eight's word, `0`s below them.
    if let (Some(first), Some(last), 8..=16) = (
        digits.first_chunk::<8>(),
        digits.last_chunk::<8>(),
        digits.len(),
    ) {
        let shift = 8 * (16 - digits.len()) as u32;
        let high = u64::from_le_bytes(*first).checked_shl(shift).unwrap_or(0)
            | (ONES * u64::from(b'0'))
                .checked_shr(64 - shift)
                .unwrap_or(0);
        let value = eight_digits(high)? * 100_000_000 + eight_digits(u64::from_le_bytes(*last))?;
        // Below 10^16: no overflow.
        let value = value as i64;
        return Some(if negative { -value } else { value });
    }
    // Eighteen digits cannot overflow: no checks but for digits.
    if digits.len() <= 18 {
        let mut value: i64 = 0;
        for &byte in digits {
            let digit = byte.wrapping_sub(b'0');
            if digit > 9 {
                return None;
            }
            value = value * 10 + i64::from(digit);
        }
        return Some(if negative { -value } else { value });
    }
    let mut value: i64 = 0;
    for &byte in digits {
        let digit = i64::from(byte.checked_sub(b'0').filter(|digit| *digit <= 9)?);
        // Accumulate on the sign's side so that i64::MIN parses.
        value = value.checked_mul(10)?;
        value = if negative {
            value.checked_sub(digit)?
        } else {
            value.checked_add(digit)?
        };
    }
    Some(value)
}

/// The offsets of the first `N` spaces in `line` from `start`, found
/// eight bytes at a time; `None` if there are fewer, or if a newline comes
/// before the last of them.
pub(super) fn spaces<const N: usize>(line: &[u8], start: usize) -> Option<[usize; N]> {
    let mut spaces = [0; N];
    let mut found = 0;
    let mut base = start;
    while base < line.len() {
        let mut marks = spaces_and_newlines(word_at(line, base));
        while marks != 0 {
            let at = base + marks.trailing_zeros() as usize / 8;
            if line.get(at) != Some(&b' ') {
                return None;
            }
            *spaces.get_mut(found)? = at;
            found += 1;
            if found == N {
                return Some(spaces);
            }
            marks &= marks - 1;
        }
        base += 8;
    }
    None
}

pub(super) const ONES: u64 = 0x0101_0101_0101_0101;

const LOWS: u64 = 0x7f7f_7f7f_7f7f_7f7f;

const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of every byte of `word` that is a space or a newline; exact
/// for every byte (no borrows between bytes).
const fn spaces_and_newlines(word: u64) -> u64 {
    let spaces = word ^ (ONES * b' ' as u64);
    let newlines = word ^ (ONES * b'\n' as u64);
    // A byte's high bit is set in `nonzero(x)` iff the byte of x is not zero.
    const fn nonzero(x: u64) -> u64 {
        ((x & LOWS) + LOWS) | x
    }
    !(nonzero(spaces) & nonzero(newlines)) & HIGHS
}

/// The eight bytes of `bytes` from `at` as a little-endian word; bytes past
/// the end read as zero.
pub(super) fn word_at(bytes: &[u8], at: usize) -> u64 {
    // One bounds check: a range that wraps round is refused as empty.
    match bytes
        .get(at..at.wrapping_add(8))
        .and_then(<[u8]>::first_chunk::<8>)
    {
        Some(chunk) => u64::from_le_bytes(*chunk),
        None => short_word_at(bytes, at),
    }
}

#[cold]
fn short_word_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    for (to, from) in word.iter_mut().zip(bytes.get(at..).unwrap_or_default()) {
        *to = *from;
    }
    u64::from_le_bytes(word)
}

/// The offsets in `line` of the first three spaces from `start`, found
/// eight bytes at a time: those that end the first three of the four
/// fields of `command` named in `fields`. A newline before the third space
/// is [`DecodeError::Newline`]; a missing space makes the field it would
/// start [`DecodeError::MissingField`].
pub(super) fn three_spaces(
    line: &[u8],
    start: usize,
    command: CommandKind,
    fields: [&'static str; 4],
) -> Result<[usize; 3], DecodeError> {
    spaces::<3>(line, start).ok_or_else(|| three_spaces_error(line, start, command, fields))
}

/// Why [`three_spaces`] found no three spaces: a newline before the third
/// ([`DecodeError::Newline`]), or the field that the missing space would
/// start.
fn three_spaces_error(
    line: &[u8],
    start: usize,
    command: CommandKind,
    fields: [&'static str; 4],
) -> DecodeError {
    let mut found = 0;
    for &byte in line.get(start..).unwrap_or_default() {
        match byte {
            b' ' if found < 2 => found += 1,
            b' ' => break,
            b'\n' => return DecodeError::Newline,
            _ => {}
        }
    }
    DecodeError::MissingField {
        command,
        field: match found {
            0 => fields[1],
            1 => fields[2],
            _ => fields[3],
        },
    }
}

/// The token in `line[start..end]`: [`parse_i64`], with up to eight digits
/// converted eight bytes at a time.
pub(super) fn token_at(line: &[u8], start: usize, end: usize) -> Option<i64> {
    let len = end.wrapping_sub(start);
    if (1..=8).contains(&len) {
        if let Some(word) = end.checked_sub(8).and_then(|from| line.get(from..end)) {
            if let Some(word) = word.first_chunk::<8>() {
                // The token fills the high bytes; the bytes before it become
                // `0`s, leading zeros that change nothing.
                let keep = u64::MAX << (8 * (8 - len));
                let zeros = ONES * u64::from(b'0');
                let word = (u64::from_le_bytes(*word) & keep) | (zeros & !keep);
                if let Some(value) = eight_digits(word) {
                    return Some(value as i64);
                }
            }
        }
    }
    parse_i64(line.get(start..end).unwrap_or_default())
}

/// Eight ASCII digits, the first in the lowest byte, as a number; `None` if
/// any byte is not a digit.
pub(super) const fn eight_digits(word: u64) -> Option<u64> {
    let digits = word.wrapping_sub(ONES * b'0' as u64);
    // A byte is a digit iff, less `0`, it and it plus 6 are below 16. (A
    // byte below `0` borrows from the next, but is caught itself.)
    if (digits | digits.wrapping_add(ONES * 6)) & (ONES * 0xf0) != 0 {
        return None;
    }
    // Combine neighbours: pairs, then fours, then all eight.
    let pairs = (digits * 10 + (digits >> 8)) & 0x00ff_00ff_00ff_00ff;
    let fours = (pairs * 100 + (pairs >> 16)) & 0x0000_ffff_0000_ffff;
    Some((fours * 10000 + (fours >> 32)) & 0xffff_ffff)
}

/// The first space or newline in `line` from `at`, eight bytes at a time.
fn next_mark(line: &[u8], mut at: usize) -> Option<usize> {
    while at < line.len() {
        let marks = spaces_and_newlines(word_at(line, at));
        if marks != 0 {
            return Some(at + marks.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    None
}

/// The non-empty field at `start` ended by a space: the first word of
/// the line from `start` (a field of up to seven bytes is in its low
/// bytes), and the field's end. `None` if a newline ends the field, or
/// any other control character is in its first word.
#[inline(always)]
pub(super) fn short_field(line: &[u8], start: usize) -> Option<(u64, usize)> {
    let word = word_at(line, start);
    // The high bit of the first byte below `!` (a space, a control
    // character, or past the end of the line) is set, exactly: no borrow
    // reaches it.
    let low = word.wrapping_sub(ONES * 0x21) & !word & HIGHS;
    if low != 0 {
        let len = low.trailing_zeros() as usize / 8;
        if len == 0 || (word >> (8 * len)) as u8 != b' ' {
            return None;
        }
        return Some((word, start + len));
    }
    let end = next_mark(line, start + 8)?;
    if line.get(end) != Some(&b' ') {
        return None;
    }
    Some((word, end))
}

#[cfg(test)]
mod parse_i64_tests {
    use proptest::prelude::*;

    use super::parse_i64;

    /// `-?[0-9]+` within `i64`, the slow way.
    fn reference(text: &[u8]) -> Option<i64> {
        let digits = text.strip_prefix(b"-").unwrap_or(text);
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(text).ok()?.parse().ok()
    }

    #[test]
    fn every_length_and_every_wrong_byte() {
        for len in 0..=20 {
            let digits = &"98765432109876543210"[..len];
            for sign in ["", "-", "+"] {
                let text = format!("{sign}{digits}");
                assert_eq!(
                    parse_i64(text.as_bytes()),
                    reference(text.as_bytes()),
                    "{text}"
                );
                for at in 0..len {
                    for byte in [b'/', b':', b' ', b'-', 0xb0, 0x30 + 0x80, 0] {
                        let mut text = text.clone().into_bytes();
                        text[sign.len() + at] = byte;
                        assert_eq!(parse_i64(&text), reference(&text), "{text:?}");
                    }
                }
            }
        }
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
    }

    proptest! {
        #[test]
        fn reads_as_the_reference(text in "-?[0-9]{0,20}|[0-9/: +-]{0,20}") {
            prop_assert_eq!(parse_i64(text.as_bytes()), reference(text.as_bytes()));
        }
    }
}

#[cfg(test)]
mod three_spaces_tests {
    use super::*;

    /// What each line gives: the spaces, or the error's message.
    #[test]
    fn spaces_newlines_and_missing_fields() {
        let read = |line: &str| {
            three_spaces(
                line.as_bytes(),
                0,
                CommandKind::Position,
                ["0", "1", "2", "3"],
            )
            .map_err(|error| error.to_string())
        };
        let missing = |field: &'static str| {
            Err(DecodeError::MissingField {
                command: CommandKind::Position,
                field,
            }
            .to_string())
        };
        let newline = Err(DecodeError::Newline.to_string());
        assert_eq!(read("a b c d"), Ok([1, 3, 5]));
        assert_eq!(
            read("a_stream_name_longer_than_a_word b c d"),
            Ok([32, 34, 36])
        );
        assert_eq!(
            read("a b c d\ne"),
            Ok([1, 3, 5]),
            "a newline after the third space"
        );
        assert_eq!(read(""), missing("1"));
        assert_eq!(read("a"), missing("1"));
        assert_eq!(read("a b"), missing("2"));
        assert_eq!(read("a b c"), missing("3"));
        assert_eq!(read("a_long_first_field b c"), missing("3"));
        assert_eq!(read("a\nb c d"), newline);
        assert_eq!(read("a b\nc d"), newline);
        assert_eq!(read("a b c_longer_than_a_word\n"), newline);
        assert_eq!(read("a b\n"), newline);
    }
}
