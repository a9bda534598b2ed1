//! [`AsyncReader`]: the reader for tokio services (feature `tokio`). Every
//! call is a future that does its I/O on the caller's runtime; dropping a
//! future cancels its requests, and the reader stays usable. Share one
//! reader across tasks by cloning it (a cheap `Arc`). The blocking
//! [`crate::Reader`] wraps these same handles.

use std::sync::Arc;

use bytes::Bytes;
use gkq_format::Block;

use crate::config::{ReaderConfig, Serve};
use crate::error::Result;
use crate::inner::{EmbeddingCore, Inner, LmHeadCore, ids_u64};
use crate::lmhead::Matrix;
use crate::pull::{Pull, PullPlan};
use crate::resolve::Resolution;
use crate::rows::Rows;

/// An opened model, for async callers.
#[derive(Clone)]
pub struct AsyncReader {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for AsyncReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncReader")
            .field("knot", &self.inner.knot.location())
            .finish_non_exhaustive()
    }
}

impl AsyncReader {
    crate::faces::reader_accessors!();

    /// Opens a knot (a path, a package directory, or an `http(s)://` or
    /// `s3://` URL) for the roles `serve` names. The header is read with
    /// one range request (none when `knot_id` pins a header in the disk
    /// cache); each role served is resolved here (a HEAD of its row file).
    pub async fn open(location: &str, config: ReaderConfig, serve: Serve) -> Result<AsyncReader> {
        let inner = Inner::open(location, config, serve).await?;
        Ok(AsyncReader {
            inner: Arc::new(inner),
        })
    }

    fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// The input embedding, if this reader serves the input role.
    pub fn embedding(&self) -> Result<AsyncEmbedding<'_>> {
        Ok(AsyncEmbedding {
            inner: &self.inner,
            core: self.inner.embedding()?,
        })
    }

    /// The lm_head, if this reader serves the output role.
    pub fn lm_head(&self) -> Result<AsyncLmHead<'_>> {
        Ok(AsyncLmHead {
            inner: &self.inner,
            core: self.inner.lm_head()?,
        })
    }

    /// Resolves any tensor of the knot with this reader's columnar URL.
    pub async fn resolve(&self, tensor: &str) -> Result<Resolution> {
        self.inner.resolve(tensor).await
    }

    /// The raw payload of a block (dense bytes, or spectral factors
    /// untouched), sha256-checked.
    pub async fn block_payload(&self, tensor: &str) -> Result<Bytes> {
        self.inner.block_payload(tensor).await
    }

    /// The values of a block as dense bytes in its dtype (a spectral block
    /// reconstructed as docs/FORMAT.md section 5 says), sha256-checked,
    /// with the block (alias followed) for its dtype and shape.
    pub async fn block_values(&self, tensor: &str) -> Result<(Block, Bytes)> {
        self.inner.block_values(tensor).await
    }

    /// A companion file of the package (`config.json`, `tokenizer.json`,
    /// …), checked against the digest the knot records.
    pub async fn package_file(&self, name: &str) -> Result<Bytes> {
        self.inner.package_file(name).await
    }

    /// Starts pulling `plan` (blocks and the lm_head, in first-use order,
    /// in parallel with bounded memory); take the items with [`Pull::next`].
    /// Must be called inside a tokio runtime.
    pub fn pull(&self, plan: PullPlan) -> Pull {
        Pull::start(self.inner.clone(), plan)
    }
}

/// Embedding lookups of an [`AsyncReader`].
#[derive(Clone, Copy)]
pub struct AsyncEmbedding<'r> {
    pub(crate) inner: &'r Arc<Inner>,
    pub(crate) core: &'r EmbeddingCore,
}

impl std::fmt::Debug for AsyncEmbedding<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncEmbedding").finish_non_exhaustive()
    }
}

impl AsyncEmbedding<'_> {
    crate::faces::embedding_accessors!();

    fn core(&self) -> &EmbeddingCore {
        self.core
    }

    /// The rows of `ids` (`u32` as tokenizers give them, or `u64`) in
    /// request order; ids are checked against the vocabulary first.
    pub async fn rows<I: Into<u64> + Copy>(&self, ids: &[I]) -> Result<Rows> {
        self.inner.rows(&ids_u64(ids)).await
    }

    /// Fetches rows into the cache ahead of the lookup: "tokenize, dedupe,
    /// issue range fetches in parallel before the embed lookup".
    pub async fn prefetch<I: Into<u64> + Copy>(&self, ids: &[I]) -> Result<()> {
        self.inner.prefetch(&ids_u64(ids)).await
    }

    /// Seeds the row cache with the package's warm object (FORMAT.md 7d:
    /// the publisher's warm rows and what verifies them, one range
    /// request; none when the disk cache holds them). A warm object that is
    /// missing or fails is reported in the result, not an error: its rows
    /// come on demand.
    pub async fn warm(&self) -> Result<crate::columnar::WarmReport> {
        self.inner.warm().await
    }
}

/// The lm_head of an [`AsyncReader`].
#[derive(Clone, Copy)]
pub struct AsyncLmHead<'r> {
    pub(crate) inner: &'r Arc<Inner>,
    pub(crate) core: &'r LmHeadCore,
}

impl std::fmt::Debug for AsyncLmHead<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncLmHead").finish_non_exhaustive()
    }
}

impl AsyncLmHead<'_> {
    crate::faces::lm_head_accessors!();

    fn core(&self) -> &LmHeadCore {
        self.core
    }

    /// Starts pulling the matrix on a task of `runtime` (prefill can run on
    /// columnar rows meanwhile). Idempotent.
    pub(crate) fn start_on(&self, runtime: &tokio::runtime::Handle) {
        let mut bg = gkq_store::blocking::lock(&self.core.background);
        if bg.is_none() && !self.core.is_resident() {
            let inner = self.inner.clone();
            *bg = Some(runtime.spawn(async move { inner.lm_head_matrix().await }));
        }
    }

    /// Starts pulling the matrix on a task of the current runtime (prefill
    /// can run on columnar rows meanwhile). Idempotent.
    pub fn start_background(&self) {
        self.start_on(&tokio::runtime::Handle::current());
    }

    /// The resident matrix, pulled once (concurrent callers and a background
    /// pull share one pull).
    pub async fn matrix(&self) -> Result<Arc<Matrix>> {
        self.inner.lm_head_matrix().await
    }

    /// Logits `[n, vocab]` for hidden states `[n, hidden]` (feature `candle`).
    #[cfg(feature = "candle")]
    pub async fn logits(&self, hidden: &candle_core::Tensor) -> Result<candle_core::Tensor> {
        let m = self.matrix().await?;
        m.logits(hidden)
    }

    /// The argmax token of each row of `hidden` (feature `candle`).
    #[cfg(feature = "candle")]
    pub async fn argmax(&self, hidden: &candle_core::Tensor) -> Result<Vec<u32>> {
        crate::rows::argmax(&self.logits(hidden).await?)
    }
}
