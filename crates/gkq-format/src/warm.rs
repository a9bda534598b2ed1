//! Warm objects (docs/FORMAT.md section 7d): the rows a publisher expects
//! every node to need (the top K ids of a corpus), with everything that
//! verifies them, in one object, so that a cold node seeds its cache with
//! one range request.
//!
//! ```text
//! warm = chunk table (the proof object's first 32 × chunks bytes)
//!        ‖ row w_0 ‖ record w_0 ‖ row w_1 ‖ record w_1 ‖ …   (w listed in columnar.warm_rows)
//! len  = 32 × chunks + K × (row_bytes + 32 × proof_height)
//! ```

use crate::error::{Error, Result};
use crate::merkle::{Hash, ProofLayout, check_row, check_table, layout_of};
use crate::model::ColumnarDescriptor;

/// Suffix of a warm object's name: `<object>.warm`.
pub const WARM_SUFFIX: &str = ".warm";

/// The name of the warm object of row file `object`.
pub fn warm_object_name(object: &str) -> String {
    format!("{object}{WARM_SUFFIX}")
}

/// The geometry of a warm object of `count` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WarmLayout {
    /// The row file's proof layout.
    pub proof: ProofLayout,
    /// Bytes per row.
    pub row_bytes: u64,
    /// Warm rows.
    pub count: u64,
}

impl WarmLayout {
    /// The layout of `desc`'s warm object of `count` rows (it needs a row
    /// proof, of any height).
    pub fn of(desc: &ColumnarDescriptor, count: u64) -> Option<WarmLayout> {
        let l = WarmLayout {
            proof: layout_of(desc)?,
            row_bytes: desc.row_bytes,
            count,
        };
        l.object_len()?;
        Some(l)
    }

    /// Bytes of the chunk table at the start: `32 × chunks`.
    pub fn table_len(&self) -> u64 {
        self.proof.table_len()
    }

    /// Bytes per entry: `row_bytes + 32 × proof_height`.
    pub fn stride(&self) -> u64 {
        self.row_bytes.saturating_add(self.proof.record_len())
    }

    /// Length of the object: `32 × chunks + count × stride`.
    pub fn object_len(&self) -> Option<u64> {
        self.row_bytes
            .checked_add(self.proof.record_len())?
            .checked_mul(self.count)?
            .checked_add(self.table_len())
    }

    /// The `(row, record)` pairs of the entries (the bytes after the table).
    pub fn split<'a>(&self, entries: &'a [u8]) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        crate::runs::strides(entries, self.row_bytes, self.stride())
    }
}

/// Which object of the package a warm object's bytes are copied from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WarmPart {
    /// The row file.
    Rows,
    /// The proof object.
    Proof,
}

/// Writes the warm object of a row file: its proof object's chunk table,
/// then each row of `ids` with its path record. `read(part, offset, buf)`
/// fills `buf` from that offset of the row file or the proof object (a
/// positioned read of a file, or a copy from memory).
pub fn write_warm(
    desc: &ColumnarDescriptor,
    ids: &[u64],
    mut read: impl FnMut(WarmPart, u64, &mut [u8]) -> std::io::Result<()>,
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    let bad = |what: String| std::io::Error::other(format!("{}: {what}", desc.object));
    let layout =
        WarmLayout::of(desc, ids.len() as u64).ok_or_else(|| bad("no row proof".into()))?;
    let size = |n: u64| usize::try_from(n).map_err(std::io::Error::other);
    let mut buf = vec![0u8; size(layout.table_len())?];
    read(WarmPart::Proof, 0, &mut buf)?;
    out.write_all(&buf)?;
    let (mut row, mut record) = (
        vec![0u8; size(desc.row_bytes)?],
        vec![0u8; size(layout.proof.record_len())?],
    );
    for &id in ids {
        let at = id.checked_mul(desc.stride()).filter(|_| id < desc.rows);
        let rec = layout.proof.records_range(id, 1);
        let (Some(at), Some((rec, _))) = (at, rec) else {
            return Err(bad(format!("row {id} is past the end")));
        };
        read(WarmPart::Rows, at, &mut row)?;
        // records inline (section 7e): right after the row
        match desc.inline_proof() {
            true => read(
                WarmPart::Rows,
                at.saturating_add(desc.row_bytes),
                &mut record,
            )?,
            false => read(WarmPart::Proof, rec, &mut record)?,
        }
        out.write_all(&row)?;
        out.write_all(&record)?;
    }
    Ok(())
}

/// A fetched warm object, checked: the chunk roots (when the table came
/// with it), the rows that passed their proofs and the ones that did not.
#[derive(Debug)]
pub struct WarmCheck<'a> {
    /// The checked chunk roots.
    pub roots: Vec<Hash>,
    /// `(row id, row, record)` of every entry that passed.
    pub rows: Vec<(u64, &'a [u8], &'a [u8])>,
    /// Entries that failed, with why.
    pub failed: Vec<(u64, Error)>,
}

/// Checks a fetched warm object of `desc` for the warm rows `ids`: the
/// whole object when `roots` is `None` (its table against the Merkle
/// root first), else its entries only (the bytes from `table_len` on),
/// against chunk roots the caller checked before. Each row is checked
/// with its record; a length other than the layout's is
/// [`Error::WarmLength`], a table that fails is [`Error::ProofTable`].
pub fn check_warm<'a>(
    desc: &ColumnarDescriptor,
    ids: &[u64],
    bytes: &'a [u8],
    roots: Option<&[Hash]>,
) -> Result<WarmCheck<'a>> {
    let layout = WarmLayout::of(desc, ids.len() as u64).ok_or_else(|| Error::ProofTable {
        object: warm_object_name(&desc.object),
        reason: "the row file has no row proof".into(),
    })?;
    let (expected, skip) = match roots {
        None => (layout.object_len().unwrap_or(u64::MAX), 0),
        Some(_) => (
            layout.count.saturating_mul(layout.stride()),
            layout.table_len(),
        ),
    };
    if bytes.len() as u64 != expected {
        return Err(Error::WarmLength {
            object: warm_object_name(&desc.object),
            expected: expected.saturating_add(skip),
            found: (bytes.len() as u64).saturating_add(skip),
        });
    }
    let (roots, entries) = match roots {
        Some(r) => (r.to_vec(), bytes),
        None => {
            let (table, entries) = bytes.split_at(usize::try_from(layout.table_len()).unwrap_or(0));
            (check_table(desc, table)?, entries)
        }
    };
    let mut out = WarmCheck {
        roots: Vec::new(),
        rows: Vec::with_capacity(ids.len()),
        failed: Vec::new(),
    };
    for (&id, (row, record)) in ids.iter().zip(layout.split(entries)) {
        match check_row(desc, &roots, id, row, record) {
            Ok(()) => out.rows.push((id, row, record)),
            Err(e) => out.failed.push((id, e)),
        }
    }
    out.roots = roots;
    Ok(out)
}
