//! The grammar of RESP's scalar lines, shared by the decoder and the
//! encoder so that whatever one accepts the other writes back.
//!
//! These run on one complete line (the content between the type byte and
//! the CRLF, already found by the framing code), with nom's `complete`
//! parsers.

use nom::Parser;
use nom::branch::alt;
use nom::bytes::complete::{tag, tag_no_case};
use nom::character::complete::{char, digit1, one_of};
use nom::combinator::{all_consuming, opt, recognize};
use nom::error::Error;

/// A `:` integer: an optional sign and decimal digits, within 64 bits.
pub(crate) fn integer(line: &[u8]) -> Option<i64> {
    all_consuming(nom::character::complete::i64::<_, Error<&[u8]>>)
        .parse(line)
        .ok()
        .map(|(_, value)| value)
}

/// A `,` double, in RESP3's grammar: an optional sign, digits, an
/// optional `.` and digits, an optional exponent; or `inf`, `nan` (any
/// case, optional sign), which Redis writes for infinities and NaN.
pub(crate) fn is_double(line: &[u8]) -> bool {
    let sign = || opt(one_of::<_, _, Error<&[u8]>>("+-"));
    let number = (
        sign(),
        digit1,
        opt((char('.'), digit1)),
        opt((one_of("eE"), sign(), digit1)),
    );
    let special = (sign(), alt((tag_no_case("inf"), tag_no_case("nan"))));
    all_consuming(alt((recognize(number), recognize(special))))
        .parse(line)
        .is_ok()
}

/// A `(` big number: an optional sign and decimal digits, of any size.
pub(crate) fn is_big_number(line: &[u8]) -> bool {
    all_consuming(recognize((
        opt(alt((tag::<_, _, Error<&[u8]>>("-"), tag("+")))),
        digit1,
    )))
    .parse(line)
    .is_ok()
}

/// A `#` boolean: `t` or `f`.
pub(crate) fn boolean(line: &[u8]) -> Option<bool> {
    match line {
        b"t" => Some(true),
        b"f" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers() {
        assert_eq!(integer(b"0"), Some(0));
        assert_eq!(integer(b"-12"), Some(-12));
        assert_eq!(integer(b"+12"), Some(12));
        assert_eq!(integer(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(integer(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(integer(b"9223372036854775808"), None);
        assert_eq!(integer(b""), None);
        assert_eq!(integer(b"-"), None);
        assert_eq!(integer(b"1 "), None);
        assert_eq!(integer(b"1.0"), None);
    }

    #[test]
    fn doubles() {
        for ok in [
            &b"1"[..],
            b"-1.5",
            b"1e10",
            b"1.23E-5",
            b"inf",
            b"-inf",
            b"nan",
            b"0.1",
            b"1e+300",
            b"-0",
        ] {
            assert!(is_double(ok), "{:?}", String::from_utf8_lossy(ok));
        }
        for bad in [
            &b""[..],
            b"x",
            b"1x",
            b"1 ",
            b"--1",
            b"1e",
            b".5",
            b"1.",
            b"infinity",
        ] {
            assert!(!is_double(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn big_numbers() {
        assert!(is_big_number(
            b"3492890328409238509324850943850943825024385"
        ));
        assert!(is_big_number(b"-1"));
        assert!(!is_big_number(b""));
        assert!(!is_big_number(b"-"));
        assert!(!is_big_number(b"1.5"));
    }
}
