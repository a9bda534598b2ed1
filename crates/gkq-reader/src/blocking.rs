//! [`Reader`]: the blocking facade over the async core, for the CLIs and
//! for sync callers. It owns a small runtime ([`gkq_store::blocking`]) and
//! drives the same futures as [`crate::AsyncReader`] to completion. Called
//! from inside a tokio runtime, every call returns
//! `StoreError::InsideRuntime` naming the async call to use instead; it
//! never panics there, and it may be dropped anywhere.

use std::sync::Arc;

use bytes::Bytes;
use gkq_format::Block;
use gkq_store::NetStats;
use gkq_store::blocking::Runtime;

use crate::cache::DiskStats;
use crate::columnar::{CacheStats, ColumnarEmbedBackend};
use crate::config::{ReaderConfig, Serve};
use crate::error::Result;
use crate::inner::{EmbeddingCore, Inner, LmHeadCore, ids_u64};
use crate::knot::KnotHandle;
use crate::lmhead::Matrix;
use crate::pull::{Pull, PullItem, PullPlan, Pulled};
use crate::resolve::Resolution;
use crate::rows::Rows;

/// An opened model: the knot, and the roles this node serves.
pub struct Reader {
    rt: Arc<Runtime>,
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("knot", &self.inner.knot.location())
            .finish_non_exhaustive()
    }
}

impl Reader {
    /// Opens a knot (a path, a package directory, or an `http(s)://` or
    /// `s3://` URL) for the roles `serve` names. Remotely the header is
    /// read with one range request (none when `knot_id` pins a header in
    /// the disk cache); with the input role the embedding is resolved here
    /// (one HEAD of the row file).
    pub fn open(location: &str, config: ReaderConfig, serve: Serve) -> Result<Reader> {
        const CALL: (&str, &str) = ("Reader::open", "AsyncReader::open");
        let rt = Runtime::new(CALL.0, CALL.1)?;
        let inner = rt.block_on(CALL.0, CALL.1, Inner::open(location, config, serve))??;
        Ok(Reader {
            rt: Arc::new(rt),
            inner: Arc::new(inner),
        })
    }

    fn block<T>(
        &self,
        call: (&'static str, &'static str),
        f: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        self.rt.block_on(call.0, call.1, f)?
    }

    /// The knot.
    pub fn knot(&self) -> &KnotHandle {
        &self.inner.knot
    }

    /// The knot id (hex of its `header_sha256`).
    pub fn knot_id(&self) -> String {
        self.inner.knot_id()
    }

    /// The input embedding, if this node serves the input role.
    pub fn embedding(&self) -> Result<Embedding<'_>> {
        Ok(Embedding {
            r: self,
            core: self.inner.embedding()?,
        })
    }

    /// The lm_head, if this node serves the output role.
    pub fn lm_head(&self) -> Result<LmHead<'_>> {
        Ok(LmHead {
            r: self,
            core: self.inner.lm_head()?,
        })
    }

    /// Resolves any tensor of the knot with this reader's columnar URL.
    pub fn resolve(&self, tensor: &str) -> Result<Resolution> {
        self.block(
            ("Reader::resolve", "AsyncReader::resolve"),
            self.inner.resolve(tensor),
        )
    }

    /// The raw payload of a block (dense bytes, or spectral factors
    /// untouched), sha256-checked.
    pub fn block_payload(&self, tensor: &str) -> Result<Bytes> {
        let call = ("Reader::block_payload", "AsyncReader::block_payload");
        self.block(call, self.inner.block_payload(tensor))
    }

    /// The values of a block as dense bytes in its dtype (a spectral block
    /// reconstructed as docs/FORMAT.md section 5 says), sha256-checked,
    /// with the block (alias followed) for its dtype and shape.
    pub fn block_values(&self, tensor: &str) -> Result<(Block, Bytes)> {
        let call = ("Reader::block_values", "AsyncReader::block_values");
        self.block(call, self.inner.block_values(tensor))
    }

    /// A companion file of the package (`config.json`, `tokenizer.json`,
    /// …), checked against the digest the knot records.
    pub fn package_file(&self, name: &str) -> Result<Bytes> {
        let call = ("Reader::package_file", "AsyncReader::package_file");
        self.block(call, self.inner.package_file(name))
    }

    /// Starts pulling `plan` in the background (blocks and the lm_head, in
    /// first-use order, in parallel, with bounded memory); take the items
    /// in order by iterating over the [`BlockingPull`].
    pub fn pull(&self, plan: PullPlan) -> BlockingPull {
        let _in = self.rt.handle().enter();
        BlockingPull {
            rt: self.rt.clone(),
            pull: Pull::start(self.inner.clone(), plan),
        }
    }

    /// Network counters of everything this reader fetched.
    pub fn net_stats(&self) -> NetStats {
        self.inner.store.stats()
    }

    /// Counters of the persistent cache (zero without one).
    pub fn disk_stats(&self) -> DiskStats {
        self.inner
            .disk
            .as_ref()
            .map(|d| d.stats())
            .unwrap_or_default()
    }
}

/// A running pull of a blocking [`Reader`].
pub struct BlockingPull {
    rt: Arc<Runtime>,
    pull: Pull,
}

impl std::fmt::Debug for BlockingPull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingPull").finish_non_exhaustive()
    }
}

/// The items in plan order, each once it is verified.
impl Iterator for BlockingPull {
    type Item = Result<(PullItem, Pulled)>;

    fn next(&mut self) -> Option<Self::Item> {
        let r = self
            .rt
            .block_on("BlockingPull::next", "Pull::next", self.pull.next());
        match r {
            Ok(Ok(Some(item))) => Some(Ok(item)),
            Ok(Ok(None)) => None,
            Ok(Err(e)) => Some(Err(e)),
            Err(e) => Some(Err(e.into())),
        }
    }
}

/// Input embedding lookups of a node that serves the input role.
#[derive(Clone, Copy)]
pub struct Embedding<'r> {
    r: &'r Reader,
    core: &'r EmbeddingCore,
}

impl std::fmt::Debug for Embedding<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedding").finish_non_exhaustive()
    }
}

impl Embedding<'_> {
    /// The current resolution (it changes to dense if the row file turns
    /// out unusable).
    pub fn resolution(&self) -> Resolution {
        self.core.resolution()
    }

    /// Rows of the embedding (the vocabulary size).
    pub fn vocab(&self) -> u64 {
        self.core.vocab()
    }

    /// The columnar backend, when that is the current path.
    pub fn columnar(&self) -> Option<ColumnarEmbedBackend> {
        self.core.columnar()
    }

    /// Row cache counters (zero on the dense path).
    pub fn cache_stats(&self) -> CacheStats {
        self.core.cache_stats()
    }

    /// Bytes the embedding moved over the network so far: rows and their
    /// proofs, or the dense block.
    pub fn fetched_bytes(&self) -> u64 {
        self.core.fetched_bytes()
    }

    /// The rows of `ids` (`u32` or `u64`) in request order; ids are checked
    /// against the vocabulary before anything is fetched.
    pub fn rows<I: Into<u64> + Copy>(&self, ids: &[I]) -> Result<Rows> {
        let call = ("Embedding::rows", "AsyncEmbedding::rows");
        self.r.block(call, self.r.inner.rows(&ids_u64(ids)))
    }

    /// Fetches rows into the cache ahead of the lookup (a no-op on the dense path).
    pub fn prefetch<I: Into<u64> + Copy>(&self, ids: &[I]) -> Result<()> {
        let call = ("Embedding::prefetch", "AsyncEmbedding::prefetch");
        self.r.block(call, self.r.inner.prefetch(&ids_u64(ids)))
    }

    /// Preloads a warm set of hot token ids.
    pub fn warm<I: Into<u64> + Copy>(&self, ids: &[I]) -> Result<()> {
        self.prefetch(ids)
    }
}

/// The output projection of a node that serves the output role.
#[derive(Clone, Copy)]
pub struct LmHead<'r> {
    r: &'r Reader,
    core: &'r LmHeadCore,
}

impl std::fmt::Debug for LmHead<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LmHead")
            .field("resident", &self.is_resident())
            .finish_non_exhaustive()
    }
}

impl LmHead<'_> {
    /// How the lm_head is pulled (row file or block), and why.
    pub fn resolution(&self) -> Resolution {
        self.core.resolution()
    }

    /// Whether the matrix is resident.
    pub fn is_resident(&self) -> bool {
        self.core.is_resident()
    }

    /// Bytes the lm_head pull moved over the network.
    pub fn fetched_bytes(&self) -> u64 {
        self.core.fetched_bytes()
    }

    /// Starts pulling the matrix in the background (prefill can run on
    /// columnar rows meanwhile). Idempotent.
    pub fn start_background(&self) {
        let mut bg = self
            .core
            .background
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if bg.is_none() && !self.core.is_resident() {
            let inner = self.r.inner.clone();
            let task = self
                .r
                .rt
                .handle()
                .spawn(async move { inner.lm_head_matrix().await });
            *bg = Some(task);
        }
    }

    /// The resident matrix: waits for a background pull, or pulls now.
    pub fn matrix(&self) -> Result<Arc<Matrix>> {
        let call = ("LmHead::matrix", "AsyncLmHead::matrix");
        self.r.block(call, self.r.inner.lm_head_matrix())
    }

    /// Logits `[n, vocab]` for hidden states `[n, hidden]` (feature `candle`).
    #[cfg(feature = "candle")]
    pub fn logits(&self, hidden: &candle_core::Tensor) -> Result<candle_core::Tensor> {
        crate::rows::logits_with(self.matrix()?.weights()?, hidden)
    }

    /// The argmax token of each row of `hidden` (feature `candle`).
    #[cfg(feature = "candle")]
    pub fn argmax(&self, hidden: &candle_core::Tensor) -> Result<Vec<u32>> {
        Ok(self
            .logits(hidden)?
            .argmax(candle_core::D::Minus1)?
            .to_vec1::<u32>()?)
    }
}
