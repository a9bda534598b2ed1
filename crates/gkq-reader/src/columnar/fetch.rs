//! Getting the bytes of row runs: one range per run from the runs object
//! (FORMAT.md 7b), or the rows and their path records from the row file
//! and the proof object (7a).

use bytes::Bytes;
use futures_util::stream::StreamExt;
use gkq_format::runs::RunsLayout;
use gkq_store::{RangeRead, ReadOptions, StoreError};

use super::{Backend, Via, add};
use crate::error::{ReaderError, Result};
use crate::ranges::RowRun;

impl Backend {
    /// Rows and path records of every run: one range per run from the
    /// runs object when there is one (falling back for good to the two
    /// objects if it fails other than by a network error), else
    /// [`Backend::get_split`].
    pub(super) async fn get_runs(
        &self,
        runs: &[RowRun],
    ) -> Result<(Via, Vec<(RowRun, Bytes, Bytes)>)> {
        let Some((at, layout)) = crate::inner::lock(&self.runs).clone() else {
            return Ok((Via::Split, self.get_split(runs).await?));
        };
        match self.get_interleaved(&at, layout, runs).await {
            Ok(got) => Ok((Via::Runs(at), got)),
            Err(ReaderError::Store(e))
                if !e.is_unreachable()
                    && !matches!(e, StoreError::Transport { timeout: true, .. }) =>
            {
                tracing::warn!(url = %at, reason = %e, "the runs object failed: rows and records from the row file and the proof object from now on");
                *crate::inner::lock(&self.runs) = None;
                Ok((Via::Split, self.get_split(runs).await?))
            }
            Err(e) => Err(e),
        }
    }

    /// One range of the runs object per run, all in flight at once.
    async fn get_interleaved(
        &self,
        at: &str,
        layout: RunsLayout,
        runs: &[RowRun],
    ) -> Result<Vec<(RowRun, Bytes, Bytes)>> {
        let limit = if self.store.multiplexed() {
            self.config.concurrency_multiplexed
        } else {
            self.config.concurrency
        };
        let total = layout.object_len();
        let mut stream = futures_util::stream::iter(runs.iter().copied())
            .map(|run| async move {
                let (s, e) = layout.range(run.first, run.count).unwrap_or((0, 1));
                let opts = ReadOptions {
                    total,
                    ..Default::default()
                };
                let got = self.store.read_vec(at, s, e - 1, opts).await;
                (run, got)
            })
            .buffered(limit.max(1));
        let mut out = Vec::with_capacity(runs.len());
        while let Some((run, got)) = stream.next().await {
            let bytes = got?;
            let (mut rows, mut records) = (Vec::new(), Vec::new());
            for (row, record) in layout.split(&bytes) {
                rows.extend_from_slice(row);
                records.extend_from_slice(record);
            }
            add(&self.counters.proof_bytes, records.len() as u64);
            out.push((run, Bytes::from(rows), Bytes::from(records)));
        }
        Ok(out)
    }

    /// GETs the rows and the path records of every run from the row file
    /// and the proof object, all in flight at once under the concurrency
    /// limit.
    async fn get_split(&self, runs: &[RowRun]) -> Result<Vec<(RowRun, Bytes, Bytes)>> {
        let limit = if self.store.multiplexed() {
            self.config.concurrency_multiplexed
        } else {
            self.config.concurrency
        };
        let with_records = self.layout.record_len() > 0;
        let proof_len = self.layout.object_len();
        let mut jobs: Vec<(usize, bool, RowRun)> = Vec::with_capacity(2 * runs.len());
        for (i, &r) in runs.iter().enumerate() {
            jobs.push((i, false, r));
            if with_records {
                jobs.push((i, true, r));
            }
        }
        let mut fetched: Vec<(RowRun, Bytes, Bytes)> = runs
            .iter()
            .map(|&r| (r, Bytes::new(), Bytes::new()))
            .collect();
        let mut stream = futures_util::stream::iter(jobs)
            .map(|(i, records, run)| async move {
                let got = if records {
                    let (s, e) = self
                        .layout
                        .records_range(run.first, run.count)
                        .unwrap_or((0, 1));
                    let opts = ReadOptions {
                        total: proof_len,
                        ..Default::default()
                    };
                    let r = self.store.read_vec(&self.proof_url, s, e - 1, opts).await;
                    r.map_err(|e| self.proof_error(e))
                } else {
                    let (s, e) = run.bytes(self.desc.row_bytes);
                    let opts = ReadOptions {
                        total: Some(self.desc.byte_len),
                        ..Default::default()
                    };
                    let r = self.store.read_vec(&self.url, s, e, opts).await;
                    r.map_err(ReaderError::from)
                };
                (i, records, got)
            })
            .buffer_unordered(limit.max(1));
        while let Some((i, records, got)) = stream.next().await {
            let bytes = Bytes::from(got?);
            if records {
                add(&self.counters.proof_bytes, bytes.len() as u64);
                fetched[i].2 = bytes;
            } else {
                fetched[i].1 = bytes;
            }
        }
        Ok(fetched)
    }
}
