//! `gkq-store`: the one place where bytes move over the network.
//!
//! [`Http`] is a blocking client for strict range reads: HTTPS with HTTP/2
//! negotiated by ALPN (every request to an origin multiplexed over one
//! connection) and HTTP/1.1 keep-alive where the server does not offer h2;
//! trust in the system store (which honours `SSL_CERT_FILE`) plus extra CA
//! files; `HTTPS_PROXY`/`NO_PROXY` from the environment; retries with
//! backoff on transient failures; counters of requests, payload and header
//! bytes, and connections opened. The reader and `gkq-verify` both use it.

mod error;
pub mod http;
#[cfg(feature = "s3")]
pub mod s3;
mod store;
#[cfg(feature = "s3")]
pub mod upload;

pub use error::{Result, StoreError};
pub use http::{Head, Http, HttpConfig, NetStats};
pub use store::{Store, is_remote};
