//! The async core shared by [`crate::AsyncReader`] and the blocking
//! [`crate::Reader`]: the opened knot, the store and the disk cache, and
//! the state of the two roles (each with its resolution and a meter of
//! what it moved; the embedding's row backend; the lm_head's resident
//! matrix).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use gkq_format::{Block, Encoding, KnotHeader, keys};
use gkq_store::blocking::lock;
use gkq_store::{Meter, Store};
use tokio::sync::OnceCell;

use crate::cache::DiskCache;
use crate::columnar::{ColumnarEmbedBackend, WarmReport, WarmUnused};
use crate::config::{ReaderConfig, Serve};
use crate::error::{ReaderError, Result};
use crate::knot::KnotHandle;
use crate::lmhead::Matrix;
use crate::resolve::{PathKind, Resolution, Use, Want, resolve_role};
use crate::rows::Rows;

struct EmbedState {
    resolution: Resolution,
    /// The row backend while the columnar path is taken.
    source: Option<ColumnarEmbedBackend>,
    /// The row backend even after a fallback, for its counters.
    backend: Option<ColumnarEmbedBackend>,
}

/// The input role: embedding lookups.
pub(crate) struct EmbeddingCore {
    pub(crate) index: usize,
    block: Block,
    state: Mutex<EmbedState>,
    dense: OnceCell<Bytes>,
    /// What the dense block's read moved.
    meter: Meter,
    require_columnar: bool,
    /// What the last warm-up did.
    warmed: Mutex<Option<WarmReport>>,
}

/// The output role: the lm_head.
pub(crate) struct LmHeadCore {
    index: usize,
    /// The same block as the embedding's (an alias of it).
    pub(crate) tied: bool,
    resolution: Mutex<Resolution>,
    pub(crate) resident: OnceCell<Arc<Matrix>>,
    pub(crate) background: Mutex<Option<tokio::task::JoinHandle<Result<Arc<Matrix>>>>>,
    /// What the lm_head's pull moved.
    meter: Meter,
}

/// An opened model.
pub(crate) struct Inner {
    pub(crate) knot: KnotHandle,
    pub(crate) store: Arc<Store>,
    pub(crate) disk: Option<Arc<DiskCache>>,
    pub(crate) config: ReaderConfig,
    pub(crate) embedding: Option<EmbeddingCore>,
    pub(crate) lm_head: Option<LmHeadCore>,
}

/// Token ids as the core takes them (`u32` from tokenizers, or `u64`).
pub(crate) fn ids_u64<I: Into<u64> + Copy>(ids: &[I]) -> Vec<u64> {
    ids.iter().map(|&i| i.into()).collect()
}

/// The disk cache `c` names: an explicit directory that cannot be used is
/// an error naming it; the default one is a warning, and the reader runs
/// uncached (the cache is best effort, never a failure of the read).
fn open_cache(c: &crate::cache::CacheConfig) -> Result<Option<Arc<DiskCache>>> {
    let Some(dir) = &c.dir else { return Ok(None) };
    match DiskCache::open(dir, c.max_bytes) {
        Ok(d) => Ok(Some(Arc::new(d))),
        Err(error) if c.explicit => Err(ReaderError::CacheDir {
            path: dir.clone(),
            error,
        }),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "the default cache directory cannot be used: running without a disk cache (set --cache-dir to a writable directory, or --no-cache to silence this)");
            Ok(None)
        }
    }
}

/// Spreads the reads of the package at `location` over its mirrors; the
/// header reads too when `trusted` (trust that does not depend on the
/// channel: a pinned id, or trusted keys).
fn set_mirrors(store: &Store, location: &str, mirrors: &[String], trusted: bool) -> Result<()> {
    if mirrors.is_empty() {
        return Ok(());
    }
    for m in mirrors {
        gkq_store::url::refuse_credentials(m)?;
        if !crate::knot::is_url(m) {
            return Err(ReaderError::Missing(format!(
                "--mirror {m}: not a URL (http://, https:// or s3://)"
            )));
        }
    }
    let knot = crate::knot::knot_location(location)?;
    if crate::knot::is_url(&knot) {
        let bare = gkq_store::url::without_query(&knot);
        let base = bare.rfind('/').map_or(bare, |i| &bare[..=i]);
        store.set_mirrors(base, mirrors, trusted);
    }
    Ok(())
}

fn role_block(header: &KnotHeader, key: &str, location: &str) -> Result<String> {
    header
        .header()
        .meta_str(key)
        .map(str::to_owned)
        .ok_or_else(|| {
            if key == keys::ROLE_LM_HEAD {
                ReaderError::NoLmHead {
                    location: location.to_owned(),
                }
            } else {
                ReaderError::Missing(format!("{location}: the knot has no {key} metadata"))
            }
        })
}

impl Inner {
    /// Opens a knot for the roles `serve` names (see [`crate::Reader::open`]).
    pub(crate) async fn open(location: &str, config: ReaderConfig, serve: Serve) -> Result<Inner> {
        config.check_row_source()?;
        let store = Arc::new(Store::new(config.store.clone())?);
        let trusted = config.knot_id.is_some() || !config.trust.is_empty();
        set_mirrors(&store, location, &config.mirrors, trusted)?;
        let disk = open_cache(&config.cache)?;
        let policy = crate::knot::Policy {
            pin: config.knot_id,
            keys: &config.trust,
            asked: crate::knot::asked(location, config.package.as_deref()),
        };
        let knot = KnotHandle::open(location, &*store, disk.as_deref(), &policy).await?;
        let mut inner = Inner {
            knot,
            store,
            disk,
            config,
            embedding: None,
            lm_head: None,
        };
        if serve.input {
            inner.embedding = Some(inner.open_embedding().await?);
            if inner.config.warm {
                inner.warm().await?;
            }
        }
        if serve.output {
            inner.lm_head = Some(inner.open_lm_head().await?);
        }
        Ok(inner)
    }

    fn embed_index(&self) -> Result<usize> {
        let name = role_block(
            self.knot.header(),
            keys::ROLE_TOKEN_EMBD,
            self.knot.location(),
        )?;
        self.knot.index(&name)
    }

    /// The lm_head: its resolution (the narrowest exact source) and, when
    /// tied to the embedding, the matrix the two share.
    async fn open_lm_head(&self) -> Result<LmHeadCore> {
        let embed = self.embed_index()?;
        let name = role_block(self.knot.header(), keys::ROLE_LM_HEAD, self.knot.location())?;
        let index = self.knot.index(&name)?;
        let blocks = &self.knot.header().header().blocks;
        let tied = matches!(blocks.get(index).map(|b| &b.encoding), Some(Encoding::Alias { target }) if *target as usize == embed);
        let want = Want {
            url: self.config.columnar_embed.as_deref(),
            dtype: self.config.lm_head_dtype.map(|d| (d, "--lm-head-dtype")),
            dense: self.config.dense,
        };
        let resolution = resolve_role(&self.knot, index, Use::Resident, want, &*self.store).await?;
        tracing::info!(lm_head = %name, path = ?resolution.kind(), reason = %resolution.reason(), "lm_head resolved");
        Ok(LmHeadCore {
            index,
            tied,
            resolution: Mutex::new(resolution),
            resident: OnceCell::new(),
            background: Mutex::new(None),
            meter: Meter::default(),
        })
    }

    async fn open_embedding(&self) -> Result<EmbeddingCore> {
        let index = self.embed_index()?;
        let (knot, config) = (&self.knot, &self.config);
        let want = Want {
            url: config.columnar_embed.as_deref(),
            dtype: config.embed_dtype.map(|d| (d, "--embed-dtype")),
            dense: config.dense,
        };
        let resolution = resolve_role(knot, index, Use::Rows, want, &*self.store).await?;
        if config.require_columnar && resolution.kind() != PathKind::Columnar {
            return Err(ReaderError::ColumnarRequired {
                reason: resolution.reason(),
                bytes: knot.header().payload_len(index),
            });
        }
        tracing::info!(knot = %knot.location(), tensor = %resolution.tensor, path = ?resolution.kind(), reason = %resolution.reason(), "embedding resolved");
        let h = knot.header().header();
        let source = match resolution.columnar() {
            Some(c) => Some(ColumnarEmbedBackend::new(
                (
                    c.url.clone(),
                    c.runs().map(str::to_owned),
                    h.has_warm(&c.desc.object).then(|| h.warm_rows()),
                ),
                c.desc.clone(),
                config.fetch.clone(),
                (self.store.clone(), Meter::default()),
                self.disk.clone(),
            )?),
            None => None,
        };
        Ok(EmbeddingCore {
            index,
            block: knot.data_block(index)?.clone(),
            state: Mutex::new(EmbedState {
                resolution,
                backend: source.clone(),
                source,
            }),
            dense: OnceCell::new(),
            meter: Meter::default(),
            require_columnar: config.require_columnar,
            warmed: Mutex::new(None),
        })
    }

    pub(crate) fn embedding(&self) -> Result<&EmbeddingCore> {
        self.embedding
            .as_ref()
            .ok_or(ReaderError::RoleNotServed("input"))
    }

    pub(crate) fn lm_head(&self) -> Result<&LmHeadCore> {
        self.lm_head
            .as_ref()
            .ok_or(ReaderError::RoleNotServed("output"))
    }

    fn disk(&self) -> Option<&DiskCache> {
        self.disk.as_deref()
    }

    /// The lm_head's matrix when it is the embedding's and its values are
    /// the block's exactly: then the embedding's rows come from it, and a
    /// tied model pulls its one matrix once for both roles.
    fn tied_exact(&self) -> Option<&LmHeadCore> {
        self.lm_head
            .as_ref()
            .filter(|l| l.tied && self.config.embed_dtype.is_none())
    }

    /// Rows of the embedding for `ids`, in request order.
    pub(crate) async fn rows(&self, ids: &[u64]) -> Result<Rows> {
        let e = self.embedding()?;
        e.check_ids(ids)?;
        // a resident tied matrix serves the rows with no request, unless a
        // row file was forced (--embed-dtype) or the matrix is not exact
        if let Some(m) = self
            .tied_exact()
            .and_then(|l| l.resident.get())
            .filter(|m| m.is_exact())
        {
            return e.slice_rows(&self.knot, (m.dtype(), m.byte_len()), |r| m.row(r), ids);
        }
        if let Some(b) = e.columnar() {
            match b.rows(ids).await {
                Ok(rows) => return Ok(Rows::new(b.dtype(), e.cols(), rows)),
                Err(err) if crate::fallback::falls_back(&err) => e.fall_back(&self.knot, &err)?,
                Err(err) => return Err(err),
            }
        }
        if self.tied_exact().is_some() {
            // the dense path of a tied model: the one matrix, pulled once
            let m = self.lm_head_matrix().await?;
            if m.is_exact() {
                return e.slice_rows(&self.knot, (m.dtype(), m.byte_len()), |r| m.row(r), ids);
            }
        }
        let store = e.meter.around(&*self.store);
        let dense = e
            .dense
            .get_or_try_init(|| self.knot.dense_values(e.index, &store, self.disk()))
            .await?;
        let rb = e.block.dtype.row_bytes(e.cols() as u64).unwrap_or(0) as usize;
        let row = |r: usize| {
            let at = r.checked_mul(rb)?;
            (at.checked_add(rb)? <= dense.len()).then(|| dense.slice(at..at + rb))
        };
        e.slice_rows(&self.knot, (e.block.dtype, dense.len()), row, ids)
    }

    /// Seeds the row cache with the warm object of the row file read
    /// (FORMAT.md 7d): one range request, or none when the disk cache holds
    /// the table and every warm row. Never fails for the warm object's
    /// sake: one that cannot be used is reported, and its rows come on
    /// demand.
    pub(crate) async fn warm(&self) -> Result<WarmReport> {
        let e = self.embedding()?;
        let report = match e.columnar() {
            Some(b) => b.warm().await,
            None => WarmReport {
                unused: Some(WarmUnused::Dense),
                ..WarmReport::default()
            },
        };
        *lock(&e.warmed) = Some(report.clone());
        Ok(report)
    }

    /// Fetches rows into the cache ahead of the lookup (a no-op on the dense path).
    pub(crate) async fn prefetch(&self, ids: &[u64]) -> Result<()> {
        let e = self.embedding()?;
        e.check_ids(ids)?;
        let resident = self
            .tied_exact()
            .is_some_and(|l| l.resident.get().is_some());
        match e.columnar() {
            Some(_) if !resident => self.rows(ids).await.map(drop),
            _ => Ok(()),
        }
    }

    /// The resident lm_head, pulled once (concurrent callers share the pull).
    pub(crate) async fn lm_head_matrix(&self) -> Result<Arc<Matrix>> {
        let l = self.lm_head()?;
        let m = l
            .resident
            .get_or_try_init(|| async {
                let resolution = l.resolution();
                let store = l.meter.around(&*self.store);
                let require = self.config.require_columnar;
                let pulled =
                    crate::lmhead::pull(&self.knot, l.index, (&resolution, require), &store, self.disk());
                let (m, fell_back) = pulled.await?;
                tracing::info!(knot = %self.knot.location(), lm_head = %resolution.tensor, dtype = %m.dtype(), bytes = m.byte_len(), "lm_head resident");
                if let Some(r) = fell_back {
                    *lock(&l.resolution) = r;
                }
                Ok::<_, ReaderError>(Arc::new(m))
            })
            .await?;
        Ok(m.clone())
    }

    /// The values of a block as dense bytes in its dtype, with the block
    /// (alias followed).
    pub(crate) async fn block_values(&self, tensor: &str) -> Result<(Block, Bytes)> {
        let index = self.knot.index(tensor)?;
        let block = self.knot.data_block(index)?.clone();
        let bytes = self
            .knot
            .dense_values(index, &*self.store, self.disk())
            .await?;
        Ok((block, bytes))
    }

    /// The raw payload of a block (dense bytes, or spectral factors untouched).
    pub(crate) async fn block_payload(&self, tensor: &str) -> Result<Bytes> {
        let index = self.knot.index(tensor)?;
        self.knot.payload(index, &*self.store, self.disk()).await
    }

    /// A companion file, checked against the digest the knot records.
    pub(crate) async fn package_file(&self, name: &str) -> Result<Bytes> {
        self.knot
            .package_file(name, &*self.store, self.disk())
            .await
    }

    /// Resolves any tensor of the knot for row lookups with this reader's
    /// columnar URL.
    pub(crate) async fn resolve(&self, tensor: &str) -> Result<Resolution> {
        let index = self.knot.index(tensor)?;
        let want = Want {
            url: self.config.columnar_embed.as_deref(),
            dtype: self.config.embed_dtype.map(|d| (d, "--embed-dtype")),
            dense: self.config.dense,
        };
        resolve_role(&self.knot, index, Use::Rows, want, &*self.store).await
    }

    /// Bytes a pull of `tensor` (its payload) moves, for the pull budget.
    pub(crate) fn payload_len(&self, tensor: &str) -> u64 {
        self.knot
            .index(tensor)
            .map_or(0, |i| self.knot.header().payload_len(i))
    }

    /// Bytes the lm_head pull moves.
    pub(crate) fn lm_head_len(&self) -> u64 {
        self.lm_head.as_ref().map_or(0, |l| {
            let r = l.resolution();
            match r.columnar() {
                Some(c) => c.desc.byte_len,
                None => self.knot.header().payload_len(l.index),
            }
        })
    }

    /// The knot id.
    pub(crate) fn knot_id(&self) -> String {
        self.knot.id().to_string()
    }
}

impl EmbeddingCore {
    /// Rows of the embedding.
    pub(crate) fn vocab(&self) -> u64 {
        self.block.shape.first().copied().unwrap_or(0)
    }

    fn cols(&self) -> usize {
        self.block.shape.get(1).copied().unwrap_or(0) as usize
    }

    pub(crate) fn resolution(&self) -> Resolution {
        lock(&self.state).resolution.clone()
    }

    pub(crate) fn columnar(&self) -> Option<ColumnarEmbedBackend> {
        lock(&self.state).source.clone()
    }

    /// What the last warm-up did, if there was one.
    pub(crate) fn warm_report(&self) -> Option<WarmReport> {
        lock(&self.warmed).clone()
    }

    pub(crate) fn cache_stats(&self) -> crate::columnar::CacheStats {
        self.columnar().map(|b| b.cache_stats()).unwrap_or_default()
    }

    /// The columnar path failed with `err` in a way the dense block avoids:
    /// the dense path from now on, with the reason, or the error when
    /// columnar rows are required.
    fn fall_back(&self, knot: &KnotHandle, err: &ReaderError) -> Result<()> {
        if self.require_columnar {
            return Err(ReaderError::ColumnarRequired {
                reason: gkq_format::error_chain(err),
                bytes: knot.header().payload_len(self.index),
            });
        }
        let mut st = lock(&self.state);
        st.resolution = st.resolution.fell_back(err);
        tracing::warn!(knot = %knot.location(), tensor = %self.block.name, reason = %st.resolution.reason(), "embedding rows not used");
        st.source = None;
        Ok(())
    }

    /// Bytes the embedding moved over the network: its row file's reads
    /// (rows, gap rows and rejected ones, records, the chunk table), and
    /// the dense block's if it was read.
    pub(crate) fn fetched_bytes(&self) -> u64 {
        let rows = lock(&self.state)
            .backend
            .as_ref()
            .map_or(0, ColumnarEmbedBackend::moved_bytes);
        rows + self.meter.moved().bytes
    }

    fn check_ids(&self, ids: &[u64]) -> Result<()> {
        let vocab = self.vocab();
        match ids.iter().find(|&&id| id >= vocab) {
            Some(&id) => Err(ReaderError::TokenOutOfRange { id, vocab }),
            None => Ok(()),
        }
    }

    fn slice_rows(
        &self,
        knot: &KnotHandle,
        (dtype, len): (gkq_format::DType, usize),
        row: impl Fn(usize) -> Option<Bytes>,
        ids: &[u64],
    ) -> Result<Rows> {
        let rows = ids
            .iter()
            .map(|&id| {
                usize::try_from(id).ok().and_then(&row).ok_or_else(|| {
                    ReaderError::Compute(format!(
                        "{}: row {id} is outside the {len} bytes of block {:?}",
                        knot.location(),
                        self.block.name
                    ))
                })
            })
            .collect::<Result<_>>()?;
        Ok(Rows::new(dtype, self.cols(), rows))
    }
}

impl LmHeadCore {
    /// How the lm_head is (or was) pulled, and why.
    pub(crate) fn resolution(&self) -> Resolution {
        lock(&self.resolution).clone()
    }

    /// Whether the matrix is resident.
    pub(crate) fn is_resident(&self) -> bool {
        self.resident.get().is_some()
    }

    /// Bytes the lm_head pull moved over the network (0 from the cache).
    pub(crate) fn fetched_bytes(&self) -> u64 {
        self.meter.moved().bytes
    }
}
