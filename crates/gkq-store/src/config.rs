//! Settings of a [`crate::Store`]: timeouts and the per-request deadline,
//! retries, TLS trust, and how large reads are split into parallel parts.

use std::path::PathBuf;
use std::time::Duration;

use crate::retry::RetryPolicy;

/// Part size of a parallel read when none is asked for: what the AWS CRT
/// client and S3's own guidance use.
pub const DEFAULT_PART_SIZE: u64 = 8 << 20;
/// Parts in flight at once by default.
pub const DEFAULT_MAX_PARALLEL: usize = 16;
/// Connections per origin for bulk parts by default (chosen from the
/// figures of `cargo xtask bench coldstart`: see docs/BENCHMARKS.md).
pub const DEFAULT_CONNECTIONS: usize = 4;
/// Connect timeout and floor of each request's deadline by default: 10 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Minimum throughput a response must keep by default: 64 KiB/s.
pub const DEFAULT_MIN_THROUGHPUT: u64 = 64 << 10;

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

/// Everything a store needs to know.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Connect timeout, and the floor of each request's deadline (`--timeout`).
    pub timeout: Duration,
    /// Minimum throughput, bytes per second, a response must keep: a request
    /// for `n` bytes must be complete within `timeout + n / min_throughput`,
    /// so a server that stalls or drips one byte at a time is cut off and
    /// the attempt fails as a timeout (`--min-throughput`; 0 = only the floor).
    pub min_throughput: u64,
    /// Retries of transient failures.
    pub retry: RetryPolicy,
    /// Extra PEM files of CA certificates to trust besides the system store
    /// (`--ca-cert`). `SSL_CERT_FILE` replaces the system store, as in OpenSSL.
    pub ca_certs: Vec<PathBuf>,
    /// Offer only HTTP/1.1 (no h2 in ALPN).
    pub http1_only: bool,
    /// Largest single read into memory.
    pub max_read_bytes: u64,
    /// Parallel parts of large reads.
    pub parallel: Parallelism,
    /// S3 endpoint for `s3://` URLs (feature `s3`); default
    /// `https://$R2_ACCOUNT_ID.r2.cloudflarestorage.com`.
    pub s3_endpoint: Option<String>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            timeout: DEFAULT_TIMEOUT,
            min_throughput: DEFAULT_MIN_THROUGHPUT,
            retry: RetryPolicy::default(),
            ca_certs: Vec::new(),
            http1_only: false,
            max_read_bytes: 8 << 30,
            parallel: Parallelism::default(),
            s3_endpoint: None,
        }
    }
}

impl StoreConfig {
    /// The deadline of one request for `bytes` bytes.
    pub fn deadline(&self, bytes: u64) -> Duration {
        crate::range::deadline(self.timeout, self.min_throughput, bytes)
    }
}
