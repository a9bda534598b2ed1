//! The progress sink of every long-running library call (pack, verify,
//! upload): the library reports bytes, a binary decides how to show them
//! (a bar on a terminal, nothing otherwise). No I/O here.

/// Where a long operation reports how far it got.
pub trait Progress: Send + Sync {
    /// Total bytes the operation will process.
    fn start(&self, _total: u64) {}
    /// Bytes processed since the last call.
    fn advance(&self, _bytes: u64) {}
}

/// A [`Progress`] that shows nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProgress;
impl Progress for NoProgress {}
