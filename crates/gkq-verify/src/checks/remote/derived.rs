//! The objects a row file's proof object derives (FORMAT.md 7b, 7d),
//! checked at their URLs: the runs object on the sampled rows, the warm
//! object whole.

use std::fs::File;
use std::os::unix::fs::FileExt;

use gkq_format::{ColumnarDescriptor, merkle};
use rayon::prelude::*;

use super::{Http, head, range};
use crate::report::{CheckFindings, RemoteFinding};
use gkq_store::url::join;

/// A runs object (FORMAT.md 7b): its length, and the sampled rows fetched
/// from it, each a single range of row and record, verified and compared
/// with the local row file. Returns (objects, requests).
pub(super) fn check_runs(
    http: &Http,
    d: &ColumnarDescriptor,
    base: &str,
    roots: &[merkle::Hash],
    (rows, local): (&[u64], Option<&File>),
    acc: &mut CheckFindings,
) -> (u64, u64) {
    use gkq_format::runs::{RunsLayout, runs_object_name};
    let url = join(base, &runs_object_name(&d.object));
    let Some(layout) = RunsLayout::of(d) else {
        return (0, 0);
    };
    let total = layout.object_len().unwrap_or(0);
    if let Err(f) = head(http, &url, total) {
        acc.fail(url, f.finding());
        return (1, 1);
    }
    let fetch = |r: u64| -> Result<u64, RemoteFinding> {
        let (s, e) = layout.range(r, 1).unwrap_or((0, 0));
        let body = range(http, &url, (s, e - 1), total).map_err(|b| RemoteFinding::Row {
            row: r,
            inner: Box::new(b.finding),
        })?;
        let row = gkq_format::runs::check_runs(d, roots, r, &body).map_err(|error| {
            RemoteFinding::RowProof {
                error,
                proof_url: url.clone(),
            }
        })?;
        if let Some(f) = local {
            let mut mine = vec![0u8; row.len()];
            let at = r * d.row_bytes;
            if f.read_exact_at(&mut mine, at).is_ok() && mine != row {
                let end = at + d.row_bytes - 1;
                return Err(RemoteFinding::RowDiffers {
                    row: r,
                    start: at,
                    end,
                });
            }
        }
        Ok(body.len() as u64)
    };
    let results: Vec<Result<u64, RemoteFinding>> = rows.par_iter().map(|&r| fetch(r)).collect();
    for r in results {
        match r {
            Ok(n) => acc.bytes += n,
            Err(f) => acc.fail(url.clone(), f),
        }
    }
    (1, 1 + rows.len() as u64)
}

/// A warm object (FORMAT.md 7d): its length, then the whole object in one
/// range, its table and every row checked as a node checks them, the rows
/// compared with the local row file. Returns (objects, requests).
pub(super) fn check_warm(
    http: &Http,
    d: &ColumnarDescriptor,
    base: &str,
    ids: &[u64],
    local: Option<&File>,
    acc: &mut CheckFindings,
) -> (u64, u64) {
    use gkq_format::warm::{WarmLayout, check_warm, warm_object_name};
    let url = join(base, &warm_object_name(&d.object));
    let Some(total) = WarmLayout::of(d, ids.len() as u64).and_then(|l| l.object_len()) else {
        return (0, 0);
    };
    if let Err(f) = head(http, &url, total) {
        acc.fail(url, f.finding());
        return (1, 1);
    }
    let body = match range(http, &url, (0, total - 1), total) {
        Ok(b) => b,
        Err(b) => {
            acc.fail(url, b.finding);
            return (1, 2);
        }
    };
    let proof_url = url.clone();
    let checked = match check_warm(d, ids, &body, None) {
        Ok(c) => c,
        Err(error) => {
            acc.fail(url, RemoteFinding::RowProof { error, proof_url });
            return (1, 2);
        }
    };
    for (_, error) in checked.failed {
        let proof_url = url.clone();
        acc.fail(url.clone(), RemoteFinding::RowProof { error, proof_url });
    }
    for (id, row, _) in &checked.rows {
        let mut mine = vec![0u8; row.len()];
        let at = id * d.stride();
        if let Some(f) = local
            && f.read_exact_at(&mut mine, at).is_ok()
            && mine != *row
        {
            let (row, start, end) = (*id, at, at + d.row_bytes - 1);
            acc.fail(url.clone(), RemoteFinding::RowDiffers { row, start, end });
        }
    }
    acc.bytes += total;
    (1, 2)
}
