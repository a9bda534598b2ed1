//! `gkq-store`: the one place where bytes are read.
//!
//! - [`RangeRead`] is the trait of every backend: HTTP(S) ([`HttpStore`]:
//!   HTTP/2 by ALPN with one multiplexed connection for small reads and
//!   several for bulk parts, HTTP/1.1 keep-alive otherwise; rustls with the
//!   system store plus `--ca-cert` files; `HTTPS_PROXY`/`NO_PROXY`), S3
//!   (feature `s3`: ranged `GetObject` of private buckets), and local files
//!   (positioned reads). Every read is strict: exactly the range asked
//!   for, or an error naming the location and the range; every backend
//!   gives the same answer to the same edge case (`tests/backends.rs` runs
//!   one contract against all three).
//! - [`Store`] routes a location to its backend by scheme, and reads large
//!   ranges in parallel verified parts ([`ReadChecked::read_checked`],
//!   [`ReadCheck`]) under one [`Gate`].
//! - Every request runs under one retry and deadline runner
//!   ([`retry::Runner`]: [`RetryPolicy`], `Retry-After` honoured, a
//!   deadline scaled to its bytes by [`StoreConfig::min_throughput`]),
//!   whatever the backend; the uploader's parts use it too.
//! - Counting is a layer: each backend counts what it sends ([`NetStats`]),
//!   and [`Meter`] wraps any backend to count what one user of it moved.
//! - The core is async (tokio); [`blocking::Runtime`] is the facade that
//!   blocking APIs (the CLIs, `gkq-verify`, sync users of the reader) drive.
//! - [`copy_to_file`]: a whole object to a file, checked against its
//!   SHA-256 as it streams (the mirror's staging).
//! - [`s3`] (feature `s3`): the S3 client R2 needs, shared with the uploader.

mod answer;
mod config;
mod copy;
mod error;
mod gate;
mod http;
mod local;
mod parallel;
#[cfg(test)]
mod parallel_tests;
mod range;
mod read;
pub mod refetch;
pub mod retry;
#[cfg(feature = "s3")]
pub mod s3;
mod sources;
mod stats;
mod store;
pub mod url;

pub mod blocking;

pub use config::{DEFAULT_MIN_THROUGHPUT, DEFAULT_TIMEOUT, StoreConfig};
pub use copy::copy_to_file;
pub use error::{BoxError, Result, StoreError};
pub use gate::{
    Connection, DEFAULT_CONNECTIONS, DEFAULT_MAX_PARALLEL, DEFAULT_PART_SIZE, Gate, Parallelism,
    PartFn, ReadCheck,
};
pub use http::HttpStore;
pub use local::LocalStore;
pub use parallel::{ReadChecked, digest_mismatch, read_parts};
pub use range::{deadline, split_parts};
pub use read::{BoxFuture, Head, RangeRead, ReadOptions, read_signature};
pub use refetch::{Attempt, MAX_REFETCHES, until_verified};
pub use retry::{MAX_WAIT, RetryPolicy};
pub use sources::{SourceReport, Sources};
pub use stats::{Counted, Meter, Moved, NetStats, bump};
pub use store::{FEATURES, Store};
pub use url::is_remote;

impl StoreError {
    /// Whether no HTTP conversation with the server was possible (nothing
    /// listening, DNS, TLS): the operation could not run at all.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            StoreError::Transport {
                no_conversation: true,
                ..
            }
        )
    }

    /// Whether the request ran out of time (a stall, a drip, no answer).
    pub fn is_timeout(&self) -> bool {
        matches!(self, StoreError::Transport { timeout: true, .. })
    }
}
