//! [`Limits`]: what a [`RespDecoder`](super::RespDecoder) holds at most.

/// Caps on what one frame may declare, checked as soon as a header is read
/// (before waiting for, or allocating anything for, what it declares), so
/// that a broken or hostile server cannot make the decoder allocate, buffer
/// or nest without bound.
///
/// ```
/// use synapse_replication::resp::{RespDecoder, Limits};
///
/// let limits = Limits::new().with_max_bulk_len(1 << 20).with_max_depth(8);
/// let decoder = RespDecoder::with_limits(limits);
/// assert_eq!(decoder.limits().max_depth, 8);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// The longest bulk string, bulk error or verbatim string, in bytes.
    /// Default 64 MiB (Redis' own `proto-max-bulk-len` is 512 MiB; a
    /// replication payload is a few kilobytes).
    pub max_bulk_len: usize,
    /// The most elements in one array, set or push, or pairs in one map or
    /// attribute. Default 1 Mi.
    pub max_elements: usize,
    /// The deepest nesting of aggregates: a flat array is depth 1; an
    /// attribute counts as a level. Default 32. Values above
    /// [`Limits::DEPTH_CEILING`] act as that ceiling, because dropping,
    /// cloning or comparing a [`Frame`](crate::resp::Frame) recurses once per level.
    pub max_depth: usize,
    /// The longest simple string, error, integer, double or big number
    /// line, in bytes without its CRLF. Default 64 KiB (Redis'
    /// `proto-inline-max-size`).
    pub max_line_len: usize,
    /// The largest frame, in bytes, everything included: the most a
    /// transport must buffer for one incomplete frame. Default 128 MiB.
    pub max_frame_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits::new()
    }
}

impl Limits {
    /// The default [`Limits::max_bulk_len`]: 64 MiB.
    pub const DEFAULT_MAX_BULK_LEN: usize = 64 << 20;
    /// The default [`Limits::max_elements`]: 1 Mi.
    pub const DEFAULT_MAX_ELEMENTS: usize = 1 << 20;
    /// The default [`Limits::max_depth`]: 32.
    pub const DEFAULT_MAX_DEPTH: usize = 32;
    /// The default [`Limits::max_line_len`]: 64 KiB.
    pub const DEFAULT_MAX_LINE_LEN: usize = 64 << 10;
    /// The default [`Limits::max_frame_len`]: 128 MiB.
    pub const DEFAULT_MAX_FRAME_LEN: usize = 128 << 20;
    /// The deepest nesting the decoder accepts whatever
    /// [`Limits::max_depth`] says: 256.
    pub const DEPTH_CEILING: usize = 256;

    /// The default limits.
    pub const fn new() -> Self {
        Limits {
            max_bulk_len: Self::DEFAULT_MAX_BULK_LEN,
            max_elements: Self::DEFAULT_MAX_ELEMENTS,
            max_depth: Self::DEFAULT_MAX_DEPTH,
            max_line_len: Self::DEFAULT_MAX_LINE_LEN,
            max_frame_len: Self::DEFAULT_MAX_FRAME_LEN,
        }
    }

    /// Sets [`Limits::max_bulk_len`].
    #[must_use]
    pub const fn with_max_bulk_len(mut self, max: usize) -> Self {
        self.max_bulk_len = max;
        self
    }

    /// Sets [`Limits::max_elements`].
    #[must_use]
    pub const fn with_max_elements(mut self, max: usize) -> Self {
        self.max_elements = max;
        self
    }

    /// Sets [`Limits::max_depth`].
    #[must_use]
    pub const fn with_max_depth(mut self, max: usize) -> Self {
        self.max_depth = max;
        self
    }

    /// Sets [`Limits::max_line_len`].
    #[must_use]
    pub const fn with_max_line_len(mut self, max: usize) -> Self {
        self.max_line_len = max;
        self
    }

    /// Sets [`Limits::max_frame_len`].
    #[must_use]
    pub const fn with_max_frame_len(mut self, max: usize) -> Self {
        self.max_frame_len = max;
        self
    }

    pub(super) const fn depth(&self) -> usize {
        if self.max_depth < Self::DEPTH_CEILING {
            self.max_depth
        } else {
            Self::DEPTH_CEILING
        }
    }
}
