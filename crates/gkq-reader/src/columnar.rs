//! `ColumnarEmbedBackend`: rows of a row file over HTTP range requests, each
//! verified against the knot's Merkle root (FORMAT.md 7a), with an
//! in-process LRU keyed by token id.
//!
//! `rows(ids)` dedupes the ids, serves hits from the cache, and turns the
//! misses into byte ranges ([`crate::ranges::coalesce`]), which go out as
//! parallel single-range GETs (R2 and S3 do not serve multi-range requests)
//! with a concurrency limit. Rows come back in request order. A row being
//! fetched by one caller is waited for by the others, so concurrent callers
//! asking for overlapping rows fetch each row once; rows enter the cache
//! only whole, only from a checked 206 response, and only once their path
//! record proves them against the chunk table, which is itself fetched
//! once (in parallel with the first rows) and checked against the root.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use gkq_format::merkle::{self, Hash, ProofLayout};
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
    /// Rows fetched over HTTP and verified, gap rows included.
    pub rows_fetched: u64,
    /// Proof bytes fetched: path records and the chunk table (FORMAT.md 7a).
    pub proof_bytes: u64,
    /// Rows fetched that failed verification and were discarded.
    pub rows_rejected: u64,
}

impl CacheStats {
    /// `self - earlier`.
    pub fn since(&self, e: &CacheStats) -> CacheStats {
        CacheStats {
            hits: self.hits - e.hits,
            misses: self.misses - e.misses,
            rows_fetched: self.rows_fetched - e.rows_fetched,
            proof_bytes: self.proof_bytes - e.proof_bytes,
            rows_rejected: self.rows_rejected - e.rows_rejected,
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
    /// The chunk table (FORMAT.md 7a): fetched once, by one caller.
    table: Table,
}

/// The chunk table's state, shared by concurrent callers.
#[derive(Clone)]
enum Table {
    /// Not fetched (or the last fetch failed).
    Absent,
    /// One caller is fetching it, alongside its rows.
    Fetching,
    /// Fetched and checked against the root.
    Ready(Arc<Vec<Hash>>),
}

/// Rows of one row file, fetched by range and cached.
pub struct ColumnarEmbedBackend {
    url: String,
    proof_url: String,
    desc: ColumnarDescriptor,
    layout: ProofLayout,
    config: FetchConfig,
    http: Arc<Http>,
    state: Mutex<State>,
    hits: AtomicU64,
    misses: AtomicU64,
    rows_fetched: AtomicU64,
    proof_bytes: AtomicU64,
    rejected: AtomicU64,
    table_cv: Condvar,
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
    /// A backend for the row file `desc` at `url` (not contacted here). Its
    /// proof object is at `url` + `.proof` (FORMAT.md 7a); a descriptor
    /// without a row proof (a version 2 knot) is refused, since its rows
    /// could not be verified.
    pub fn new(
        url: String,
        desc: ColumnarDescriptor,
        config: FetchConfig,
        http: Arc<Http>,
    ) -> Result<Self> {
        let layout = merkle::layout_of(&desc).ok_or_else(|| {
            ReaderError::Missing(format!(
                "{url}: the knot records no row proof for {}, so its rows cannot be verified",
                desc.object
            ))
        })?;
        let cap = NonZeroUsize::new(config.cache_rows.max(1)).expect("max(1) is non-zero");
        let (path, rest) = url.split_at(url.find(['?', '#']).unwrap_or(url.len()));
        Ok(ColumnarEmbedBackend {
            proof_url: format!("{path}{}{rest}", merkle::PROOF_SUFFIX),
            url,
            desc,
            layout,
            config,
            http,
            state: Mutex::new(State {
                lru: LruCache::new(cap),
                inflight: HashMap::new(),
                table: Table::Absent,
            }),
            table_cv: Condvar::new(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            rows_fetched: AtomicU64::new(0),
            proof_bytes: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        })
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
            proof_bytes: self.proof_bytes.load(Ordering::Relaxed),
            rows_rejected: self.rejected.load(Ordering::Relaxed),
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

    /// Whether this caller should fetch the chunk table with its rows: yes
    /// if nobody has it or is fetching it (and then it is now "fetching").
    fn claim_table(&self) -> bool {
        let mut st = self.lock();
        match st.table {
            Table::Absent => {
                st.table = Table::Fetching;
                true
            }
            Table::Fetching | Table::Ready(_) => false,
        }
    }

    /// Records the outcome of this caller's table fetch and wakes the others.
    fn settle_table(&self, fetched: Option<&[u8]>) -> gkq_format::Result<Arc<Vec<Hash>>> {
        let checked = match fetched {
            Some(t) => merkle::check_table(&self.desc, t).map(Arc::new),
            None => Err(gkq_format::Error::ProofTable {
                object: self.proof_url.clone(),
                reason: "not fetched".into(),
            }),
        };
        self.lock().table = match &checked {
            Ok(r) => Table::Ready(r.clone()),
            Err(_) => Table::Absent,
        };
        self.table_cv.notify_all();
        checked
    }

    /// The checked table, waiting for the caller that fetches it; fetches it
    /// alone if that caller failed.
    fn wait_table(&self) -> Result<Arc<Vec<Hash>>> {
        let mut st = self.lock();
        loop {
            match &st.table {
                Table::Ready(r) => return Ok(r.clone()),
                Table::Fetching => {
                    st = self
                        .table_cv
                        .wait(st)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                Table::Absent => {
                    st.table = Table::Fetching;
                    drop(st);
                    let got = self.get_all(&[], true);
                    let table = got.as_ref().ok().and_then(|(t, _)| t.as_deref());
                    let settled = self.settle_table(table);
                    got?;
                    return settled.map_err(|e| ReaderError::Unverified {
                        url: self.url.clone(),
                        reason: e.to_string(),
                    });
                }
            }
        }
    }

    /// Fetches the claimed ids: coalesced runs, each as a GET of its rows and
    /// a GET of their path records, all in parallel (with the chunk table on
    /// the first fetch). Every row is verified against the knot's Merkle
    /// root before it is returned; runs that fail are fetched once more,
    /// then the call fails with [`ReaderError::Unverified`]. Returns every
    /// row received and verified (gap rows too).
    fn fetch(&self, claimed: &[(u64, Arc<Slot>)]) -> Result<HashMap<u64, Row>> {
        let mut ids: Vec<u64> = claimed.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        let mut pending = coalesce(&ids, self.config.max_gap_rows, self.config.max_run_rows);
        let mut out = HashMap::new();
        let mut failure = String::new();
        for attempt in 1..=2 {
            let mine = self.claim_table();
            let got = self.get_all(&pending, mine);
            let roots = if mine {
                let table = got.as_ref().ok().and_then(|(t, _)| t.as_deref());
                let settled = self.settle_table(table);
                if got.is_err() {
                    // a transport error: reported as such below
                    None
                } else {
                    match settled {
                        Ok(r) => Some(r),
                        Err(e) => {
                            // every row of this attempt is unverifiable
                            let n: u64 = pending.iter().map(|r| r.count).sum();
                            self.rejected.fetch_add(n, Ordering::Relaxed);
                            failure = e.to_string();
                            log::warn!("{}: {failure} (attempt {attempt})", self.url);
                            continue;
                        }
                    }
                }
            } else {
                Some(self.wait_table()?)
            };
            let (_, fetched) = got?;
            let roots = roots.expect("set whenever got is Ok");
            let mut failed = Vec::new();
            for (run, rows, records) in fetched {
                match self.verify_run(&roots, run, &rows, &records) {
                    Ok(()) => {
                        let rb = self.desc.row_bytes as usize;
                        for (k, row) in rows.chunks_exact(rb.max(1)).enumerate() {
                            out.insert(run.first + k as u64, Row::from(row));
                        }
                        self.rows_fetched.fetch_add(run.count, Ordering::Relaxed);
                    }
                    Err(e) => {
                        failure = e.to_string();
                        self.rejected.fetch_add(run.count, Ordering::Relaxed);
                        failed.push(run);
                    }
                }
            }
            if failed.is_empty() {
                return Ok(out);
            }
            log::warn!(
                "{}: {} runs of rows failed verification (attempt {attempt}): {failure}",
                self.url,
                failed.len(),
            );
            pending = failed;
        }
        Err(ReaderError::Unverified {
            url: self.url.clone(),
            reason: failure,
        })
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

    /// The byte range (inclusive end) and expected object length of a job.
    fn job_range(&self, job: Job, runs: &[RowRun]) -> (&str, u64, u64, u64) {
        let proof_len = self.layout.object_len().unwrap_or(0);
        match job {
            Job::Table => (&self.proof_url, 0, self.layout.table_len() - 1, proof_len),
            Job::Rows(r) => {
                let (start, end) = runs[r].bytes(self.desc.row_bytes);
                (&self.url, start, end, self.desc.byte_len)
            }
            Job::Records(r) => {
                let (start, end) = self
                    .layout
                    .records_range(runs[r].first, runs[r].count)
                    .unwrap_or((0, 1));
                (&self.proof_url, start, end - 1, proof_len)
            }
        }
    }

    /// GETs the rows and the path records of every run, and the chunk table
    /// if asked, in parallel under the concurrency limit.
    fn get_all(
        &self,
        runs: &[RowRun],
        want_table: bool,
    ) -> Result<(Option<Vec<u8>>, Vec<Fetched>)> {
        let mut jobs = Vec::with_capacity(2 * runs.len() + 1);
        if want_table {
            jobs.push(Job::Table);
        }
        for i in 0..runs.len() {
            jobs.push(Job::Rows(i));
            if self.layout.record_len() > 0 {
                jobs.push(Job::Records(i));
            }
        }
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<(usize, Vec<u8>)>> = Mutex::new(Vec::new());
        let first_error: Mutex<Option<ReaderError>> = Mutex::new(None);
        let limit = if self.http.multiplexed() {
            self.config.concurrency_multiplexed
        } else {
            self.config.concurrency
        };
        let workers = limit.max(1).min(jobs.len());
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&job) = jobs.get(i) else { break };
                        if first_error.lock().map(|e| e.is_some()).unwrap_or(true) {
                            break;
                        }
                        let (url, start, end, total) = self.job_range(job, runs);
                        match self.http.get_range_vec(url, start, end, Some(total)) {
                            Ok(bytes) => results
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .push((i, bytes)),
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
        let mut table = None;
        let mut fetched: Vec<Fetched> = runs.iter().map(|&r| (r, Vec::new(), Vec::new())).collect();
        for (i, bytes) in results
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            let proof = match jobs[i] {
                Job::Table => {
                    let n = bytes.len() as u64;
                    table = Some(bytes);
                    n
                }
                Job::Rows(r) => {
                    fetched[r].1 = bytes;
                    0
                }
                Job::Records(r) => {
                    let n = bytes.len() as u64;
                    fetched[r].2 = bytes;
                    n
                }
            };
            self.proof_bytes.fetch_add(proof, Ordering::Relaxed);
        }
        Ok((table, fetched))
    }
}

/// A run with its rows and its path records.
type Fetched = (RowRun, Vec<u8>, Vec<u8>);

/// One GET of a fetch.
#[derive(Clone, Copy)]
enum Job {
    /// The chunk table of the proof object.
    Table,
    /// The rows of run `i`.
    Rows(usize),
    /// The path records of run `i`.
    Records(usize),
}
