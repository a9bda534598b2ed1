//! Settings of a [`crate::Store`]: timeouts and the per-request deadline,
//! retries, TLS trust, and how large reads are split into parallel parts.

use std::path::PathBuf;
use std::time::Duration;

use crate::gate::Parallelism;
use crate::retry::RetryPolicy;

/// Connect timeout and floor of each request's deadline by default: 10 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Minimum throughput a response must keep by default: 64 KiB/s.
pub const DEFAULT_MIN_THROUGHPUT: u64 = 64 << 10;

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
