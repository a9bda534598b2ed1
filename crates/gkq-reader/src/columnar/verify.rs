//! Fetching and verifying rows: the disk cache first, then coalesced runs
//! (rows and their path records), each row checked against the chunk
//! table before it is kept; runs that fail are fetched once more (from
//! the row file and the proof object when they came from the runs object),
//! then the fetch fails naming the objects.

use std::collections::HashMap;

use bytes::Bytes;
use gkq_format::hex;
use gkq_format::merkle::{self, Hash};
use gkq_store::blocking::lock;
use gkq_store::bump;

use super::{Backend, Row, Via};
use crate::cache::{Kind, Size};
use crate::error::{ReaderError, Result};
use crate::ranges::{RowRun, coalesce};

/// What [`Backend::fetch_rows`] carries from one attempt to the next: the
/// runs still to fetch, the rows verified, and those to put in the disk cache.
pub(super) struct Fetching {
    pending: Vec<RowRun>,
    out: HashMap<u64, Row>,
    fresh: Vec<(String, Bytes)>,
}

impl Backend {
    /// Rows of `ids` from the disk cache, verified (when the table is at hand).
    pub(super) async fn cached_rows_on_disk(&self, ids: &[u64]) -> HashMap<u64, Row> {
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
        bump(&self.counters.rows_from_disk, out.len() as u64);
        out
    }

    /// Fetches `ids`: from the disk cache where it has them, else in
    /// coalesced runs (rows and path records, all in parallel, with the
    /// chunk table on the first fetch). Every row is verified before it is
    /// returned; runs that fail are fetched once more (from the row file
    /// and the proof object when they came from the runs object: FORMAT.md
    /// 7b), then the fetch fails with [`ReaderError::Unverified`] naming
    /// the objects. Returns every row verified (gap rows too).
    pub(super) async fn fetch_rows(&self, mut ids: Vec<u64>) -> Result<HashMap<u64, Row>> {
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
        let out = self.cached_rows_on_disk(&ids).await;
        ids.retain(|id| !out.contains_key(id));
        if ids.is_empty() {
            return Ok(out);
        }
        ids.sort_unstable();
        let pending = coalesce(&ids, self.config.max_gap_rows, self.config.max_run_rows);
        // rows that fail are fetched again (gkq-store's one loop): from the
        // next source when a mirror served them, once more when the origin did
        let start = Fetching {
            pending,
            out,
            fresh: Vec::new(),
        };
        let store = &*self.store;
        let done = gkq_store::until_verified(store, gkq_store::refetch::BYTES, start, |f, n| {
            self.attempt(f, n)
        })
        .await?;
        if let Some(d) = &self.disk {
            d.put_many(Kind::Row, done.fresh).await;
        }
        Ok(done.out)
    }

    /// One attempt of [`Backend::fetch_rows`]: the runs still pending
    /// fetched (with the chunk table) and verified.
    async fn attempt(
        &self,
        mut f: Fetching,
        attempt: usize,
    ) -> Result<gkq_store::Attempt<Fetching, ReaderError, Fetching>> {
        let (roots, fetched) =
            futures_util::future::join(self.roots(), self.get_runs(&f.pending)).await;
        let (via, got) = fetched?;
        let roots = roots.inspect_err(|e| {
            // every row of this attempt is unverifiable (the table was
            // fetched again already, from every source left)
            bump(
                &self.counters.rows_rejected,
                f.pending.iter().map(|r| r.count).sum(),
            );
            tracing::warn!(url = %self.url, attempt, reason = %e, "the chunk table failed");
        })?;
        let (failed, last) = self.accept(&roots, got, &mut f.out, &mut f.fresh);
        let Some(e) = last else {
            return Ok(gkq_store::Attempt::Verified(f));
        };
        if let Via::Runs(at) = &via {
            // FORMAT.md 7b: fewer bytes than the dense block, same guarantee
            tracing::warn!(url = %at, runs = failed.len(), reason = %e, "rows from the runs object failed verification: fetching them from the row file and the proof object, which are used from now on");
            *lock(&self.runs) = None;
        } else {
            tracing::warn!(url = %self.url, runs = failed.len(), attempt, reason = %e, "rows failed verification");
        }
        let culprits = self.culprits(&via, &failed);
        f.pending = failed;
        Ok(gkq_store::Attempt::Failed {
            culprits,
            reason: e.to_string(),
            error: self.runs_failed(&via, Some(e)),
            state: f,
        })
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
                bump(&self.counters.rows_rejected, run.count);
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
            bump(&self.counters.rows_fetched, run.count);
        }
        (failed, last)
    }

    /// Rows that failed verification, `last` the last Merkle finding,
    /// `via` where the last attempt got them.
    fn runs_failed(&self, via: &Via, last: Option<gkq_format::Error>) -> ReaderError {
        let source = last.map_or_else(|| "no run verified".into(), gkq_store::BoxError::from);
        let via = match via {
            Via::Runs(at) => format!(" (rows and records from the runs object {at})"),
            Via::Split => format!(" (records from the proof object {})", self.proof_url),
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
