//! The async core shared by [`crate::AsyncReader`] and the blocking
//! [`crate::Reader`]: the opened knot, the store and the disk cache, and
//! the state of the two roles (the embedding's resolution and row backend,
//! the lm_head's source and resident matrix).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use gkq_format::{Block, Encoding, KnotHeader, keys};
use gkq_store::Store;
use tokio::sync::OnceCell;

use crate::cache::DiskCache;
use crate::columnar::{CacheStats, ColumnarEmbedBackend};
use crate::config::{ReaderConfig, Serve};
use crate::error::{ReaderError, Result};
use crate::knot::KnotHandle;
use crate::lmhead::{self, LmSource, Matrix};
use crate::resolve::{ReadPath, Resolution, resolve};
use crate::rows::Rows;

/// A resident matrix, shared by a tied lm_head and the embedding.
pub(crate) type Resident = Arc<OnceCell<Arc<Matrix>>>;

struct EmbedState {
    resolution: Resolution,
    source: Option<ColumnarEmbedBackend>,
    /// The row backend even after a fallback, for its counters.
    backend: Option<ColumnarEmbedBackend>,
}

/// The input role: embedding lookups.
pub(crate) struct EmbeddingCore {
    index: usize,
    block: Block,
    state: Mutex<EmbedState>,
    dense: OnceCell<Bytes>,
    /// Bytes the dense block moved over the network.
    dense_net: AtomicU64,
    resident: Resident,
    require_columnar: bool,
}

/// The output role: the lm_head.
pub(crate) struct LmHeadCore {
    index: usize,
    source: LmSource,
    resolution: Mutex<Resolution>,
    pub(crate) resident: Resident,
    pub(crate) background: Mutex<Option<tokio::task::JoinHandle<Result<Arc<Matrix>>>>>,
    /// Bytes the lm_head pull moved over the network.
    fetched: AtomicU64,
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

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
        if let Some(url) = &config.columnar_embed {
            // before anything could print it: a resolution reason, a warning
            gkq_store::url::refuse_credentials(url)?;
        }
        let store = Arc::new(Store::new(config.store.clone())?);
        let disk = open_cache(&config.cache)?;
        let pin = config.knot_id;
        let knot = KnotHandle::open(location, &store, disk.as_deref(), pin).await?;
        if let Some(want) = pin {
            // the header checksum was verified by the parser: this id
            // authenticates everything the knot names
            let found = knot.id();
            if found != want {
                return Err(ReaderError::KnotId {
                    location: knot.location().to_owned(),
                    expected: want.to_string(),
                    found: found.to_string(),
                });
            }
        }
        let resident: Resident = Arc::new(OnceCell::new());
        let embed_index = if serve.input || serve.output {
            let embed_name = role_block(knot.header(), keys::ROLE_TOKEN_EMBD, knot.location())?;
            knot.index(&embed_name)?
        } else {
            0
        };
        let embedding = if serve.input {
            Some(
                Self::open_embedding(
                    &knot,
                    &store,
                    disk.as_ref(),
                    &config,
                    embed_index,
                    &resident,
                )
                .await?,
            )
        } else {
            None
        };
        let lm_head = if serve.output {
            Some(Self::open_lm_head(&knot, &config, embed_index, &resident)?)
        } else {
            None
        };
        Ok(Inner {
            knot,
            store,
            disk,
            config,
            embedding,
            lm_head,
        })
    }

    /// The lm_head's source (the narrowest exact row file, else the block)
    /// and, when tied to the embedding, the resident matrix they share.
    fn open_lm_head(
        knot: &KnotHandle,
        config: &ReaderConfig,
        embed_index: usize,
        resident: &Resident,
    ) -> Result<LmHeadCore> {
        let name = role_block(knot.header(), keys::ROLE_LM_HEAD, knot.location())?;
        let index = knot.index(&name)?;
        let blocks = &knot.header().header().blocks;
        let tied = matches!(blocks.get(index).map(|b| &b.encoding), Some(Encoding::Alias { target }) if *target as usize == embed_index);
        let source = lmhead::lm_source(
            knot,
            index,
            config.columnar_embed.as_deref(),
            config.lm_head_dtype,
        )?;
        tracing::info!(lm_head = %name, path = ?source.resolution.path, reason = %source.resolution.reason, "lm_head resolved");
        Ok(LmHeadCore {
            index,
            resolution: Mutex::new(source.resolution.clone()),
            source,
            // only a tied lm_head shares its resident matrix with the embedding
            resident: if tied {
                resident.clone()
            } else {
                Arc::new(OnceCell::new())
            },
            background: Mutex::new(None),
            fetched: AtomicU64::new(0),
        })
    }

    async fn open_embedding(
        knot: &KnotHandle,
        store: &Arc<Store>,
        disk: Option<&Arc<DiskCache>>,
        config: &ReaderConfig,
        index: usize,
        resident: &Resident,
    ) -> Result<EmbeddingCore> {
        let name = knot.header().header().blocks[index].name.clone();
        let url = config.columnar_embed.as_deref();
        let resolution = resolve(knot, &name, url, config.embed_dtype, store).await?;
        if config.require_columnar && resolution.path != ReadPath::Columnar {
            return Err(ReaderError::ColumnarRequired {
                reason: resolution.reason,
                bytes: knot.header().payload_of(index).map_or(0, |p| p.len),
            });
        }
        tracing::info!(knot = %knot.location(), tensor = %name, path = ?resolution.path, reason = %resolution.reason, "embedding resolved");
        let source = match &resolution.columnar {
            Some((url, desc)) => Some(ColumnarEmbedBackend::new(
                (url.clone(), resolution.runs.clone()),
                desc.clone(),
                config.fetch.clone(),
                store.clone(),
                disk.cloned(),
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
            dense_net: AtomicU64::new(0),
            resident: resident.clone(),
            require_columnar: config.require_columnar,
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

    /// Rows of the embedding for `ids`, in request order.
    pub(crate) async fn rows(&self, ids: &[u64]) -> Result<Rows> {
        let e = self.embedding()?;
        e.check_ids(ids)?;
        let cols = e.cols();
        // a resident tied matrix serves the rows with no request, unless a
        // row file was forced (--embed-dtype: then it is that file's rows)
        if let Some(m) = e
            .resident
            .get()
            .filter(|_| self.config.embed_dtype.is_none())
        {
            return e.slice_rows(&self.knot, m.bytes(), m.dtype(), ids);
        }
        if let Some(b) = e.columnar() {
            match b.rows(ids).await {
                Ok(rows) => return Ok(Rows::new(b.dtype(), cols, rows)),
                Err(err) if err.falls_back_to_dense() && e.require_columnar => {
                    return Err(ReaderError::ColumnarRequired {
                        reason: gkq_format::error_chain(&err),
                        bytes: self.knot.header().payload_of(e.index).map_or(0, |p| p.len),
                    });
                }
                Err(err) if err.falls_back_to_dense() => {
                    let reason = format!(
                        "fell back to the dense block: {}",
                        gkq_format::error_chain(&err)
                    );
                    tracing::warn!(knot = %self.knot.location(), tensor = %e.block.name, %reason, "embedding rows not used");
                    let mut st = lock(&e.state);
                    st.resolution = Resolution {
                        path: ReadPath::Dense,
                        reason,
                        columnar: None,
                        ..st.resolution.clone()
                    };
                    st.source = None;
                }
                Err(err) => return Err(err),
            }
        }
        let dense = e
            .dense
            .get_or_try_init(|| async {
                let (b, net) = self
                    .knot
                    .dense_values_net(e.index, &self.store, self.disk())
                    .await?;
                e.dense_net.fetch_add(net, Ordering::Relaxed);
                Ok::<_, ReaderError>(b)
            })
            .await?;
        e.slice_rows(&self.knot, dense, e.block.dtype, ids)
    }

    /// Fetches rows into the cache ahead of the lookup (a no-op on the dense path).
    pub(crate) async fn prefetch(&self, ids: &[u64]) -> Result<()> {
        let e = self.embedding()?;
        e.check_ids(ids)?;
        match e.columnar() {
            Some(_) if e.resident.get().is_none() => self.rows(ids).await.map(drop),
            _ => Ok(()),
        }
    }

    /// The resident lm_head, pulled once (concurrent callers share the pull).
    pub(crate) async fn lm_head_matrix(&self) -> Result<Arc<Matrix>> {
        let l = self.lm_head()?;
        let m = l
            .resident
            .get_or_try_init(|| async {
                let (m, resolution, net) =
                    lmhead::pull(&self.knot, l.index, (&l.source, self.config.require_columnar), &self.store, self.disk()).await?;
                l.fetched.fetch_add(net, Ordering::Relaxed);
                tracing::info!(knot = %self.knot.location(), lm_head = %resolution.tensor, dtype = %m.dtype(), bytes = m.bytes().len(), "lm_head resident");
                *lock(&l.resolution) = resolution;
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
            .dense_values(index, &self.store, self.disk())
            .await?;
        Ok((block, bytes))
    }

    /// The raw payload of a block (dense bytes, or spectral factors untouched).
    pub(crate) async fn block_payload(&self, tensor: &str) -> Result<Bytes> {
        let index = self.knot.index(tensor)?;
        self.knot.payload(index, &self.store, self.disk()).await
    }

    /// A companion file, checked against the digest the knot records.
    pub(crate) async fn package_file(&self, name: &str) -> Result<Bytes> {
        self.knot.package_file(name, &self.store, self.disk()).await
    }

    /// Resolves any tensor of the knot with this reader's columnar URL.
    pub(crate) async fn resolve(&self, tensor: &str) -> Result<Resolution> {
        let url = self.config.columnar_embed.as_deref();
        resolve(
            &self.knot,
            tensor,
            url,
            self.config.embed_dtype,
            &self.store,
        )
        .await
    }

    /// Bytes a pull of `tensor` (its payload) moves, for the pull budget.
    pub(crate) fn payload_len(&self, tensor: &str) -> u64 {
        self.knot
            .index(tensor)
            .ok()
            .and_then(|i| self.knot.header().payload_of(i))
            .map_or(0, |p| p.len)
    }

    /// Bytes the lm_head pull moves.
    pub(crate) fn lm_head_len(&self) -> u64 {
        self.lm_head.as_ref().map_or(0, |l| match &l.source.rows {
            Some((_, d)) => d.byte_len,
            None => self.knot.header().payload_of(l.index).map_or(0, |p| p.len),
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

    pub(crate) fn cache_stats(&self) -> CacheStats {
        self.columnar().map(|b| b.cache_stats()).unwrap_or_default()
    }

    /// Bytes the embedding moved over the network: rows (gap rows and
    /// rejected ones included) and their proofs, and the dense block if it
    /// was read.
    pub(crate) fn fetched_bytes(&self) -> u64 {
        let rows = lock(&self.state).backend.as_ref().map_or(0, |b| {
            let s = b.cache_stats();
            (s.rows_fetched + s.rows_rejected) * b.row_bytes() + s.proof_bytes
        });
        rows + self.dense_net.load(Ordering::Relaxed)
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
        bytes: &Bytes,
        dtype: gkq_format::DType,
        ids: &[u64],
    ) -> Result<Rows> {
        let cols = self.cols();
        let rb = cols * dtype.itemsize() as usize;
        let rows = ids
            .iter()
            .map(|&id| {
                let start = usize::try_from(id).ok().and_then(|i| i.checked_mul(rb));
                start
                    .and_then(|s| Some(s..s.checked_add(rb)?))
                    .filter(|r| r.end <= bytes.len())
                    .map(|r| bytes.slice(r))
                    .ok_or_else(|| {
                        ReaderError::Compute(format!(
                            "{}: row {id} is outside the {} bytes of block {:?}",
                            knot.location(),
                            bytes.len(),
                            self.block.name
                        ))
                    })
            })
            .collect::<Result<_>>()?;
        Ok(Rows::new(dtype, cols, rows))
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

    /// Bytes the lm_head pull moved over the network (0 from the cache, or
    /// when a tied matrix came with the embedding).
    pub(crate) fn fetched_bytes(&self) -> u64 {
        self.fetched.load(Ordering::Relaxed)
    }
}
