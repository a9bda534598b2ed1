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
use gkq_format::merkle::{self, Hash, ProofLayout};
use gkq_format::runs::RunsLayout;
use gkq_format::{ColumnarDescriptor, DType, hex};
use gkq_store::{RangeRead, ReadOptions, Store, StoreError};
use lru::LruCache;
use serde::Serialize;

use crate::cache::{DiskCache, Kind, Size};
use crate::error::{ReaderError, Result};
use crate::ranges::{RowRun, coalesce};

mod fetch;

/// Where the bytes of a batch of runs came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Via {
    /// Nothing fetched yet.
    Table,
    /// The runs object at this URL (FORMAT.md 7b).
    Runs(String),
    /// The row file and the proof object (7a).
    Split,
}

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
            cache_rows: 8192,
            max_gap_rows: 1,
            max_run_rows: 1024,
            concurrency: 64,
            concurrency_multiplexed: 128,
        }
    }
}

/// Counters of the row cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Distinct rows served from the in-memory LRU.
    pub hits: u64,
    /// Distinct rows that had to be fetched (or waited for).
    pub misses: u64,
    /// Rows fetched over the network and verified, gap rows included.
    pub rows_fetched: u64,
    /// Rows read from the disk cache and verified.
    pub rows_from_disk: u64,
    /// Proof bytes fetched: path records and the chunk table (FORMAT.md 7a).
    pub proof_bytes: u64,
    /// Rows fetched that failed verification and were discarded.
    pub rows_rejected: u64,
}

impl CacheStats {
    /// `self - earlier`.
    pub fn since(&self, e: &CacheStats) -> CacheStats {
        CacheStats {
            hits: self.hits.saturating_sub(e.hits),
            misses: self.misses.saturating_sub(e.misses),
            rows_fetched: self.rows_fetched.saturating_sub(e.rows_fetched),
            rows_from_disk: self.rows_from_disk.saturating_sub(e.rows_from_disk),
            proof_bytes: self.proof_bytes.saturating_sub(e.proof_bytes),
            rows_rejected: self.rows_rejected.saturating_sub(e.rows_rejected),
        }
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

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    rows_fetched: AtomicU64,
    rows_from_disk: AtomicU64,
    proof_bytes: AtomicU64,
    rejected: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

struct Backend {
    url: String,
    proof_url: String,
    /// The runs object (FORMAT.md 7b) while it works: `None` when the
    /// package has none, or after it failed once (rows and records then
    /// come from the row file and the proof object).
    runs: Mutex<Option<(String, RunsLayout)>>,
    desc: ColumnarDescriptor,
    layout: ProofLayout,
    config: FetchConfig,
    store: Arc<Store>,
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

/// The URL of the proof object of the row file at `url` (FORMAT.md 7a).
pub(crate) fn proof_url(url: &str) -> String {
    gkq_store::url::with_suffix(url, merkle::PROOF_SUFFIX)
}

impl ColumnarEmbedBackend {
    /// A backend for the row file `desc` at `url` (not contacted here). Its
    /// proof object is at `url` + `.proof` (FORMAT.md 7a); a descriptor
    /// without a row proof (a version 2 knot) is refused, since its rows
    /// could not be verified.
    pub(crate) fn new(
        (url, runs): (String, Option<String>),
        desc: ColumnarDescriptor,
        config: FetchConfig,
        store: Arc<Store>,
        disk: Option<Arc<DiskCache>>,
    ) -> Result<Self> {
        let layout = merkle::layout_of(&desc).ok_or_else(|| {
            ReaderError::Missing(format!(
                "{url}: the knot records no row proof for {}, so its rows cannot be verified",
                desc.object
            ))
        })?;
        let cap = NonZeroUsize::new(config.cache_rows.max(1)).expect("max(1) is non-zero");
        Ok(ColumnarEmbedBackend {
            inner: Arc::new(Backend {
                proof_url: proof_url(&url),
                runs: Mutex::new(runs.zip(RunsLayout::of(&desc))),
                url,
                desc,
                layout,
                config,
                store,
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
        let c = &self.inner.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheStats {
            hits: l(&c.hits),
            misses: l(&c.misses),
            rows_fetched: l(&c.rows_fetched),
            rows_from_disk: l(&c.rows_from_disk),
            proof_bytes: l(&c.proof_bytes),
            rows_rejected: l(&c.rejected),
        }
    }

    /// Rows currently in the LRU.
    pub fn cached_rows(&self) -> usize {
        self.inner.lock().lru.len()
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
            let mut st = b.lock();
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
        add(&b.counters.hits, found.len() as u64);
        add(&b.counters.misses, distinct - found.len() as u64);
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
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One fetch of `ids`: its rows enter the LRU and its in-flight marks go.
    async fn fetch(self: Arc<Self>, no: u64, ids: Vec<u64>) -> FetchOut {
        let r = self.fetch_rows(ids).await;
        let mut st = self.lock();
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
    /// cache, or one GET (shared by concurrent callers). Any failure of the
    /// proof object other than an unreachable server is
    /// [`ReaderError::Unverified`] (FORMAT.md 7a: the dense fallback).
    async fn roots(&self) -> Result<Arc<Vec<Hash>>> {
        self.table
            .get_or_try_init(|| async {
                let root = self.desc.proof.map(|p| hex(&p.root)).unwrap_or_default();
                if let Some(d) = &self.disk {
                    let desc = self.desc.clone();
                    let ok = move |b: &[u8]| merkle::check_table(&desc, b).is_ok();
                    let size = Size::Exact(self.layout.table_len());
                    if let Some(t) = d.get(Kind::Table, &root, size, ok).await {
                        let r =
                            merkle::check_table(&self.desc, &t).map_err(|e| self.unverified(e))?;
                        return Ok(Arc::new(r));
                    }
                }
                let opts = ReadOptions {
                    total: self.layout.object_len(),
                    ..Default::default()
                };
                let end = self.layout.table_len() - 1;
                let t = self
                    .store
                    .read_vec(&self.proof_url, 0, end, opts)
                    .await
                    .map_err(|e| self.proof_error(e))?;
                add(&self.counters.proof_bytes, t.len() as u64);
                let r = merkle::check_table(&self.desc, &t).map_err(|e| self.unverified(e))?;
                if let Some(d) = &self.disk {
                    d.put(Kind::Table, &root, Bytes::from(t)).await;
                }
                Ok(Arc::new(r))
            })
            .await
            .cloned()
    }

    /// The chunk table (or the proof object's read) failed.
    fn unverified(&self, e: impl Into<gkq_store::BoxError>) -> ReaderError {
        ReaderError::Unverified {
            url: self.url.clone(),
            via: format!(" (checked with the proof object {})", self.proof_url),
            source: e.into(),
        }
    }

    /// A failed read of the proof object: an unreachable server is an error
    /// of its own; a missing, redirected or short proof object makes the
    /// rows unverifiable (the dense fallback, FORMAT.md 7a).
    fn proof_error(&self, e: StoreError) -> ReaderError {
        if e.is_unreachable() || matches!(e, StoreError::Transport { timeout: true, .. }) {
            return e.into();
        }
        // the store's error names the proof object's URL
        self.unverified(e)
    }

    /// Rows of `ids` from the disk cache, verified (when the table is at hand).
    async fn cached_rows_on_disk(&self, ids: &[u64]) -> HashMap<u64, Row> {
        let mut out = HashMap::new();
        let (Some(d), Some(roots)) = (&self.disk, self.table.get()) else {
            return out;
        };
        let rb = usize::try_from(self.desc.row_bytes).unwrap_or(usize::MAX);
        for &id in ids {
            let Some(key) = self.disk_key(id) else { break };
            let (desc, roots) = (self.desc.clone(), roots.clone());
            let ok = move |b: &[u8]| {
                b.len() >= rb && merkle::check_row(&desc, &roots, id, &b[..rb], &b[rb..]).is_ok()
            };
            let size = Size::Exact(self.desc.row_bytes + self.layout.record_len());
            if let Some(b) = d.get(Kind::Row, &key, size, ok).await {
                out.insert(id, b.slice(..rb));
            }
        }
        add(&self.counters.rows_from_disk, out.len() as u64);
        out
    }

    /// Fetches `ids`: from the disk cache where it has them, else in
    /// coalesced runs (rows and path records, all in parallel, with the
    /// chunk table on the first fetch). Every row is verified before it is
    /// returned; runs that fail are fetched once more (from the row file
    /// and the proof object when they came from the runs object: FORMAT.md
    /// 7b), then the fetch fails with [`ReaderError::Unverified`] naming
    /// the objects. Returns every row verified (gap rows too).
    async fn fetch_rows(&self, mut ids: Vec<u64>) -> Result<HashMap<u64, Row>> {
        if self.table.get().is_none()
            && let Some(d) = &self.disk
            && self.desc.proof.is_some()
        {
            // a cached table lets cached rows be verified without a request
            let root = self.desc.proof.map(|p| hex(&p.root)).unwrap_or_default();
            if d.contains(Kind::Table, &root) {
                self.roots().await?;
            }
        }
        let mut out = self.cached_rows_on_disk(&ids).await;
        ids.retain(|id| !out.contains_key(id));
        if ids.is_empty() {
            return Ok(out);
        }
        ids.sort_unstable();
        let mut pending = coalesce(&ids, self.config.max_gap_rows, self.config.max_run_rows);
        let mut failure = None;
        let mut fresh = Vec::new();
        let mut via = Via::Table;
        for attempt in 1..=2 {
            let (roots, fetched) =
                futures_util::future::join(self.roots(), self.get_runs(&pending)).await;
            let got;
            (via, got) = fetched?;
            let roots = match roots {
                Ok(r) => r,
                Err(e) => {
                    // every row of this attempt is unverifiable: fetch them
                    // (and the table) once more, then give up
                    add(
                        &self.counters.rejected,
                        pending.iter().map(|r| r.count).sum(),
                    );
                    tracing::warn!(url = %self.url, attempt, reason = %e, "the chunk table failed");
                    if attempt == 2 {
                        return Err(e);
                    }
                    continue;
                }
            };
            let (failed, last) = self.accept(&roots, got, &mut out, &mut fresh);
            if failed.is_empty() {
                if let Some(d) = &self.disk {
                    d.put_many(Kind::Row, fresh).await;
                }
                return Ok(out);
            }
            if let (Some(e), Via::Runs(at)) = (&last, &via) {
                // FORMAT.md 7b: fewer bytes than the dense block, same guarantee
                tracing::warn!(url = %at, runs = failed.len(), reason = %e, "rows from the runs object failed verification: fetching them from the row file and the proof object, which are used from now on");
                *crate::inner::lock(&self.runs) = None;
            } else if let Some(e) = &last {
                tracing::warn!(url = %self.url, runs = failed.len(), attempt, reason = %e, "rows failed verification");
            }
            failure = last.or(failure);
            pending = failed;
        }
        Err(self.runs_failed(&via, failure))
    }

    /// Verifies the runs `got`: the rows of those that pass go into `out`
    /// (and, with their records, into `fresh` for the disk cache); returns
    /// the runs that failed and the last failure.
    fn accept(
        &self,
        roots: &[Hash],
        got: Vec<(RowRun, Bytes, Bytes)>,
        out: &mut HashMap<u64, Row>,
        fresh: &mut Vec<(String, Bytes)>,
    ) -> (Vec<RowRun>, Option<gkq_format::Error>) {
        let rb = usize::try_from(self.desc.row_bytes)
            .unwrap_or(usize::MAX)
            .max(1);
        let rl = usize::try_from(self.layout.record_len()).unwrap_or(0);
        let mut failed = Vec::new();
        let mut last = None;
        for (run, rows, records) in got {
            if let Err(e) = self.verify_run(roots, run, &rows, &records) {
                last = Some(e);
                add(&self.counters.rejected, run.count);
                failed.push(run);
                continue;
            }
            for k in 0..run.count as usize {
                let row = rows.slice(k * rb..(k + 1) * rb);
                let rec = records.slice(k * rl..(k + 1) * rl);
                let id = run.first + k as u64;
                if let Some(key) = self.disk_key(id) {
                    fresh.push((key, Bytes::from([&row[..], &rec[..]].concat())));
                }
                out.insert(id, row);
            }
            add(&self.counters.rows_fetched, run.count);
        }
        (failed, last)
    }

    /// Rows that failed verification twice, `last` the last Merkle finding,
    /// `via` where the last attempt got them.
    fn runs_failed(&self, via: &Via, last: Option<gkq_format::Error>) -> ReaderError {
        let source = last.map_or_else(|| "no run verified".into(), gkq_store::BoxError::from);
        let via = match via {
            Via::Runs(at) => format!(" (rows and records from the runs object {at})"),
            Via::Split => format!(" (records from the proof object {})", self.proof_url),
            Via::Table => String::new(),
        };
        ReaderError::Unverified {
            url: self.url.clone(),
            via,
            source,
        }
    }

    /// Checks every row of a run with its path record.
    fn verify_run(
        &self,
        roots: &[Hash],
        run: RowRun,
        rows: &[u8],
        records: &[u8],
    ) -> gkq_format::Result<()> {
        let rb = self.desc.row_bytes as usize;
        let rl = self.layout.record_len() as usize;
        if rows.len() as u64 != run.count * self.desc.row_bytes {
            return Err(gkq_format::Error::RowProof {
                object: self.desc.object.clone(),
                row: run.first,
                reason: "short run".into(),
            });
        }
        for k in 0..run.count as usize {
            let row = rows.get(k * rb..(k + 1) * rb).unwrap_or_default();
            let rec = records.get(k * rl..(k + 1) * rl).unwrap_or_default();
            merkle::check_row(&self.desc, roots, run.first + k as u64, row, rec)?;
        }
        Ok(())
    }
}
