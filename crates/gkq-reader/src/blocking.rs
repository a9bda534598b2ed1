//! [`Reader`]: the blocking facade for the CLIs and sync callers. It owns a
//! small runtime ([`gkq_store::blocking`]) and wraps the async handles
//! ([`crate::AsyncReader`] and its roles), driving their futures to
//! completion; the accessors both share are declared once
//! (`crate::faces`). Called from inside a tokio runtime, every call returns
//! `StoreError::InsideRuntime` naming the async call to use instead; it
//! never panics there, and it may be dropped anywhere.

use std::sync::Arc;

use bytes::Bytes;
use gkq_format::Block;
use gkq_store::blocking::Runtime;

use crate::async_api::{AsyncEmbedding, AsyncLmHead, AsyncReader};
use crate::config::{ReaderConfig, Serve};
use crate::error::Result;
use crate::inner::{EmbeddingCore, Inner, LmHeadCore};
use crate::lmhead::Matrix;
use crate::pull::{Pull, PullItem, PullPlan, Pulled};
use crate::resolve::Resolution;
use crate::rows::Rows;

/// An opened model: the knot, and the roles this node serves.
pub struct Reader {
    rt: Arc<Runtime>,
    asy: AsyncReader,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("knot", &self.asy.inner.knot.location())
            .finish_non_exhaustive()
    }
}

/// Runs `f` on `rt` for the blocking `call` (`instead`: its async twin).
fn block<T>(
    rt: &Runtime,
    (call, instead): (&'static str, &'static str),
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    rt.block_on(call, instead, f)?
}

impl Reader {
    crate::faces::reader_accessors!();

    /// Opens a knot (a path, a package directory, or an `http(s)://` or
    /// `s3://` URL) for the roles `serve` names. Remotely the header is
    /// read with one range request (none when `knot_id` pins a header in
    /// the disk cache); each role served is resolved here (a HEAD of its
    /// row file).
    pub fn open(location: &str, config: ReaderConfig, serve: Serve) -> Result<Reader> {
        const CALL: (&str, &str) = ("Reader::open", "AsyncReader::open");
        let rt = Runtime::new(CALL.0, CALL.1)?;
        let asy = block(&rt, CALL, AsyncReader::open(location, config, serve))?;
        Ok(Reader {
            rt: Arc::new(rt),
            asy,
        })
    }

    fn inner(&self) -> &Arc<Inner> {
        &self.asy.inner
    }

    /// The async reader this one drives (for code that mixes both).
    pub fn as_async(&self) -> &AsyncReader {
        &self.asy
    }

    /// The input embedding, if this node serves the input role.
    pub fn embedding(&self) -> Result<Embedding<'_>> {
        Ok(Embedding {
            rt: &self.rt,
            asy: self.asy.embedding()?,
        })
    }

    /// The lm_head, if this node serves the output role.
    pub fn lm_head(&self) -> Result<LmHead<'_>> {
        Ok(LmHead {
            rt: &self.rt,
            asy: self.asy.lm_head()?,
        })
    }

    /// Resolves any tensor of the knot with this reader's columnar URL.
    pub fn resolve(&self, tensor: &str) -> Result<Resolution> {
        let call = ("Reader::resolve", "AsyncReader::resolve");
        block(&self.rt, call, self.asy.resolve(tensor))
    }

    /// The raw payload of a block (dense bytes, or spectral factors
    /// untouched), sha256-checked.
    pub fn block_payload(&self, tensor: &str) -> Result<Bytes> {
        let call = ("Reader::block_payload", "AsyncReader::block_payload");
        block(&self.rt, call, self.asy.block_payload(tensor))
    }

    /// The values of a block as dense bytes in its dtype (a spectral block
    /// reconstructed as docs/FORMAT.md section 5 says), sha256-checked,
    /// with the block (alias followed) for its dtype and shape.
    pub fn block_values(&self, tensor: &str) -> Result<(Block, Bytes)> {
        let call = ("Reader::block_values", "AsyncReader::block_values");
        block(&self.rt, call, self.asy.block_values(tensor))
    }

    /// A companion file of the package (`config.json`, `tokenizer.json`,
    /// …), checked against the digest the knot records.
    pub fn package_file(&self, name: &str) -> Result<Bytes> {
        let call = ("Reader::package_file", "AsyncReader::package_file");
        block(&self.rt, call, self.asy.package_file(name))
    }

    /// Starts pulling `plan` in the background (blocks and the lm_head, in
    /// first-use order, in parallel, with bounded memory); take the items
    /// in order by iterating over the [`BlockingPull`].
    pub fn pull(&self, plan: PullPlan) -> BlockingPull {
        let _in = self.rt.handle().enter();
        BlockingPull {
            rt: self.rt.clone(),
            pull: self.asy.pull(plan),
        }
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
    rt: &'r Runtime,
    asy: AsyncEmbedding<'r>,
}

impl std::fmt::Debug for Embedding<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedding").finish_non_exhaustive()
    }
}

impl Embedding<'_> {
    crate::faces::embedding_accessors!();

    fn core(&self) -> &EmbeddingCore {
        self.asy.core
    }

    /// The rows of `ids` (`u32` or `u64`) in request order; ids are checked
    /// against the vocabulary before anything is fetched.
    pub fn rows<I: Into<u64> + Copy>(&self, ids: &[I]) -> Result<Rows> {
        let call = ("Embedding::rows", "AsyncEmbedding::rows");
        block(self.rt, call, self.asy.rows(ids))
    }

    /// Fetches rows into the cache ahead of the lookup (a no-op on the dense path).
    pub fn prefetch<I: Into<u64> + Copy>(&self, ids: &[I]) -> Result<()> {
        let call = ("Embedding::prefetch", "AsyncEmbedding::prefetch");
        block(self.rt, call, self.asy.prefetch(ids))
    }

    /// Seeds the row cache with the package's warm object (see
    /// `AsyncEmbedding::warm`).
    pub fn warm(&self) -> Result<crate::columnar::WarmReport> {
        let call = ("Embedding::warm", "AsyncEmbedding::warm");
        block(self.rt, call, self.asy.warm())
    }
}

/// The output projection of a node that serves the output role.
#[derive(Clone, Copy)]
pub struct LmHead<'r> {
    rt: &'r Runtime,
    asy: AsyncLmHead<'r>,
}

impl std::fmt::Debug for LmHead<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LmHead")
            .field("resident", &self.is_resident())
            .finish_non_exhaustive()
    }
}

impl LmHead<'_> {
    crate::faces::lm_head_accessors!();

    fn core(&self) -> &LmHeadCore {
        self.asy.core
    }

    /// Starts pulling the matrix in the background (prefill can run on
    /// columnar rows meanwhile). Idempotent.
    pub fn start_background(&self) {
        self.asy.start_on(self.rt.handle());
    }

    /// The resident matrix: waits for a background pull, or pulls now.
    pub fn matrix(&self) -> Result<Arc<Matrix>> {
        let call = ("LmHead::matrix", "AsyncLmHead::matrix");
        block(self.rt, call, self.asy.matrix())
    }

    /// Logits `[n, vocab]` for hidden states `[n, hidden]` (feature `candle`).
    #[cfg(feature = "candle")]
    pub fn logits(&self, hidden: &candle_core::Tensor) -> Result<candle_core::Tensor> {
        let call = ("LmHead::logits", "AsyncLmHead::logits");
        block(self.rt, call, self.asy.logits(hidden))
    }

    /// The argmax token of each row of `hidden` (feature `candle`).
    #[cfg(feature = "candle")]
    pub fn argmax(&self, hidden: &candle_core::Tensor) -> Result<Vec<u32>> {
        let call = ("LmHead::argmax", "AsyncLmHead::argmax");
        block(self.rt, call, self.asy.argmax(hidden))
    }
}
