//! `gkq-store`: the one place where bytes move.
//!
//! - [`RangeRead`] is the trait of every backend: HTTP(S) ([`HttpStore`]:
//!   HTTP/2 by ALPN with one multiplexed connection for small reads and
//!   several for bulk parts, HTTP/1.1 keep-alive otherwise; rustls with the
//!   system store plus `--ca-cert` files; `HTTPS_PROXY`/`NO_PROXY`), S3
//!   (feature `s3`: ranged `GetObject` of private buckets), and local files
//!   (positioned reads). Every read is strict: exactly the range asked
//!   for, or an error naming the location and the range.
//! - [`Store`] routes a location to its backend by scheme, counts what it
//!   moves ([`NetStats`]), and reads large ranges in parallel verified
//!   parts ([`Store::read_checked`], [`Check`]).
//! - Each request is retried on transient failures ([`RetryPolicy`],
//!   `Retry-After` honoured) and has a deadline scaled to its bytes
//!   ([`StoreConfig::min_throughput`]).
//! - The core is async (tokio); [`blocking::Runtime`] is the facade that
//!   blocking APIs (the CLIs, `gkq-verify`, sync users of the reader) drive.
//! - `upload` (feature `s3`): publishing to R2 with the AWS SDK.

mod config;
mod error;
mod http;
mod local;
mod parallel;
mod range;
mod read;
mod retry;
#[cfg(feature = "s3")]
pub mod s3;
mod stats;
mod store;
#[cfg(feature = "s3")]
pub mod upload;
pub mod url;

pub mod blocking;

pub use config::{
    DEFAULT_CONNECTIONS, DEFAULT_MAX_PARALLEL, DEFAULT_MIN_THROUGHPUT, DEFAULT_PART_SIZE,
    Parallelism, StoreConfig,
};
pub use error::{BoxError, Result, StoreError};
pub use http::HttpStore;
pub use local::LocalStore;
pub use parallel::{Check, Gate, PartFn, read_parts};
pub use range::{deadline, split_parts};
pub use read::{BoxFuture, Head, Lane, RangeRead, ReadOptions};
pub use retry::{MAX_WAIT, RetryPolicy};
pub use stats::NetStats;
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
}
