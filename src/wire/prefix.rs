//! Prefix comparison for a short run-time prefix on the hot path (this
//! process's instance name, looked for in every message): eight bytes at
//! a time, inline, where a call to `memcmp` costs more than the comparison
//! itself. (For prefixes of 30 bytes and more, such as a channel's message
//! header, `memcmp` is as cheap: it keeps those.)

/// Whether `bytes` starts with `prefix`.
pub(crate) fn starts_with(bytes: &[u8], prefix: &[u8]) -> bool {
    let Some(head) = bytes.get(..prefix.len()) else {
        return false;
    };
    same(head, prefix)
}

/// `a == b` for slices of the same length, compared in words; the last
/// word overlaps the one before it rather than being cut short.
fn same(a: &[u8], b: &[u8]) -> bool {
    let len = b.len();
    if len < 8 {
        if len < 4 {
            return a == b;
        }
        return word4(a, 0) == word4(b, 0) && word4(a, len - 4) == word4(b, len - 4);
    }
    let mut at = 0;
    while at + 8 < len {
        if word8(a, at) != word8(b, at) {
            return false;
        }
        at += 8;
    }
    word8(a, len - 8) == word8(b, len - 8)
}

fn word8(bytes: &[u8], at: usize) -> Option<u64> {
    let chunk = bytes.get(at..)?.first_chunk::<8>()?;
    Some(u64::from_le_bytes(*chunk))
}

fn word4(bytes: &[u8], at: usize) -> Option<u32> {
    let chunk = bytes.get(at..)?.first_chunk::<4>()?;
    Some(u32::from_le_bytes(*chunk))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::starts_with;

    #[test]
    fn every_length_around_the_word_sizes() {
        let text: Vec<u8> = (0..40u8).collect();
        for len in 0..=text.len() {
            let prefix = &text[..len];
            assert!(starts_with(&text, prefix), "len {len}");
            for at in 0..len {
                let mut other = prefix.to_vec();
                other[at] ^= 0x20;
                assert!(!starts_with(&text, &other), "len {len}, differing at {at}");
            }
        }
        assert!(!starts_with(b"abc", b"abcd"));
    }

    proptest! {
        #[test]
        fn agrees_with_the_slice_method(bytes in prop::collection::vec(0..4u8, 0..40),
                                        prefix in prop::collection::vec(0..4u8, 0..40)) {
            prop_assert_eq!(starts_with(&bytes, &prefix), bytes.starts_with(&prefix));
        }
    }
}
