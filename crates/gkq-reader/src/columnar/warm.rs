//! The warm object (FORMAT.md 7d): the publisher's warm rows with the
//! chunk table and their records, fetched in one range (the entries only
//! when the table is at hand) and verified row by row before they seed the
//! LRU and the disk cache. A node that already holds the table and every
//! warm row on disk makes no request. Warming is an optimisation: a warm
//! object that is missing or fails is reported and not used, and those rows
//! are fetched on demand as 7a and 7b say.

use bytes::Bytes;
use gkq_format::warm::{WarmLayout, check_warm};
use gkq_store::blocking::lock;
use gkq_store::{Meter, RangeRead, ReadOptions, bump};
use serde::Serialize;

use super::Backend;
use crate::cache::Kind;
use crate::error::{ReaderError, Result};

/// What warming the embedding did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WarmReport {
    /// The warm object's URL, when the row file has one.
    pub object: Option<String>,
    /// Warm rows the knot lists.
    pub listed: u64,
    /// Rows verified and put in the cache (from the object or the disk cache).
    pub seeded: u64,
    /// Of those, rows read from the disk cache.
    pub from_disk: u64,
    /// Rows of the object that failed their proofs (not used).
    pub rejected: u64,
    /// Requests the warm-up made.
    pub requests: u64,
    /// Bytes they fetched.
    pub bytes: u64,
    /// Why the warm object was not used, if it was not.
    pub unused: Option<WarmUnused>,
}

/// Why a warm object was not used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "cause")]
pub enum WarmUnused {
    /// The package has no warm object for the row file read.
    NoWarmObject,
    /// The embedding reads the knot's dense block, not a row file.
    Dense,
    /// Fetching or checking it failed (missing, another length, a chunk
    /// table that fails its root): the rows come on demand instead.
    Failed {
        /// The error, with its causes.
        error: String,
    },
}

/// One fetch of the warm object: the rows that passed, how many failed,
/// and (when some did) why and the byte range read.
type WarmGot = (Vec<(u64, Bytes)>, u64, Option<(String, (u64, u64))>);

/// How the warm object's attempts end short of every row verified: the
/// rows that passed after the last attempt, or an error.
enum WarmEnd {
    Partial(Vec<(u64, Bytes)>, u64),
    Error(ReaderError),
}

impl std::fmt::Display for WarmUnused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WarmUnused::NoWarmObject => {
                write!(f, "the package has no warm object for this row file")
            }
            WarmUnused::Dense => write!(f, "the embedding is read from the knot's dense block"),
            WarmUnused::Failed { error } => write!(f, "{error}"),
        }
    }
}

impl Backend {
    /// Warms the LRU with the warm object of this row file, if the knot
    /// lists one (see the module docs).
    pub(super) async fn warm(&self) -> WarmReport {
        let Some((url, ids)) = self.warm.clone() else {
            let unused = Some(WarmUnused::NoWarmObject);
            return WarmReport {
                unused,
                ..WarmReport::default()
            };
        };
        let mut report = WarmReport {
            object: Some(url.clone()),
            listed: ids.len() as u64,
            ..WarmReport::default()
        };
        let meter = Meter::default();
        if let Err(e) = self.warm_from(&url, &ids, &meter, &mut report).await {
            tracing::warn!(url = %url, reason = %gkq_format::error_chain(&e), "the warm object is not used: its rows come on demand");
            report.unused = Some(WarmUnused::Failed {
                error: gkq_format::error_chain(&e),
            });
        }
        let moved = meter.moved();
        (report.requests, report.bytes) = (moved.reads, moved.bytes);
        report
    }

    async fn warm_from(
        &self,
        url: &str,
        ids: &[u64],
        meter: &Meter,
        report: &mut WarmReport,
    ) -> Result<()> {
        let on_disk = self.disk.as_ref().is_some_and(|d| {
            let root = self.desc.proof.map(|p| gkq_format::hex(&p.root));
            root.is_some_and(|r| d.contains(Kind::Table, &r))
        });
        if self.table.get().is_some() || on_disk {
            self.roots().await?;
            let cached = self.cached_rows_on_disk(ids).await;
            if cached.len() == ids.len() {
                report.from_disk = cached.len() as u64;
                report.seeded = self.seed(cached.into_iter());
                return Ok(());
            }
            // some are missing: the one range brings them all
        }
        // rows that fail their proofs, or a table that does, are fetched
        // again (gkq-store's one loop: from the next source when a mirror
        // served them, once more when the origin did); after that, the rows
        // that passed are used and the others counted
        let store = &*self.store;
        let got = gkq_store::until_verified(store, gkq_store::refetch::BYTES, (), |(), _| async {
            let (rows, rejected, failure) = match self.fetch_warm(url, ids, meter).await {
                Ok(got) => got,
                Err((e, None)) => return Err(WarmEnd::Error(e)),
                Err((e, Some(range))) => {
                    return Ok(gkq_store::Attempt::Failed {
                        culprits: vec![(url.to_owned(), range)],
                        reason: e.to_string(),
                        error: WarmEnd::Error(e),
                        state: (),
                    });
                }
            };
            Ok(match failure {
                None => gkq_store::Attempt::Verified((rows, rejected)),
                Some((reason, range)) => gkq_store::Attempt::Failed {
                    culprits: vec![(url.to_owned(), range)],
                    reason,
                    error: WarmEnd::Partial(rows, rejected),
                    state: (),
                },
            })
        })
        .await;
        let (rows, rejected) = match got {
            Ok(got) => got,
            Err(WarmEnd::Partial(rows, rejected)) => (rows, rejected),
            Err(WarmEnd::Error(e)) => return Err(e),
        };
        report.rejected = rejected;
        report.seeded = self.seed(rows.into_iter());
        bump(&self.counters.rows_fetched, report.seeded);
        Ok(())
    }

    /// One fetch of the warm object (its entries only when the table is at
    /// hand), checked: the rows that passed (also stored in the disk
    /// cache), how many failed, and why with the range read. A table or
    /// length that fails is [`ReaderError::Unverified`], with the range.
    async fn fetch_warm(
        &self,
        url: &str,
        ids: &[u64],
        meter: &Meter,
    ) -> std::result::Result<WarmGot, (ReaderError, Option<(u64, u64)>)> {
        let layout = WarmLayout::of(&self.desc, ids.len() as u64).ok_or_else(|| {
            let e = ReaderError::Missing(format!("{url}: no warm object layout"));
            (e, None)
        })?;
        let total = layout.object_len().unwrap_or(0);
        let roots = self.table.get().cloned();
        let start = if roots.is_some() {
            layout.table_len()
        } else {
            0
        };
        let range = (start, total - 1);
        let store = meter.around(&*self.store);
        let store = self.meter.around(&store);
        let opts = ReadOptions {
            total: Some(total),
            ..Default::default()
        };
        let bytes = store
            .read_vec(url, start, total - 1, opts)
            .await
            .map_err(|e| (e.into(), None))?;
        let checked = check_warm(&self.desc, ids, &bytes, roots.as_deref().map(Vec::as_slice))
            .map_err(|e| {
                let e = ReaderError::Unverified {
                    url: url.to_owned(),
                    via: " (the warm object)".into(),
                    source: e.into(),
                };
                (e, Some(range))
            })?;
        if roots.is_none() {
            let _ = self.table.set(std::sync::Arc::new(checked.roots.clone()));
            if let (Some(d), Some(p)) = (&self.disk, self.desc.proof) {
                let raw: Vec<u8> = checked.roots.concat();
                d.put(Kind::Table, &gkq_format::hex(&p.root), Bytes::from(raw))
                    .await;
            }
        }
        let rejected = checked.failed.len() as u64;
        bump(&self.counters.rows_rejected, rejected);
        let failure = checked.failed.first().map(|(id, e)| {
            tracing::warn!(url = %url, row = id, rejected, reason = %e, "warm rows failed their proofs: not used");
            (e.to_string(), range)
        });
        let mut fresh = Vec::with_capacity(checked.rows.len());
        let mut rows = Vec::with_capacity(checked.rows.len());
        for &(id, row, record) in &checked.rows {
            if let Some(key) = self.disk_key(id) {
                fresh.push((key, Bytes::from([row, record].concat())));
            }
            rows.push((id, Bytes::copy_from_slice(row)));
        }
        if let Some(d) = &self.disk {
            d.put_many(Kind::Row, fresh).await;
        }
        Ok((rows, rejected, failure))
    }

    /// Puts verified rows in the LRU; how many.
    fn seed(&self, rows: impl Iterator<Item = (u64, Bytes)>) -> u64 {
        let mut st = lock(&self.state);
        let mut n = 0;
        for (id, row) in rows {
            st.lru.put(id, row);
            n += 1;
        }
        n
    }
}
