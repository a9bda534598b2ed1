//! `gkq-reader`: the runtime side of GKQ v2, embedded by inference nodes.
//!
//! - [`Reader::open`] opens a knot from a path or an http(s) URL; remotely it
//!   reads only the header (at most two range requests) and fetches blocks on
//!   demand, each checked against its sha256.
//! - [`resolve`] decides per tensor between the columnar row file, the dense
//!   block and (untouched) spectral factors, and says why.
//! - [`ColumnarEmbedBackend`] fetches embedding rows with single-range GETs,
//!   coalescing nearby rows and caching them in an LRU keyed by token id.
//! - [`LmHead`] keeps the lm_head resident (pulled once, sha256-checked) and
//!   computes logits and argmax with candle. When the lm_head is tied and
//!   resident, embedding lookups are served from it with no more requests.
//! - [`Roles`]: a node asks only for the roles it serves; an input-only node
//!   never pulls lm_head.
//!
//! Nothing here prints; decisions are logged once with the `log` crate.
//!
//! # Example
//!
//! A node that serves both roles, on the committed tiny model packed into a
//! temporary directory (a URL works the same way; see `ReaderConfig` for
//! the columnar row file):
//!
//! ```
//! use gkq_reader::{ReadPath, Reader, ReaderConfig, Roles};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let tmp = tempfile::tempdir()?;
//! # let out = tmp.path().join("qwen2-tiny");
//! # gkq_pack::pack(
//! #     &gkq_pack::PackOptions::new(fixtures::committed_tiny(), &out),
//! #     &gkq_pack::NoProgress,
//! # )?;
//! let knot = out.join("model.knot");
//! let reader = Reader::open(knot.to_str().ok_or("utf8")?, ReaderConfig::default(), Roles::ALL)?;
//!
//! // The input role: rows for the prompt's token ids.
//! let emb = reader.embedding()?;
//! assert_eq!(emb.resolution().path, ReadPath::Dense); // no --columnar-embed given
//! let ids = [17, 42, 17, 900];
//! emb.prefetch(&ids)?; // tokenize, dedupe, fetch in parallel before the lookup
//! let x = emb.rows(&ids)?.to_tensor()?; // [4, hidden] f32
//! assert_eq!(x.dims(), &[4, 64]);
//!
//! // The output role: lm_head resident, logits and argmax with candle.
//! let lm = reader.lm_head()?;
//! lm.start_background(); // pull it while prefill runs
//! let next = lm.argmax(&x)?;
//! assert_eq!(next.len(), 4);
//! assert!(next.iter().all(|&t| u64::from(t) < emb.vocab()));
//! # Ok(())
//! # }
//! ```

mod columnar;
mod config;
mod error;
mod knot;
mod lmhead;
pub mod ranges;
mod resolve;
mod rows;

use std::sync::{Arc, Mutex, OnceLock};

use gkq_format::{Block, DType, Encoding, KnotHeader, keys};

pub use columnar::{CacheStats, ColumnarEmbedBackend, FetchConfig};
#[cfg(feature = "clap")]
pub use config::EmbedArgs;
pub use config::{DEFAULT_CACHE_ROWS, ReaderConfig, Roles, with_timeout};
pub use error::{ReaderError, Result};
pub use gkq_store::{Http, HttpConfig, NetStats, Store};
pub use knot::{KnotHandle, is_url};
pub use lmhead::{LmHead, Matrix, logits_with, weights_from_block};
pub use resolve::{ReadPath, Resolution, resolve};
pub use rows::Rows;

enum Source {
    Columnar(Arc<ColumnarEmbedBackend>),
    Dense,
}

struct EmbedState {
    resolution: Resolution,
    source: Source,
    dense: Option<Arc<[u8]>>,
}

/// Input embedding lookups for a node that serves the input role.
pub struct Embedding {
    knot: Arc<KnotHandle>,
    http: Arc<Store>,
    index: usize,
    block: Block,
    state: Mutex<EmbedState>,
    resident: Arc<OnceLock<Arc<Matrix>>>,
    require_columnar: bool,
}

impl std::fmt::Debug for Embedding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedding")
            .field("block", &self.block.name)
            .finish_non_exhaustive()
    }
}

impl Embedding {
    /// The current resolution (it changes to dense if the server turns out
    /// to ignore Range requests).
    pub fn resolution(&self) -> Resolution {
        self.lock().resolution.clone()
    }

    /// Rows of the embedding.
    pub fn vocab(&self) -> u64 {
        self.block.shape.first().copied().unwrap_or(0)
    }

    /// The columnar backend, when that is the current path.
    pub fn columnar(&self) -> Option<Arc<ColumnarEmbedBackend>> {
        match &self.lock().source {
            Source::Columnar(b) => Some(b.clone()),
            Source::Dense => None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, EmbedState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn check_ids(&self, ids: &[u64]) -> Result<()> {
        let vocab = self.vocab();
        match ids.iter().find(|&&id| id >= vocab) {
            Some(&id) => Err(ReaderError::TokenOutOfRange { id, vocab }),
            None => Ok(()),
        }
    }

    fn slice_rows(&self, bytes: &[u8], dtype: DType, ids: &[u64]) -> Result<Rows> {
        let cols = self.block.shape.get(1).copied().unwrap_or(0) as usize;
        let rb = cols * dtype.itemsize() as usize;
        let rows = ids
            .iter()
            .map(|&id| {
                let start = usize::try_from(id).ok().and_then(|i| i.checked_mul(rb));
                start
                    .and_then(|s| bytes.get(s..s.checked_add(rb)?))
                    .map(Arc::from)
                    .ok_or_else(|| {
                        ReaderError::Compute(format!(
                            "{}: row {id} is outside the {} bytes of block {:?}",
                            self.knot.location(),
                            bytes.len(),
                            self.block.name
                        ))
                    })
            })
            .collect::<Result<_>>()?;
        Ok(Rows::new(dtype, cols, rows))
    }

    /// The rows of `ids` in request order. Ids are checked against the
    /// vocabulary before anything is fetched.
    pub fn rows(&self, ids: &[u64]) -> Result<Rows> {
        self.check_ids(ids)?;
        let cols = self.block.shape.get(1).copied().unwrap_or(0) as usize;
        if let Some(m) = self.resident.get() {
            return self.slice_rows(&m.bytes, m.dtype, ids);
        }
        let backend = self.columnar();
        if let Some(b) = backend {
            match b.rows(ids) {
                Ok(rows) => return Ok(Rows::new(b.dtype(), cols, rows)),
                Err(e) if e.falls_back_to_dense() && self.require_columnar => {
                    return Err(ReaderError::ColumnarRequired {
                        reason: e.to_string(),
                        bytes: self
                            .knot
                            .header()
                            .payload_of(self.index)
                            .map_or(0, |p| p.len),
                    });
                }
                Err(e) if e.falls_back_to_dense() => {
                    let reason = format!("fell back to the dense block: {e}");
                    log::warn!("{}: {}: {reason}", self.knot.location(), self.block.name);
                    let mut st = self.lock();
                    st.resolution = Resolution {
                        tensor: st.resolution.tensor.clone(),
                        path: ReadPath::Dense,
                        reason,
                        columnar: None,
                    };
                    st.source = Source::Dense;
                }
                Err(e) => return Err(e),
            }
        }
        let dense = self.dense()?;
        self.slice_rows(&dense, self.block.dtype, ids)
    }

    /// Fetches rows into the cache ahead of the lookup (a no-op on the dense path).
    pub fn prefetch(&self, ids: &[u64]) -> Result<()> {
        self.check_ids(ids)?;
        match self.columnar() {
            Some(b) if self.resident.get().is_none() => b.prefetch(ids),
            _ => Ok(()),
        }
    }

    /// Preloads a warm set of hot token ids.
    pub fn warm(&self, ids: &[u64]) -> Result<()> {
        self.prefetch(ids)
    }

    /// Cache counters of the columnar backend (zero on the dense path).
    pub fn cache_stats(&self) -> CacheStats {
        self.columnar().map(|b| b.cache_stats()).unwrap_or_default()
    }

    fn dense(&self) -> Result<Arc<[u8]>> {
        if let Some(d) = &self.lock().dense {
            return Ok(d.clone());
        }
        // a spectral embedding is reconstructed (FORMAT.md section 5), never sliced
        let bytes = self.knot.dense_values(self.index, &self.http)?;
        self.lock().dense = Some(bytes.clone());
        Ok(bytes)
    }
}

/// An opened model: the knot, and the roles this node serves.
pub struct Reader {
    knot: Arc<KnotHandle>,
    http: Arc<Store>,
    config: ReaderConfig,
    embedding: Option<Embedding>,
    lm_head: Option<LmHead>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("knot", &self.knot.location())
            .finish_non_exhaustive()
    }
}

fn role_block(header: &KnotHeader, key: &str, location: &str) -> Result<String> {
    header
        .header()
        .meta_str(key)
        .map(str::to_owned)
        .ok_or_else(|| ReaderError::Missing(format!("{location}: the knot has no {key} metadata")))
}

/// The store for a knot at `location` and `config`: HTTP(S) always, S3 when
/// the knot or the row files are `s3://` URLs (feature `s3`; endpoint and
/// credentials as the uploader takes them: `--endpoint` or `R2_ACCOUNT_ID`,
/// `R2_ACCESS_KEY_ID`/`R2_SECRET_ACCESS_KEY`).
fn store_for(location: &str, config: &ReaderConfig) -> Result<Store> {
    let store = Store::new(config.http.clone())?;
    let wants_s3 = location.starts_with("s3://")
        || config
            .columnar_embed
            .as_deref()
            .is_some_and(|u| u.starts_with("s3://"));
    if !wants_s3 {
        return Ok(store);
    }
    #[cfg(feature = "s3")]
    {
        let reader = gkq_store::s3::S3Reader::from_env(config.s3_endpoint.as_deref())?;
        Ok(store.with_s3(reader))
    }
    #[cfg(not(feature = "s3"))]
    {
        // reads of s3:// URLs then fail with the message that says how to build
        Ok(store)
    }
}

impl Reader {
    /// Opens a knot (path or URL) for the given roles. With the input role
    /// the embedding is resolved here (one HEAD of the columnar URL).
    pub fn open(location: &str, config: ReaderConfig, roles: Roles) -> Result<Reader> {
        let http = Arc::new(store_for(location, &config)?);
        let knot = Arc::new(KnotHandle::open(location, &http)?);
        if let Some(want) = &config.knot_id {
            // the header checksum was verified by the parser: this id
            // authenticates everything the knot names
            let found = gkq_format::hex(&knot.header().preamble().header_sha256);
            if !found.eq_ignore_ascii_case(want.trim()) {
                return Err(ReaderError::KnotId {
                    location: location.to_owned(),
                    expected: want.trim().to_ascii_lowercase(),
                    found,
                });
            }
        }
        let resident: Arc<OnceLock<Arc<Matrix>>> = Arc::new(OnceLock::new());
        let embed_name = role_block(knot.header(), keys::ROLE_TOKEN_EMBD, location)?;
        let embed_index = knot.index(&embed_name)?;
        let embedding = if roles.input {
            let resolution = resolve(
                &knot,
                &embed_name,
                config.columnar_embed.as_deref(),
                config.embed_dtype,
                &http,
            )?;
            if config.require_columnar && resolution.path != ReadPath::Columnar {
                return Err(ReaderError::ColumnarRequired {
                    reason: resolution.reason,
                    bytes: knot.header().payload_of(embed_index).map_or(0, |p| p.len),
                });
            }
            log::info!(
                "{location}: {embed_name}: {:?} path: {}",
                resolution.path,
                resolution.reason
            );
            let source = match &resolution.columnar {
                Some((url, desc)) => Source::Columnar(Arc::new(ColumnarEmbedBackend::new(
                    url.clone(),
                    desc.clone(),
                    config.fetch.clone(),
                    http.clone(),
                )?)),
                None => Source::Dense,
            };
            Some(Embedding {
                knot: knot.clone(),
                http: http.clone(),
                index: embed_index,
                block: knot.data_block(embed_index)?.clone(),
                state: Mutex::new(EmbedState {
                    resolution,
                    source,
                    dense: None,
                }),
                resident: resident.clone(),
                require_columnar: config.require_columnar,
            })
        } else {
            None
        };
        let lm_head = if roles.output {
            let name = role_block(knot.header(), keys::ROLE_LM_HEAD, location)?;
            let index = knot.index(&name)?;
            let tied = matches!(knot.header().header().blocks.get(index).map(|b| &b.encoding), Some(Encoding::Alias { target }) if *target as usize == embed_index);
            // Only a tied lm_head shares its resident matrix with the embedding.
            let shared = if tied {
                resident.clone()
            } else {
                Arc::new(OnceLock::new())
            };
            Some(LmHead::new(lmhead::Inner {
                knot: knot.clone(),
                http: http.clone(),
                index,
                resident: shared,
            }))
        } else {
            None
        };
        Ok(Reader {
            knot,
            http,
            config,
            embedding,
            lm_head,
        })
    }

    /// The knot.
    pub fn knot(&self) -> &KnotHandle {
        &self.knot
    }

    /// The input embedding, if this node serves the input role.
    pub fn embedding(&self) -> Result<&Embedding> {
        self.embedding
            .as_ref()
            .ok_or(ReaderError::RoleNotServed("input"))
    }

    /// The lm_head, if this node serves the output role.
    pub fn lm_head(&self) -> Result<&LmHead> {
        self.lm_head
            .as_ref()
            .ok_or(ReaderError::RoleNotServed("output"))
    }

    /// Resolves any tensor of the knot with this reader's columnar URL.
    pub fn resolve(&self, tensor: &str) -> Result<Resolution> {
        resolve(
            &self.knot,
            tensor,
            self.config.columnar_embed.as_deref(),
            self.config.embed_dtype,
            &self.http,
        )
    }

    /// The raw payload of a block (dense bytes, or spectral factors untouched),
    /// sha256-checked.
    pub fn block_payload(&self, tensor: &str) -> Result<Arc<[u8]>> {
        self.knot.payload(self.knot.index(tensor)?, &self.http)
    }

    /// A companion file of the package (`config.json`, `tokenizer.json`, …),
    /// checked against the digest the knot records.
    pub fn package_file(&self, name: &str) -> Result<Vec<u8>> {
        self.knot.package_file(name, &self.http)
    }

    /// The values of a block as dense bytes in its dtype (a spectral block
    /// reconstructed as docs/FORMAT.md section 5 says), sha256-checked, with
    /// the block (alias followed) for its dtype and shape.
    pub fn block_values(&self, tensor: &str) -> Result<(Block, Arc<[u8]>)> {
        let index = self.knot.index(tensor)?;
        let block = self.knot.data_block(index)?.clone();
        Ok((block, self.knot.dense_values(index, &self.http)?))
    }

    /// Network counters of everything this reader fetched.
    pub fn net_stats(&self) -> NetStats {
        self.http.stats()
    }
}
