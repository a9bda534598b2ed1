//! The `knot` check: the structure rules (the parser's), and each block's
//! payload against its digest, in one pass that also feeds the block's row
//! files to the `columnar` check ([`super::columnar`]); spectral blocks
//! must decode to finite values.

use std::path::Path;

use gkq_format::{Block, Encoding, Knot};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::columnar;
use super::home::{Buffers, Homes, Source};
use crate::Progress;
use crate::files::Pages;
use crate::report::{CheckFindings, Finding};

/// Bytes read per step.
const CHUNK: usize = 8 << 20;

/// A spectral block's factors decode (FORMAT.md section 5) and reconstruct
/// to finite values in the block's dtype.
fn check_spectral_decodes(block: &Block, payload: &[u8]) -> Result<(), Finding> {
    if !matches!(block.encoding, Encoding::Spectral { .. }) {
        return Ok(());
    }
    let w = gkq_format::reconstruct_spectral(block, payload)?;
    let mut v = Vec::new();
    gkq_format::decode_f32(&w, block.dtype, &mut v);
    match v.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => {
            let cols = block.shape.get(1).copied().unwrap_or(1).max(1) as usize;
            Err(Finding::SpectralNotFinite {
                value: v[i],
                row: i / cols,
                col: i % cols,
            })
        }
    }
}

/// The knot and columnar findings of one block.
pub(crate) struct BlockChecked {
    pub(crate) knot: CheckFindings,
    pub(crate) columnar: CheckFindings,
}

/// Hashes a block's payload; for a columnar block, also checks each row
/// file in the same pass.
pub(crate) fn check_block(
    (knot, homes): (&Knot<'_>, &Homes),
    pages: &Pages<'_>,
    dir: &Path,
    index: usize,
    progress: &dyn Progress,
) -> BlockChecked {
    let (mut acc, mut cols) = (CheckFindings::default(), CheckFindings::default());
    let block = &knot.blocks()[index];
    let mut files = columnar::open_all(block, dir, &mut cols);
    homes.report(index, block, &mut acc);
    let (Some(payload), Some(p)) = (homes.source(knot, index), block.encoding.payload()) else {
        return BlockChecked {
            knot: acc,
            columnar: cols,
        };
    };
    let mut hasher = Sha256::new();
    let width = block.shape.get(1).copied().unwrap_or(1);
    let src_row = block.dtype.row_bytes(width).unwrap_or(0) as usize;
    let step = CHUNK
        .checked_div(src_row)
        .map_or(CHUNK, |n| n.max(1) * src_row);
    let (mut at, mut bufs) = (0usize, Buffers::default());
    let shown = format!("block {}", block.name);
    while at < p.len as usize {
        let n = step.max(1).min(p.len as usize - at);
        let chunk = match payload.read(at as u64, n, &mut bufs) {
            Ok(c) => c,
            Err(e) => return unreadable((acc, cols), block, e),
        };
        acc.bytes += chunk.len() as u64;
        progress.advance(chunk.len() as u64);
        let first_row = at.checked_div(src_row).unwrap_or(0) as u64;
        let rows = chunk.len().checked_div(src_row).unwrap_or(0);
        // the payload's digest and every row file's checks, all at once
        let ((), taken) = rayon::join(
            || hasher.update(chunk),
            || {
                let take = |rf: &mut columnar::RowFile<'_>| {
                    (
                        rf.object().to_owned(),
                        rf.take(block, chunk, first_row, rows),
                    )
                };
                files
                    .par_iter_mut()
                    .filter(|rf| !rf.broken())
                    .map(take)
                    .collect::<Vec<_>>()
            },
        );
        for (object, r) in taken {
            match r {
                Ok(n) => cols.bytes += n,
                Err(f) => cols.fail(dir.join(&object).display().to_string(), f),
            }
        }
        at += n;
        pages.release(chunk);
    }
    let digest: [u8; 32] = hasher.finalize().into();
    if let Err(e) = gkq_format::check_payload_digest(knot.header().header(), index, p, digest) {
        acc.fail(shown, e);
    } else if let Source::Knot(payload) = payload
        && let Err(f) = check_spectral_decodes(block, payload)
    {
        acc.fail(shown, f);
    }
    finish_files(files, (knot, block), dir, &mut cols);
    BlockChecked {
        knot: acc,
        columnar: cols,
    }
}

/// The checks of `block`'s row files that need them whole, and of the
/// runs and warm objects beside them.
fn finish_files(
    files: Vec<columnar::RowFile<'_>>,
    (knot, block): (&Knot<'_>, &Block),
    dir: &Path,
    cols: &mut CheckFindings,
) {
    let h = knot.header().header();
    for rf in files {
        let d = rf.descriptor();
        rf.finish(block, dir, cols);
        if h.has_runs(&d.object) {
            columnar::check_runs(d, dir, cols);
        }
        if h.has_warm(&d.object) {
            columnar::check_warm(d, &h.warm_rows(), dir, cols);
        }
    }
}

/// The findings so far, and a home row file that failed a read.
fn unreadable(
    (mut acc, columnar): (CheckFindings, CheckFindings),
    block: &Block,
    e: std::io::Error,
) -> BlockChecked {
    let finding = super::home::unreadable(block, e.to_string());
    acc.fail(format!("block {}", block.name), finding);
    BlockChecked {
        knot: acc,
        columnar,
    }
}

/// The `knot` line's summary.
pub(crate) fn summary(knot: &Knot<'_>) -> String {
    let header = knot.header().header();
    let spectral = header
        .blocks
        .iter()
        .filter(|b| matches!(b.encoding, Encoding::Spectral { .. }))
        .count();
    let decoded = if spectral > 0 {
        format!(", {spectral} spectral blocks decoded")
    } else {
        String::new()
    };
    format!(
        "{} blocks, header and payload digests{decoded}",
        header.blocks.len()
    )
}
