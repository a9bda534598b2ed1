//! The vocabulary of bulk reads that every backend shares: the [`Gate`] of
//! parts in flight (and the round robin of their [`Connection`]s), and the
//! [`ReadCheck`] a read's bytes must pass before they are returned; the
//! [`Parallelism`] settings of the gate.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Semaphore;

use crate::error::BoxError;
use gkq_format::hex;

/// Part size of a parallel read when none is asked for: what the AWS CRT
/// client and S3's own guidance use.
pub const DEFAULT_PART_SIZE: u64 = 8 << 20;
/// Parts in flight at once by default.
pub const DEFAULT_MAX_PARALLEL: usize = 16;
/// Connections per origin for bulk parts by default (chosen from the
/// figures of `cargo xtask bench coldstart`: see docs/BENCHMARKS.md).
pub const DEFAULT_CONNECTIONS: usize = 4;
/// How a large read is split: `part_size` pieces, `max_parallel` of them
/// in flight at once, spread over up to `connections` connections to the
/// origin (HTTP/2 multiplexes the small reads on one; bulk parts use
/// several, because one TCP connection shares one congestion window and
/// object stores cap each connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parallelism {
    /// Bytes per part (`--part-size`).
    pub part_size: u64,
    /// Parts in flight at once (`--max-parallel`; 1 reads one part at a time).
    pub max_parallel: usize,
    /// Connections per origin for bulk parts (`--connections`).
    pub connections: usize,
}

impl Default for Parallelism {
    fn default() -> Self {
        Parallelism {
            part_size: DEFAULT_PART_SIZE,
            max_parallel: DEFAULT_MAX_PARALLEL,
            connections: DEFAULT_CONNECTIONS,
        }
    }
}

/// Which connection a read should use. Small reads (rows, headers, proofs)
/// share one multiplexed connection; bulk parts are spread over several
/// (see [`crate::Parallelism::connections`]). Backends without connections
/// ignore it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Connection {
    /// The one connection that small reads share (multiplexed over HTTP/2).
    #[default]
    Shared,
    /// Bulk connection `n` (taken modulo the configured count).
    Bulk(usize),
}

/// A check of one part: `(offset in the range, bytes)`.
pub type PartFn = dyn Fn(u64, &[u8]) -> std::result::Result<(), BoxError> + Send + Sync;

/// How the bytes of a parallel read are verified before they are returned.
#[derive(Clone)]
pub enum ReadCheck {
    /// Not verified here (the caller checks the whole).
    None,
    /// The SHA-256 of the whole range must be this.
    Sha256([u8; 32]),
    /// Each part must pass `check`; parts are cut at multiples of `align`
    /// bytes of the range (the unit the check works on).
    Parts {
        /// The unit: part sizes are multiples of it.
        align: u64,
        /// The check.
        check: Arc<PartFn>,
    },
}

impl std::fmt::Debug for ReadCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadCheck::None => f.write_str("None"),
            ReadCheck::Sha256(d) => write!(f, "Sha256({})", hex(d)),
            ReadCheck::Parts { align, .. } => write!(f, "Parts {{ align: {align} }}"),
        }
    }
}

/// The parts in flight of every bulk read of one store, and the round robin
/// of their connections.
#[derive(Debug)]
pub struct Gate {
    pub(crate) permits: Semaphore,
    next: AtomicUsize,
    config: Parallelism,
    /// Parts reading now, and the most there have been at once.
    pub(crate) reading: InFlight,
}

impl Gate {
    /// A gate for `config.max_parallel` parts in flight.
    pub fn new(config: Parallelism) -> Gate {
        Gate {
            permits: Semaphore::new(config.max_parallel.max(1)),
            next: AtomicUsize::new(0),
            config,
            reading: InFlight::default(),
        }
    }

    /// The most parts that have been reading at once through this gate.
    pub fn peak_in_flight(&self) -> usize {
        self.reading.peak()
    }

    /// The settings.
    pub fn config(&self) -> Parallelism {
        self.config
    }

    pub(crate) fn next_connection(&self) -> Connection {
        Connection::Bulk(self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// How many of something are in flight, and the most there have been at
/// once: requests (for round trips), a gate's parts.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    now: AtomicUsize,
    peak: AtomicUsize,
}

/// One in flight (see [`InFlight::enter`]) until dropped, also when its
/// future is cancelled.
pub(crate) struct Entered<'a>(&'a InFlight);

impl InFlight {
    /// One more in flight, and whether none was before it.
    pub(crate) fn enter(&self) -> (Entered<'_>, bool) {
        let before = self.now.fetch_add(1, Ordering::Relaxed);
        self.peak.fetch_max(before + 1, Ordering::Relaxed);
        (Entered(self), before == 0)
    }

    /// The most there have been at once.
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::Relaxed);
    }
}
