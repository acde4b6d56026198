//! Splitting a byte stream into `\n`-terminated lines, with a cap on what
//! is buffered for a line not yet complete (h11's rule: a peer that never
//! sends a newline cannot make us hold more than the limit).

use bytes::{Bytes, BytesMut};

/// A line longer than the limit was received, or started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LineTooLong;

/// Splits input chunks into lines, without their `\n`.
///
/// Input is copied once into a buffer; each complete line is a view of
/// that buffer (no further copy), and what is left of a line not yet
/// complete never grows beyond the limit. Twisted's `LineOnlyReceiver`
/// (what Synapse uses) has the same limit: a line of `max` bytes passes,
/// one of `max + 1` does not, whether or not its `\n` has arrived yet.
///
/// Its [`Debug`](std::fmt::Debug) output shows how many bytes it holds,
/// never the bytes (a line may carry an access token).
pub(crate) struct Lines {
    max: usize,
    /// Input not yet split: complete lines, then at most the start of one
    /// whose `\n` has not arrived.
    buffer: BytesMut,
    /// Bytes at the start of `buffer` known to hold no `\n`.
    scanned: usize,
}

impl std::fmt::Debug for Lines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lines")
            .field("max", &self.max)
            .field("buffered_bytes", &self.buffer.len())
            .finish()
    }
}

impl Lines {
    pub(crate) fn new(max: usize) -> Lines {
        Lines {
            max,
            buffer: BytesMut::new(),
            scanned: 0,
        }
    }

    /// Adds `data` to split; call [`Lines::next_line`] until `None`.
    pub(crate) fn push(&mut self, data: &[u8]) {
        self.buffer.extend_from_slice(data);
    }

    /// The next complete line, or `None` when only the start of one (at
    /// most `max` bytes) is left.
    ///
    /// After an error nothing is buffered any more; the caller closes.
    pub(crate) fn next_line(&mut self) -> Result<Option<Bytes>, LineTooLong> {
        let unscanned = self.buffer.get(self.scanned..).unwrap_or_default();
        match unscanned.iter().position(|b| *b == b'\n') {
            Some(at) => {
                let end = self.scanned + at;
                self.scanned = 0;
                if end > self.max {
                    return Err(self.fail());
                }
                let mut line = self.buffer.split_to(end + 1);
                line.truncate(end);
                Ok(Some(line.freeze()))
            }
            None => {
                if self.buffer.len() > self.max {
                    return Err(self.fail());
                }
                self.scanned = self.buffer.len();
                Ok(None)
            }
        }
    }

    /// Bytes held for a line not yet complete (or not yet taken).
    pub(crate) fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// Drops everything buffered.
    pub(crate) fn clear(&mut self) {
        self.buffer = BytesMut::new();
        self.scanned = 0;
    }

    fn fail(&mut self) -> LineTooLong {
        self.clear();
        LineTooLong
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(lines: &mut Lines, data: &[u8]) -> Result<Vec<Vec<u8>>, LineTooLong> {
        lines.push(data);
        let mut out = Vec::new();
        while let Some(line) = lines.next_line()? {
            out.push(line.to_vec());
        }
        Ok(out)
    }

    #[test]
    fn whole_and_byte_by_byte_agree() {
        let input = b"PING 1\n\nRDATA a b 1 []\npartial";
        let mut whole = Lines::new(64);
        let expected = split(&mut whole, input).unwrap();
        assert_eq!(
            expected,
            vec![b"PING 1".to_vec(), Vec::new(), b"RDATA a b 1 []".to_vec()]
        );
        assert_eq!(whole.buffered(), 7);
        let mut bytewise = Lines::new(64);
        let mut got = Vec::new();
        for byte in input {
            got.extend(split(&mut bytewise, &[*byte]).unwrap());
        }
        assert_eq!(got, expected);
        assert_eq!(bytewise.buffered(), 7);
    }

    #[test]
    fn lines_are_views_of_one_buffer() {
        let mut lines = Lines::new(64);
        lines.push(b"A 1\nB 2\nC");
        let first = lines.next_line().unwrap().unwrap();
        let second = lines.next_line().unwrap().unwrap();
        assert_eq!((&first[..], &second[..]), (&b"A 1"[..], &b"B 2"[..]));
        // Both point into the same allocation, one after the other.
        assert_eq!(second.as_ptr() as usize, first.as_ptr() as usize + 4);
        assert_eq!(lines.next_line(), Ok(None));
        assert_eq!(lines.buffered(), 1);
    }

    #[test]
    fn the_limit_is_inclusive_and_applies_before_the_newline() {
        let mut lines = Lines::new(4);
        assert_eq!(
            split(&mut lines, b"abcd\n").unwrap(),
            vec![b"abcd".to_vec()]
        );
        assert_eq!(split(&mut lines, b"abcd").unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(split(&mut lines, b"e"), Err(LineTooLong));
        assert_eq!(lines.buffered(), 0, "nothing kept after the error");
        let mut lines = Lines::new(4);
        assert_eq!(split(&mut lines, b"ab"), Ok(Vec::new()));
        assert_eq!(split(&mut lines, b"cde\n"), Err(LineTooLong));
        let mut lines = Lines::new(4);
        assert_eq!(split(&mut lines, b"abcde\n"), Err(LineTooLong));
    }
}
