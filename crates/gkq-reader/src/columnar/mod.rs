//! `ColumnarEmbedBackend`: rows of a row file over range requests, each
//! verified against the knot's Merkle root (FORMAT.md 7a), with an
//! in-process LRU keyed by token id and the disk cache behind it.
//!
//! `rows(ids)` dedupes the ids, serves hits from the LRU, and turns the
//! misses into byte ranges ([`crate::ranges::coalesce`]): single-range GETs
//! of rows and of their path records (R2 and S3 do not serve multi-range
//! requests), all in flight at once up to a limit, the chunk table fetched
//! once alongside the first rows. Rows come back in request order.
//!
//! Single flight: a row being fetched by one caller is awaited by the
//! others (a shared future), so concurrent callers fetch each row once. The
//! fetch lives as long as one caller still awaits it: when every caller has
//! dropped its future, the fetch and its requests are dropped too, and the
//! next caller starts afresh. Rows enter the cache only whole, from a
//! checked answer, and only once their path record proves them against the
//! chunk table, which is itself checked against the root.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::future::{BoxFuture, FutureExt, Shared, WeakShared};
use gkq_format::merkle::{Hash, ProofLayout};
use gkq_format::runs::RunsLayout;
use gkq_format::{ColumnarDescriptor, DType, hex};
use gkq_store::blocking::lock;
use gkq_store::{Meter, Store, bump};
use lru::LruCache;

use crate::cache::DiskCache;
use crate::error::{ReaderError, Result};
use crate::proof::proof_url;

mod fetch;
mod verify;
mod warm;

pub use warm::{WarmReport, WarmUnused};

/// The URL of the runs object of the row file at `url` (FORMAT.md 7b).
pub(crate) fn runs_url(url: &str) -> String {
    gkq_store::url::with_suffix(url, gkq_format::runs::RUNS_SUFFIX)
}

/// The URL of the warm object of the row file at `url` (FORMAT.md 7d).
pub(crate) fn warm_url(url: &str) -> String {
    gkq_store::url::with_suffix(url, gkq_format::warm::WARM_SUFFIX)
}

/// Where the bytes of a batch of runs came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Via {
    /// The runs object at this URL (FORMAT.md 7b).
    Runs(String),
    /// The row file and the proof object (7a).
    Split,
}

/// Default row cache capacity (~28 MB of fp32 rows for Qwen2.5-0.5B).
pub const DEFAULT_CACHE_ROWS: usize = 8192;

/// Fetch settings of a backend.
#[derive(Clone, Debug)]
pub struct FetchConfig {
    /// Cache capacity in rows.
    pub cache_rows: usize,
    /// Rows that may lie between two requested rows for them to share one request.
    pub max_gap_rows: u64,
    /// Rows per request at most.
    pub max_run_rows: u64,
    /// Requests in flight at once over HTTP/1.1 (each needs its own connection).
    pub concurrency: usize,
    /// Requests in flight at once when the origin speaks HTTP/2 (streams on
    /// one connection; nginx allows 128 concurrent streams by default).
    pub concurrency_multiplexed: usize,
}

impl Default for FetchConfig {
    fn default() -> Self {
        FetchConfig {
            cache_rows: DEFAULT_CACHE_ROWS,
            max_gap_rows: 1,
            max_run_rows: 1024,
            concurrency: 64,
            concurrency_multiplexed: 128,
        }
    }
}

gkq_store::stats! {
    /// Counters of the row cache.
    pub struct CacheStats live Counters {
        /// Distinct rows served from the in-memory LRU.
        pub hits,
        /// Distinct rows that had to be fetched (or waited for).
        pub misses,
        /// Rows fetched over the network and verified, gap rows included.
        pub rows_fetched,
        /// Rows read from the disk cache and verified.
        pub rows_from_disk,
        /// Proof bytes fetched: path records and the chunk table (FORMAT.md 7a).
        pub proof_bytes,
        /// Rows fetched that failed verification and were discarded.
        pub rows_rejected,
    }
}

/// One verified row.
pub(crate) type Row = Bytes;
type FetchOut = std::result::Result<Arc<HashMap<u64, Row>>, Arc<ReaderError>>;
type Fetch = Shared<BoxFuture<'static, FetchOut>>;
type WeakFetch = WeakShared<BoxFuture<'static, FetchOut>>;

struct State {
    lru: LruCache<u64, Row>,
    /// Rows being fetched: the number of the fetch, and the fetch while
    /// someone still awaits it.
    inflight: HashMap<u64, (u64, WeakFetch)>,
}

struct Backend {
    url: String,
    proof_url: String,
    /// The runs object (FORMAT.md 7b) while it works: `None` when the
    /// package has none, or after it failed once (rows and records then
    /// come from the row file and the proof object).
    runs: Mutex<Option<(String, RunsLayout)>>,
    /// The warm object (FORMAT.md 7d) and the warm rows, when the knot
    /// lists one for this row file.
    warm: Option<(String, Vec<u64>)>,
    desc: ColumnarDescriptor,
    layout: ProofLayout,
    config: FetchConfig,
    store: Arc<Store>,
    /// Counts what this row file's reads move over the network.
    meter: Meter,
    disk: Option<Arc<DiskCache>>,
    state: Mutex<State>,
    table: tokio::sync::OnceCell<Arc<Vec<Hash>>>,
    counters: Counters,
    next_fetch: AtomicU64,
}

/// Rows of one row file, fetched by range and cached.
#[derive(Clone)]
pub struct ColumnarEmbedBackend {
    inner: Arc<Backend>,
}

impl std::fmt::Debug for ColumnarEmbedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColumnarEmbedBackend")
            .field("url", &self.inner.url)
            .field("rows", &self.inner.desc.rows)
            .field("row_bytes", &self.inner.desc.row_bytes)
            .finish_non_exhaustive()
    }
}

impl ColumnarEmbedBackend {
    /// A backend for the row file `desc` at `url` (not contacted here). Its
    /// proof object is at `url` + `.proof` (FORMAT.md 7a); a descriptor
    /// without a row proof (a version 2 knot) is refused, since its rows
    /// could not be verified.
    pub(crate) fn new(
        (url, runs, warm): (String, Option<String>, Option<Vec<u64>>),
        desc: ColumnarDescriptor,
        config: FetchConfig,
        (store, meter): (Arc<Store>, Meter),
        disk: Option<Arc<DiskCache>>,
    ) -> Result<Self> {
        let layout = crate::proof::layout(&url, &desc)?;
        let cap = NonZeroUsize::new(config.cache_rows.max(1)).expect("max(1) is non-zero");
        Ok(ColumnarEmbedBackend {
            inner: Arc::new(Backend {
                proof_url: proof_url(&url),
                runs: Mutex::new(runs.zip(RunsLayout::of(&desc))),
                warm: warm.map(|ids| (warm_url(&url), ids)),
                url,
                desc,
                layout,
                config,
                store,
                meter,
                disk,
                state: Mutex::new(State {
                    lru: LruCache::new(cap),
                    inflight: HashMap::new(),
                }),
                table: tokio::sync::OnceCell::new(),
                counters: Counters::default(),
                next_fetch: AtomicU64::new(0),
            }),
        })
    }

    /// Rows in the file.
    pub fn rows_total(&self) -> u64 {
        self.inner.desc.rows
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> u64 {
        self.inner.desc.row_bytes
    }

    /// Dtype of the rows.
    pub fn dtype(&self) -> DType {
        self.inner.desc.dtype
    }

    /// The row file URL.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// Cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.inner.counters.snapshot()
    }

    /// Bytes this row file's reads moved over the network: rows (gap rows
    /// and rejected ones included), records and the chunk table.
    pub(crate) fn moved_bytes(&self) -> u64 {
        self.inner.meter.moved().bytes
    }

    /// Rows currently in the LRU.
    pub fn cached_rows(&self) -> usize {
        lock(&self.inner.state).lru.len()
    }

    /// Seeds the cache with the row file's warm object (FORMAT.md 7d).
    pub(crate) async fn warm(&self) -> WarmReport {
        self.inner.warm().await
    }

    /// Checks every id against the vocabulary before anything is fetched.
    pub fn check_ids(&self, ids: &[u64]) -> Result<()> {
        let vocab = self.inner.desc.rows;
        match ids.iter().find(|&&id| id >= vocab) {
            Some(&id) => Err(ReaderError::TokenOutOfRange { id, vocab }),
            None => Ok(()),
        }
    }

    /// The rows of `ids`, in request order (duplicates allowed).
    pub(crate) async fn rows(&self, ids: &[u64]) -> Result<Vec<Row>> {
        self.check_ids(ids)?;
        let b = &self.inner;
        let mut found: HashMap<u64, Row> = HashMap::with_capacity(ids.len());
        let mut waits: Vec<Fetch> = Vec::new();
        let mut distinct = 0u64;
        {
            let mut st = lock(&b.state);
            let mut seen = HashSet::with_capacity(ids.len());
            let mut mine = Vec::new();
            for &id in ids {
                if !seen.insert(id) {
                    continue;
                }
                distinct += 1;
                if let Some(row) = st.lru.get(&id) {
                    found.insert(id, row.clone());
                } else if let Some(f) = st.inflight.get(&id).and_then(|(_, w)| w.upgrade()) {
                    if !waits.iter().any(|w| w.ptr_eq(&f)) {
                        waits.push(f);
                    }
                } else {
                    mine.push(id);
                }
            }
            if !mine.is_empty() {
                let no = b.next_fetch.fetch_add(1, Ordering::Relaxed);
                let fetch = Backend::fetch(b.clone(), no, mine.clone()).boxed().shared();
                let weak = fetch.downgrade().expect("a new future has not completed");
                for id in mine {
                    st.inflight.insert(id, (no, weak.clone()));
                }
                waits.push(fetch);
            }
        }
        bump(&b.counters.hits, found.len() as u64);
        bump(&b.counters.misses, distinct - found.len() as u64);
        for r in futures_util::future::join_all(waits).await {
            let map = r.map_err(ReaderError::Shared)?;
            for id in ids {
                if !found.contains_key(id)
                    && let Some(row) = map.get(id)
                {
                    found.insert(*id, row.clone());
                }
            }
        }
        ids.iter()
            .map(|id| {
                found
                    .get(id)
                    .cloned()
                    .ok_or_else(|| ReaderError::Missing(format!("row {id} was not fetched")))
            })
            .collect()
    }
}

impl Backend {
    /// One fetch of `ids`: its rows enter the LRU and its in-flight marks go.
    async fn fetch(self: Arc<Self>, no: u64, ids: Vec<u64>) -> FetchOut {
        let r = self.fetch_rows(ids).await;
        let mut st = lock(&self.state);
        if let Ok(map) = &r {
            for (id, row) in map {
                st.lru.put(*id, row.clone());
            }
        }
        st.inflight.retain(|_, (n, _)| *n != no);
        r.map(Arc::new).map_err(Arc::new)
    }

    fn disk_key(&self, row: u64) -> Option<String> {
        let root = self.desc.proof?.root;
        Some(format!("{}/{row}", hex(&root)))
    }

    /// The chunk table, checked against the root: from memory, the disk
    /// cache, or one GET (shared by concurrent callers).
    async fn roots(&self) -> Result<Arc<Vec<Hash>>> {
        self.table
            .get_or_try_init(|| async {
                let store = self.meter.around(&*self.store);
                let t =
                    crate::proof::chunk_table(&store, self.disk.as_deref(), &self.url, &self.desc);
                let (t, fetched) = t.await?;
                bump(&self.counters.proof_bytes, fetched);
                Ok(t)
            })
            .await
            .cloned()
    }
}
