//! Getting the bytes of row runs: one range per run from the runs object
//! (FORMAT.md 7b), or the rows and their path records from the row file
//! and the proof object (7a). Every read goes through the row file's
//! meter, so the backend knows what it moved without counting by hand.

use bytes::Bytes;
use futures_util::stream::StreamExt;
use gkq_format::runs::RunsLayout;
use gkq_store::blocking::lock;
use gkq_store::{RangeRead, ReadOptions, bump};

use super::{Backend, Via};
use crate::error::{ReaderError, Result};
use crate::ranges::RowRun;

/// Rows, and their records, of one run.
pub(super) type Got = (RowRun, Bytes, Bytes);

impl Backend {
    /// Requests in flight at once: many streams on one HTTP/2 connection,
    /// fewer over HTTP/1.1 (each needs its own connection).
    fn concurrency(&self) -> usize {
        let n = if self.store.multiplexed() {
            self.config.concurrency_multiplexed
        } else {
            self.config.concurrency
        };
        n.max(1)
    }

    /// A range of `run` that the layout cannot express (an overflow): an
    /// error naming the object, never a guess.
    fn overflow(&self, object: &str, run: RowRun) -> ReaderError {
        ReaderError::Compute(format!(
            "{object}: rows {} to {} have no byte range in a file of {} rows",
            run.first,
            run.first.saturating_add(run.count).saturating_sub(1),
            self.desc.rows
        ))
    }

    /// Rows and path records of every run: one range per run from the
    /// runs object when there is one (falling back for good to the two
    /// objects if it fails in a way they may not), else
    /// [`Backend::get_split`]; with where they came from.
    pub(super) async fn get_runs(&self, runs: &[RowRun]) -> Result<(Via, Vec<Got>)> {
        let Some((at, layout)) = lock(&self.runs).clone() else {
            return Ok((Via::Split, self.get_split(runs).await?));
        };
        match self.get_interleaved(&at, layout, runs).await {
            Ok(got) => Ok((Via::Runs(at), got)),
            // records inline (FORMAT.md 7e): no other object holds the rows
            Err(e) if crate::fallback::falls_back(&e) && !self.desc.inline_proof() => {
                tracing::warn!(url = %at, reason = %gkq_format::error_chain(&e), "the runs object failed: rows and records from the row file and the proof object from now on");
                *lock(&self.runs) = None;
                Ok((Via::Split, self.get_split(runs).await?))
            }
            Err(e) => Err(e),
        }
    }

    /// Where the rows of `runs` were read, `via` the objects they came from:
    /// each location with its inclusive byte range (the reads a store with
    /// mirrors distrusts when the rows fail).
    pub(super) fn culprits(&self, via: &Via, runs: &[RowRun]) -> Vec<(String, (u64, u64))> {
        let mut out = Vec::new();
        let runs_layout = lock(&self.runs).clone();
        for &run in runs {
            match (via, &runs_layout) {
                (Via::Runs(at), Some((_, layout))) => {
                    out.extend(layout.range(run.first, run.count).map(|r| (at.clone(), r)));
                }
                _ => {
                    let rows = self.desc.row_range(run.first, run.count);
                    out.extend(rows.map(|r| (self.url.clone(), r)));
                    let records = self.layout.records_range(run.first, run.count);
                    out.extend(records.map(|r| (self.proof_url.clone(), r)));
                }
            }
        }
        out.into_iter()
            .map(|(url, (s, e))| (url, (s, e.saturating_sub(1))))
            .collect()
    }

    /// One range of the runs object per run, all in flight at once.
    async fn get_interleaved(
        &self,
        at: &str,
        layout: RunsLayout,
        runs: &[RowRun],
    ) -> Result<Vec<Got>> {
        let store = self.meter.around(&*self.store);
        let total = layout.object_len();
        let mut stream = futures_util::stream::iter(runs.iter().copied())
            .map(|run| {
                let store = &store;
                async move {
                    let Some((s, e)) = layout.range(run.first, run.count) else {
                        return (run, Err(self.overflow(at, run)));
                    };
                    let opts = ReadOptions {
                        total,
                        ..Default::default()
                    };
                    (
                        run,
                        store
                            .read_vec(at, s, e - 1, opts)
                            .await
                            .map_err(ReaderError::from),
                    )
                }
            })
            .buffered(self.concurrency());
        let mut out = Vec::with_capacity(runs.len());
        while let Some((run, got)) = stream.next().await {
            let bytes = got?;
            let (mut rows, mut records) = (Vec::new(), Vec::new());
            for (row, record) in layout.split(&bytes) {
                rows.extend_from_slice(row);
                records.extend_from_slice(record);
            }
            bump(&self.counters.proof_bytes, records.len() as u64);
            out.push((run, Bytes::from(rows), Bytes::from(records)));
        }
        Ok(out)
    }

    /// GETs the rows and the path records of every run from the row file
    /// and the proof object, all in flight at once under the concurrency
    /// limit.
    async fn get_split(&self, runs: &[RowRun]) -> Result<Vec<Got>> {
        let store = self.meter.around(&*self.store);
        let with_records = self.layout.record_len() > 0;
        let proof_len = self.layout.object_len();
        let mut jobs: Vec<(usize, bool, RowRun)> = Vec::with_capacity(2 * runs.len());
        for (i, &r) in runs.iter().enumerate() {
            jobs.push((i, false, r));
            if with_records {
                jobs.push((i, true, r));
            }
        }
        let mut fetched: Vec<Got> = runs
            .iter()
            .map(|&r| (r, Bytes::new(), Bytes::new()))
            .collect();
        let mut stream = futures_util::stream::iter(jobs)
            .map(|(i, records, run)| {
                let store = &store;
                async move {
                    let (at, range, total) = if records {
                        let r = self.layout.records_range(run.first, run.count);
                        (&self.proof_url, r, proof_len)
                    } else {
                        let r = self.desc.row_range(run.first, run.count);
                        (&self.url, r, Some(self.desc.byte_len))
                    };
                    let Some((s, e)) = range else {
                        return (i, records, Err(self.overflow(at, run)));
                    };
                    let opts = ReadOptions {
                        total,
                        ..Default::default()
                    };
                    let got = store.read_vec(at, s, e - 1, opts).await;
                    (i, records, got.map_err(ReaderError::from))
                }
            })
            .buffer_unordered(self.concurrency());
        while let Some((i, records, got)) = stream.next().await {
            let bytes = Bytes::from(got?);
            if records {
                bump(&self.counters.proof_bytes, bytes.len() as u64);
                fetched[i].2 = bytes;
            } else {
                fetched[i].1 = bytes;
            }
        }
        Ok(fetched)
    }
}
