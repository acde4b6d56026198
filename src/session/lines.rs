//! Splitting a byte stream into `\n`-terminated lines, with a cap on what
//! is buffered for a line not yet complete (h11's rule: a peer that never
//! sends a newline cannot make us hold more than the limit).

use bytes::{Bytes, BytesMut};

/// A line longer than the limit was received, or started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LineTooLong;

/// Splits input chunks into lines, without their `\n`.
///
/// Complete lines inside a chunk are views of that chunk (no copy); only
/// the unfinished tail of a chunk is copied, into a buffer that never grows
/// beyond the limit. Twisted's `LineOnlyReceiver` (what Synapse uses) has
/// the same limit: a line of `max` bytes passes, one of `max + 1` does not,
/// whether or not its `\n` has arrived yet.
///
/// Its [`Debug`](std::fmt::Debug) output shows how many bytes it holds,
/// never the bytes (a line may carry an access token).
pub(crate) struct Lines {
    max: usize,
    /// The start of a line whose `\n` has not arrived, at most `max` bytes.
    partial: BytesMut,
    /// What is left of the chunk being split.
    pending: Bytes,
}

impl std::fmt::Debug for Lines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lines")
            .field("max", &self.max)
            .field("partial_bytes", &self.partial.len())
            .field("pending_bytes", &self.pending.len())
            .finish()
    }
}

impl Lines {
    pub(crate) fn new(max: usize) -> Lines {
        Lines {
            max,
            partial: BytesMut::new(),
            pending: Bytes::new(),
        }
    }

    /// Starts splitting `data`; call [`Lines::next_line`] until `None`
    /// before pushing the next chunk (if not, the chunks are joined).
    pub(crate) fn push(&mut self, data: Bytes) {
        if self.pending.is_empty() {
            self.pending = data;
        } else {
            let mut joined = BytesMut::with_capacity(self.pending.len() + data.len());
            joined.extend_from_slice(&self.pending);
            joined.extend_from_slice(&data);
            self.pending = joined.freeze();
        }
    }

    /// The next complete line of the chunk, or `None` when the chunk is
    /// used up (its tail, if any, is kept for the next chunk).
    ///
    /// After an error nothing is buffered any more; the caller closes.
    pub(crate) fn next_line(&mut self) -> Result<Option<Bytes>, LineTooLong> {
        if self.pending.is_empty() {
            return Ok(None);
        }
        match self.pending.iter().position(|b| *b == b'\n') {
            Some(end) => {
                let mut line = self.pending.split_to(end + 1);
                line.truncate(end);
                if self.partial.is_empty() {
                    if line.len() > self.max {
                        return Err(self.fail());
                    }
                    return Ok(Some(line));
                }
                if self.partial.len() + line.len() > self.max {
                    return Err(self.fail());
                }
                self.partial.extend_from_slice(&line);
                Ok(Some(self.partial.split().freeze()))
            }
            None => {
                if self.partial.len() + self.pending.len() > self.max {
                    return Err(self.fail());
                }
                self.partial.extend_from_slice(&self.pending);
                self.pending = Bytes::new();
                Ok(None)
            }
        }
    }

    /// Bytes held for a line not yet complete.
    pub(crate) fn buffered(&self) -> usize {
        self.partial.len()
    }

    /// Drops everything: what is left of the chunk and the partial line.
    pub(crate) fn clear(&mut self) {
        self.partial = BytesMut::new();
        self.pending = Bytes::new();
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
        lines.push(Bytes::copy_from_slice(data));
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
    fn complete_lines_are_not_copied() {
        let chunk = Bytes::from_static(b"A 1\nB 2\n");
        let mut lines = Lines::new(64);
        lines.push(chunk.clone());
        let first = lines.next_line().unwrap().unwrap();
        assert_eq!(first.as_ptr(), chunk.as_ptr());
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
