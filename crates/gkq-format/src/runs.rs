//! Runs objects (docs/FORMAT.md section 7b): each row of a row file
//! followed by its path record, so that a run of rows and everything that
//! verifies them is one byte range of one object.
//!
//! ```text
//! runs[i × stride .. i × stride + row_bytes]            == row i
//! runs[i × stride + row_bytes .. (i + 1) × stride]      == record i of the proof object
//! stride = row_bytes + 32 × proof_height
//! ```

use std::io::{Read, Write};

use crate::merkle::{Hash, ProofLayout, check_row, chunk_records};
use crate::model::ColumnarDescriptor;

/// Suffix of a runs object's name: `<object>.runs`.
pub const RUNS_SUFFIX: &str = ".runs";

/// The name of the runs object of row file `object`.
pub fn runs_object_name(object: &str) -> String {
    format!("{object}{RUNS_SUFFIX}")
}

/// The geometry of a runs object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunsLayout {
    /// Rows of the row file.
    pub rows: u64,
    /// Bytes per row.
    pub row_bytes: u64,
    /// Bytes of one path record, `32 × proof_height` (at least 32).
    pub record_len: u64,
}

impl RunsLayout {
    /// The layout for `desc`: it needs a row proof of height at least 1
    /// (with height 0 there are no records, and the row file is its own
    /// runs object).
    pub fn of(desc: &ColumnarDescriptor) -> Option<RunsLayout> {
        let proof = desc.proof?;
        let layout = ProofLayout::new(desc.rows, proof.height)?;
        if proof.height == 0 {
            return None;
        }
        let l = RunsLayout {
            rows: desc.rows,
            row_bytes: desc.row_bytes,
            record_len: layout.record_len(),
        };
        l.object_len()?;
        Some(l)
    }

    /// Bytes per row and record: `row_bytes + 32 × proof_height`.
    pub fn stride(&self) -> u64 {
        self.row_bytes.saturating_add(self.record_len)
    }

    /// Length of the object: `rows × stride`.
    pub fn object_len(&self) -> Option<u64> {
        self.rows
            .checked_mul(self.row_bytes.checked_add(self.record_len)?)
    }

    /// Byte range `[start, end)` of rows `first..first + count`.
    pub fn range(&self, first: u64, count: u64) -> Option<(u64, u64)> {
        let end = first.checked_add(count)?;
        if end > self.rows {
            return None;
        }
        Some((
            first.checked_mul(self.stride())?,
            end.checked_mul(self.stride())?,
        ))
    }

    /// The `(row, record)` pairs of a fetched range of whole strides.
    pub fn split<'a>(&self, bytes: &'a [u8]) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        strides(bytes, self.row_bytes, self.stride())
    }
}

/// The `(row, record)` pairs of whole strides of `stride` bytes, each a row
/// of `row_bytes` followed by its record (runs objects, 7b; the entries of
/// warm objects, 7d).
pub(crate) fn strides(
    bytes: &[u8],
    row_bytes: u64,
    stride: u64,
) -> impl Iterator<Item = (&[u8], &[u8])> {
    let rb = usize::try_from(row_bytes).unwrap_or(usize::MAX);
    let stride = usize::try_from(stride).unwrap_or(usize::MAX).max(1);
    bytes
        .chunks_exact(stride)
        .map(move |s| s.split_at(rb.min(s.len())))
}

/// One chunk of a row file whose records are inline (section 7e, the runs
/// layout), appended to `out`: each of `rows` (whole rows of `row_bytes`,
/// one chunk of `2^height`, or the short last one, with `leaves` their leaf
/// hashes) followed by its record. Returns the chunk's root, its entry in
/// the chunk table. A writer streams a row file this way, chunk by chunk,
/// without the whole tree.
pub fn inline_chunk(
    rows: &[u8],
    row_bytes: usize,
    leaves: &[Hash],
    height: u8,
    out: &mut Vec<u8>,
) -> Hash {
    let record_len = 32 * usize::from(height);
    let mut records = Vec::with_capacity(leaves.len().saturating_mul(record_len));
    let root = chunk_records(leaves, height, &mut records);
    let pairs = rows
        .chunks_exact(row_bytes.max(1))
        .zip(records.chunks_exact(record_len.max(1)));
    for (row, record) in pairs {
        out.extend_from_slice(row);
        out.extend_from_slice(record);
    }
    root
}

/// Writes the runs object of a row file: `rows` yields the row file's
/// bytes and `records` the proof object's records (the bytes after its
/// chunk table), both read in order.
pub fn write_runs(
    layout: &RunsLayout,
    rows: &mut impl Read,
    records: &mut impl Read,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let rb = usize::try_from(layout.row_bytes).map_err(std::io::Error::other)?;
    let stride = usize::try_from(layout.stride()).map_err(std::io::Error::other)?;
    // whole strides at a time, about 1 MiB
    let batch = (1usize << 20).div_ceil(stride.max(1)).max(1);
    let mut buf = vec![0u8; batch.saturating_mul(stride)];
    let mut left = layout.rows;
    while left > 0 {
        let n = usize::try_from(left.min(batch as u64)).map_err(std::io::Error::other)?;
        let mut filled = 0usize;
        for s in buf.chunks_exact_mut(stride).take(n) {
            let (row, record) = s.split_at_mut(rb.min(s.len()));
            rows.read_exact(row)?;
            records.read_exact(record)?;
            filled = filled.saturating_add(s.len());
        }
        out.write_all(buf.get(..filled).unwrap_or_default())?;
        left = left.saturating_sub(n as u64);
    }
    Ok(())
}

/// Verifies a fetched range of a runs object, rows `first..`: every row
/// with its record against the checked chunk roots (as
/// [`check_row`] does for a row fetched with its record from the proof
/// object). Returns the rows, concatenated, only when all of them pass.
pub fn check_runs(
    desc: &ColumnarDescriptor,
    chunk_roots: &[Hash],
    first: u64,
    bytes: &[u8],
) -> crate::Result<Vec<u8>> {
    let layout = RunsLayout::of(desc).ok_or_else(|| crate::Error::RowProof {
        object: runs_object_name(&desc.object),
        row: first,
        reason: "the row file has no runs object (no proof of height 1 or more)".into(),
    })?;
    if !(bytes.len() as u64).is_multiple_of(layout.stride()) {
        return Err(crate::Error::RowProof {
            object: runs_object_name(&desc.object),
            row: first,
            reason: format!(
                "{} bytes are not whole strides of {}",
                bytes.len(),
                layout.stride()
            ),
        });
    }
    let mut rows = Vec::with_capacity(bytes.len());
    for (k, (row, record)) in layout.split(bytes).enumerate() {
        check_row(
            desc,
            chunk_roots,
            first.saturating_add(k as u64),
            row,
            record,
        )?;
        rows.extend_from_slice(row);
    }
    Ok(rows)
}
