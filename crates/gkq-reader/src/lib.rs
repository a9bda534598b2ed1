//! `gkq-reader`: the runtime side of GKQ v2, embedded by inference nodes.
//!
//! A node opens a published model by the URL of its knot, and reads:
//! - **embedding rows** for the token ids of a session, each row fetched
//!   by range from the row file and verified against the knot's Merkle root
//!   before it is used (FORMAT.md 7a), with an in-memory LRU;
//! - **the lm_head**, pulled once and kept resident (from the narrowest
//!   row file that widens to it exactly, verified chunk by chunk);
//! - **any block** (a layer's weights), read in parallel parts and checked
//!   against its sha256; [`PullPlan`] pulls a set of them in first-use
//!   order so that compute can start on the first while the rest arrive;
//! - **companion files** (`config.json`, `tokenizer.json`), checked
//!   against the digests the knot records.
//!
//! Nothing unverified is ever returned. With [`CacheConfig::dir`] set,
//! what was pulled persists on disk, content-addressed and verified again
//! on every read, so a restart moves only the knot header (or nothing, with
//! [`ReaderConfig::knot_id`] pinned).
//!
//! # Two APIs over one core
//!
//! The I/O core is async (tokio, through `gkq-store`):
//! - [`AsyncReader`] (feature `tokio`, on by default) is for tokio services:
//!   every call is a future on the caller's runtime, cancelled by dropping
//!   it; clone the reader to share it across tasks.
//! - [`Reader`] is the blocking facade for CLIs and sync programs: it owns
//!   a small runtime and drives the same futures. Called from inside a
//!   tokio runtime it returns an error naming the async call to use; it
//!   never panics there.
//!
//! Features: `tokio` (the async API), `candle` (`Rows::to_tensor`, lm_head
//! logits; re-exports `candle_core`), `s3` (`s3://` URLs of private
//! buckets). The flags a runtime flattens into its CLI are gkq-cli's.
//! The library prints nothing: it emits `tracing` spans and events (open,
//! resolutions and their reasons, pulls with bytes and time, retries,
//! cache hits and misses, verification failures).
//!
//! # Example
//!
//! A node that serves both roles of a model published at a base URL (the
//! whole program; `examples/sync_node.rs` runs it against nginx in the tests):
//!
//! ```no_run
//! use gkq_reader::{PathKind, Reader, ReaderConfig, Serve};
//!
//! fn main() -> Result<(), gkq_reader::ReaderError> {
//!     let base = "https://models.example.com/qwen2.5-0.5b/v1";
//!     let config = ReaderConfig {
//!         // the package's base URL: the reader picks the narrowest exact row file
//!         columnar_embed: Some(format!("{base}/")),
//!         ..ReaderConfig::with_default_cache()
//!     };
//!     let reader = Reader::open(&format!("{base}/model.knot"), config, Serve::ALL)?;
//!
//!     // The input role: rows for the prompt's token ids (u32, as tokenizers give them).
//!     let emb = reader.embedding()?;
//!     assert_eq!(emb.resolution().kind(), PathKind::Columnar);
//!     let ids: [u32; 4] = [17, 42, 17, 900];
//!     emb.prefetch(&ids)?; // tokenize, dedupe, fetch in parallel before the lookup
//!     let rows = emb.rows(&ids)?; // verified rows, in request order
//!     let x: Vec<f32> = rows.to_f32()?; // [4 × hidden]
//!     assert_eq!(x.len(), 4 * rows.cols());
//!
//!     // The output role: lm_head pulled once in the background, then resident.
//!     let lm = reader.lm_head()?;
//!     lm.start_background();
//!     let m = lm.matrix()?; // waits for the pull
//!     println!("lm_head {} x {} ({}): {}", m.rows(), m.cols(), m.dtype(), lm.resolution().reason());
//!     Ok(())
//! }
//! ```

// always built: the blocking facade wraps these handles; public with `tokio`
#[cfg_attr(not(feature = "tokio"), allow(unreachable_pub, dead_code))]
mod async_api;
mod blocking;
mod cache;
mod columnar;
mod config;
mod error;
mod faces;
mod fallback;
mod inner;
mod knot;
mod lmhead;
mod proof;
mod pull;
#[cfg(feature = "candle")]
mod qmatrix;
pub mod ranges;
mod reason;
mod resolve;
mod rows;
mod verified;

#[cfg(feature = "tokio")]
pub use async_api::{AsyncEmbedding, AsyncLmHead, AsyncReader};
pub use blocking::{BlockingPull, Embedding, LmHead, Reader};
pub use cache::{
    CacheConfig, DEFAULT_CACHE_MAX_BYTES, DiskStats, STALE_TMP_AGE, default_cache_dir,
};
pub use columnar::DEFAULT_CACHE_ROWS;
pub use columnar::{CacheStats, ColumnarEmbedBackend, FetchConfig, WarmReport, WarmUnused};
pub use config::{PullProgress, ReaderConfig, Serve, with_timeout};
pub use error::{ReaderError, Result};
pub use gkq_store::{NetStats, StoreConfig};
pub use knot::{FIRST_FETCH, KnotHandle, Trusted, is_url};
pub use lmhead::Matrix;
pub use pull::{DEFAULT_PULL_BUDGET, Pull, PullItem, PullPlan, Pulled};
pub use resolve::{
    Checked, Choice, ColumnarPath, DenseCause, NoRuns, PathKind, ReadPath, Resolution,
};
pub use rows::Rows;
#[cfg(feature = "candle")]
pub use {candle_core, qmatrix::QMatrix, rows::logits_with};
