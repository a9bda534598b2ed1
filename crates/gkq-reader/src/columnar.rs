//! `ColumnarEmbedBackend`: rows of a row file over HTTP range requests, with
//! an in-process LRU keyed by token id.
//!
//! `rows(ids)` dedupes the ids, serves hits from the cache, and turns the
//! misses into byte ranges ([`crate::ranges::coalesce`]), which go out as
//! parallel single-range GETs (R2 and S3 do not serve multi-range requests)
//! with a concurrency limit. Rows come back in request order. A row being
//! fetched by one caller is waited for by the others, so concurrent callers
//! asking for overlapping rows fetch each row once; rows enter the cache
//! only whole and only from a checked 206 response.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use gkq_format::{ColumnarDescriptor, DType};
use lru::LruCache;
use serde::Serialize;

use crate::error::{ReaderError, Result};
use crate::ranges::{RowRun, coalesce};
use gkq_store::Store as Http;

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

/// Cache counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Distinct rows served from the cache.
    pub hits: u64,
    /// Distinct rows that had to be fetched (or waited for).
    pub misses: u64,
    /// Rows fetched over HTTP, gap rows included.
    pub rows_fetched: u64,
}

impl CacheStats {
    /// `self - earlier`.
    pub fn since(&self, e: &CacheStats) -> CacheStats {
        CacheStats {
            hits: self.hits - e.hits,
            misses: self.misses - e.misses,
            rows_fetched: self.rows_fetched - e.rows_fetched,
        }
    }
}

type Row = Arc<[u8]>;

struct Slot {
    done: Mutex<Option<std::result::Result<Row, Arc<ReaderError>>>>,
    cv: Condvar,
}

struct State {
    lru: LruCache<u64, Row>,
    inflight: HashMap<u64, Arc<Slot>>,
}

/// Rows of one row file, fetched by range and cached.
pub struct ColumnarEmbedBackend {
    url: String,
    desc: ColumnarDescriptor,
    config: FetchConfig,
    http: Arc<Http>,
    state: Mutex<State>,
    hits: AtomicU64,
    misses: AtomicU64,
    rows_fetched: AtomicU64,
}

impl std::fmt::Debug for ColumnarEmbedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColumnarEmbedBackend")
            .field("url", &self.url)
            .field("rows", &self.desc.rows)
            .field("row_bytes", &self.desc.row_bytes)
            .finish_non_exhaustive()
    }
}

impl ColumnarEmbedBackend {
    /// A backend for the row file `desc` at `url` (not contacted here).
    pub fn new(
        url: String,
        desc: ColumnarDescriptor,
        config: FetchConfig,
        http: Arc<Http>,
    ) -> Self {
        let cap = NonZeroUsize::new(config.cache_rows.max(1)).expect("max(1) is non-zero");
        ColumnarEmbedBackend {
            url,
            desc,
            config,
            http,
            state: Mutex::new(State {
                lru: LruCache::new(cap),
                inflight: HashMap::new(),
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            rows_fetched: AtomicU64::new(0),
        }
    }

    /// Rows in the file.
    pub fn rows_total(&self) -> u64 {
        self.desc.rows
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> u64 {
        self.desc.row_bytes
    }

    /// Dtype of the rows.
    pub fn dtype(&self) -> DType {
        self.desc.dtype
    }

    /// The row file URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            rows_fetched: self.rows_fetched.load(Ordering::Relaxed),
        }
    }

    /// Rows currently cached.
    pub fn cached_rows(&self) -> usize {
        self.lock().lru.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checks every id against the vocabulary before anything is fetched.
    pub fn check_ids(&self, ids: &[u64]) -> Result<()> {
        match ids.iter().find(|&&id| id >= self.desc.rows) {
            Some(&id) => Err(ReaderError::TokenOutOfRange {
                id,
                vocab: self.desc.rows,
            }),
            None => Ok(()),
        }
    }

    /// The rows of `ids`, in request order (duplicates allowed).
    pub fn rows(&self, ids: &[u64]) -> Result<Vec<Row>> {
        self.check_ids(ids)?;
        let mut found: HashMap<u64, Row> = HashMap::with_capacity(ids.len());
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        let mut mine: Vec<(u64, Arc<Slot>)> = Vec::new();
        let mut theirs: Vec<(u64, Arc<Slot>)> = Vec::new();
        {
            let mut st = self.lock();
            for &id in ids {
                if !seen.insert(id) {
                    continue;
                }
                if let Some(row) = st.lru.get(&id) {
                    found.insert(id, row.clone());
                } else if let Some(slot) = st.inflight.get(&id) {
                    theirs.push((id, slot.clone()));
                } else {
                    let slot = Arc::new(Slot {
                        done: Mutex::new(None),
                        cv: Condvar::new(),
                    });
                    st.inflight.insert(id, slot.clone());
                    mine.push((id, slot));
                }
            }
        }
        self.hits.fetch_add(found.len() as u64, Ordering::Relaxed);
        self.misses
            .fetch_add((mine.len() + theirs.len()) as u64, Ordering::Relaxed);
        if !mine.is_empty() {
            // one Arc for every caller waiting on these rows: the same typed error
            let fetched = self.fetch(&mine).map_err(Arc::new);
            let mut st = self.lock();
            if let Ok(rows) = &fetched {
                for (id, row) in rows {
                    st.lru.put(*id, row.clone());
                }
            }
            for (id, _) in &mine {
                st.inflight.remove(id);
            }
            drop(st);
            let rows = fetched.as_ref().ok();
            for (id, slot) in &mine {
                let r = match (rows.and_then(|r| r.get(id)), &fetched) {
                    (Some(row), _) => Ok(row.clone()),
                    (None, Err(e)) => Err(e.clone()),
                    (None, Ok(_)) => Err(Arc::new(ReaderError::Missing(format!(
                        "row {id} missing from its range"
                    )))),
                };
                *slot
                    .done
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(r);
                slot.cv.notify_all();
            }
            let rows = fetched.map_err(ReaderError::Shared)?;
            for (id, _) in &mine {
                if let Some(row) = rows.get(id) {
                    found.insert(*id, row.clone());
                }
            }
        }
        for (id, slot) in theirs {
            let mut done = slot
                .done
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            while done.is_none() {
                done = slot
                    .cv
                    .wait(done)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            match done.as_ref().expect("loop ends when set") {
                Ok(row) => {
                    found.insert(id, row.clone());
                }
                Err(e) => return Err(ReaderError::Shared(e.clone())),
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

    /// Fetches `rows(ids)` into the cache without returning them: "tokenize,
    /// dedupe, issue range fetches in parallel before the embed lookup".
    pub fn prefetch(&self, ids: &[u64]) -> Result<()> {
        self.rows(ids).map(drop)
    }

    /// Fetches the claimed ids: coalesced runs, parallel GETs. Returns every
    /// row received (gap rows too).
    fn fetch(&self, claimed: &[(u64, Arc<Slot>)]) -> Result<HashMap<u64, Row>> {
        let mut ids: Vec<u64> = claimed.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        let runs = coalesce(&ids, self.config.max_gap_rows, self.config.max_run_rows);
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<(RowRun, Vec<u8>)>> = Mutex::new(Vec::new());
        let first_error: Mutex<Option<ReaderError>> = Mutex::new(None);
        let limit = if self.http.multiplexed() {
            self.config.concurrency_multiplexed
        } else {
            self.config.concurrency
        };
        let workers = limit.max(1).min(runs.len());
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(run) = runs.get(i) else { break };
                        if first_error.lock().map(|e| e.is_some()).unwrap_or(true) {
                            break;
                        }
                        let (start, end) = run.bytes(self.desc.row_bytes);
                        match self.http.get_range_vec(
                            &self.url,
                            start,
                            end,
                            Some(self.desc.byte_len),
                        ) {
                            Ok(bytes) => results
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .push((*run, bytes)),
                            Err(e) => {
                                let mut fe = first_error
                                    .lock()
                                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                                if fe.is_none() {
                                    *fe = Some(ReaderError::from(e));
                                }
                            }
                        }
                    }
                });
            }
        });
        if let Some(e) = first_error
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            return Err(e);
        }
        let rb = self.desc.row_bytes as usize;
        let mut out = HashMap::new();
        for (run, bytes) in results
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            for (k, row) in bytes.chunks_exact(rb.max(1)).enumerate() {
                out.insert(run.first + k as u64, Row::from(row));
            }
            self.rows_fetched.fetch_add(run.count, Ordering::Relaxed);
        }
        Ok(out)
    }
}
