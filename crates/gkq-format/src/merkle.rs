//! Row proofs (docs/FORMAT.md section 7a): an RFC 9162 Merkle tree whose
//! leaves are the rows of a row file, and the proof object that lets a node
//! verify any row it fetched by range against the tree's root in the knot.
//!
//! The proof object is the *chunk table* (the roots of the subtrees of
//! `2^height` rows, fetched once per node and checked against the root)
//! followed by one fixed-size *path record* per row (the row's inclusion path
//! up to its chunk root), so the records of a run of rows are one byte range.

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::model::{ColumnarDescriptor, RowProof};

/// A SHA-256 digest.
pub type Hash = [u8; 32];

/// Bytes of one hash.
pub const HASH_LEN: u64 = 32;

/// The largest `proof_height` a knot may declare.
pub const MAX_PROOF_HEIGHT: u8 = 24;

/// The suffix of a proof object's name: `<row file object>.proof`.
pub const PROOF_SUFFIX: &str = ".proof";

/// RFC 9162 leaf hash: `SHA-256(0x00 || row)`.
pub fn leaf_hash(row: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(row);
    h.finalize().into()
}

/// RFC 9162 interior node hash: `SHA-256(0x01 || left || right)`.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The largest power of two strictly below `n` (`n >= 2`).
fn split(n: usize) -> usize {
    let p = n.next_power_of_two();
    if p == n { n / 2 } else { p / 2 }
}

/// The RFC 9162 tree hash of a list of subtree hashes (leaf hashes, or the
/// chunk roots of section 7a). `None` for an empty list.
pub fn tree_hash(hashes: &[Hash]) -> Option<Hash> {
    match hashes {
        [] => None,
        [one] => Some(*one),
        _ => {
            let (l, r) = hashes.split_at(split(hashes.len()));
            Some(node_hash(&tree_hash(l)?, &tree_hash(r)?))
        }
    }
}

/// RFC 9162 section 2.1.3.2: the root that `path` proves for leaf `index` of a
/// tree of `size` leaves, or `None` if the path has the wrong length.
pub fn root_from_path(index: u64, size: u64, leaf: Hash, path: &[Hash]) -> Option<Hash> {
    if index >= size {
        return None;
    }
    let (mut fnode, mut snode) = (index, size.saturating_sub(1));
    let mut r = leaf;
    for p in path {
        if snode == 0 {
            return None;
        }
        if fnode & 1 == 1 || fnode == snode {
            r = node_hash(p, &r);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    (snode == 0).then_some(r)
}

/// The geometry of a proof object (docs/FORMAT.md section 7a).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProofLayout {
    /// Rows of the row file (leaves).
    pub rows: u64,
    /// `proof_height`: a chunk holds `2^height` rows.
    pub height: u8,
    /// Number of chunks: `ceil(rows / 2^height)`.
    pub chunks: u64,
}

impl ProofLayout {
    /// The layout for `rows` rows and chunks of `2^height` rows.
    pub fn new(rows: u64, height: u8) -> Option<ProofLayout> {
        if height > MAX_PROOF_HEIGHT {
            return None;
        }
        let chunk = 1u64 << height;
        let chunks = rows.div_ceil(chunk);
        let layout = ProofLayout {
            rows,
            height,
            chunks,
        };
        layout.object_len()?;
        Some(layout)
    }

    /// Rows per chunk, `2^height`.
    pub fn chunk_rows(&self) -> u64 {
        1u64 << self.height
    }

    /// Bytes of the chunk table: `32 × chunks`.
    pub fn table_len(&self) -> u64 {
        self.chunks.saturating_mul(HASH_LEN)
    }

    /// Bytes of one path record: `32 × height`.
    pub fn record_len(&self) -> u64 {
        HASH_LEN * u64::from(self.height)
    }

    /// Length of the proof object: `32 × (chunks + rows × height)`.
    pub fn object_len(&self) -> Option<u64> {
        self.rows
            .checked_mul(self.record_len())?
            .checked_add(self.table_len())
    }

    /// Byte range `[start, end)` of the path records of rows `first..first + count`.
    pub fn records_range(&self, first: u64, count: u64) -> Option<(u64, u64)> {
        let end = first.checked_add(count)?;
        if end > self.rows {
            return None;
        }
        let rec = self.record_len();
        Some((
            self.table_len().checked_add(first.checked_mul(rec)?)?,
            self.table_len().checked_add(end.checked_mul(rec)?)?,
        ))
    }

    /// Chunk of `row` and the row's index and the chunk's size in leaves.
    fn place(&self, row: u64) -> (u64, u64, u64) {
        let chunk = row >> self.height;
        let start = chunk << self.height;
        let size = self.rows.saturating_sub(start).min(self.chunk_rows());
        (chunk, row.saturating_sub(start), size)
    }
}

pub use crate::model::default_proof_height;

/// Builds a proof object from the leaf hashes of all rows, in row order.
///
/// Returns the root and the proof object bytes (table, then records).
pub fn build_proof(leaves: &[Hash], height: u8) -> Option<(Hash, Vec<u8>)> {
    let layout = ProofLayout::new(leaves.len() as u64, height)?;
    let mut out = Vec::with_capacity(usize::try_from(layout.object_len()?).ok()?);
    let root = write_proof(leaves, height, &mut out).ok()??;
    Some((root, out))
}

/// Streams a proof object for `leaves` into `out`; returns the root (`None`
/// for zero rows or a height above the limit).
pub fn write_proof(
    leaves: &[Hash],
    height: u8,
    out: &mut impl std::io::Write,
) -> std::io::Result<Option<Hash>> {
    if height > MAX_PROOF_HEIGHT {
        return Ok(None);
    }
    let chunk = 1usize << height;
    let roots: Vec<Hash> = leaves.chunks(chunk).filter_map(tree_hash).collect();
    let root = write_table(&roots, out)?;
    let mut record = Vec::with_capacity(chunk.saturating_mul(32 * usize::from(height)));
    for c in leaves.chunks(chunk) {
        record.clear();
        chunk_records(c, height, &mut record);
        out.write_all(&record)?;
    }
    Ok(root)
}

/// Streams the proof object of a row file whose records are inline
/// (section 7e): its chunk table alone, from the chunk roots in order.
/// Returns the root (`None` for no chunks).
pub fn write_table(roots: &[Hash], out: &mut impl std::io::Write) -> std::io::Result<Option<Hash>> {
    for r in roots {
        out.write_all(r)?;
    }
    Ok(tree_hash(roots))
}

/// The records of one chunk's rows (whole, or the short last one), from
/// their leaf hashes: each row's path within the chunk, bottom level first,
/// zero-filled to `height` hashes, appended to `records`. Returns the
/// chunk's root.
pub fn chunk_records(leaves: &[Hash], height: u8, records: &mut Vec<u8>) -> Hash {
    let mut paths: Vec<Vec<Hash>> = Vec::new();
    paths.resize_with(leaves.len(), || Vec::with_capacity(usize::from(height)));
    let root = all_paths(leaves, &mut paths);
    for path in &paths {
        for p in path {
            records.extend_from_slice(p);
        }
        // rows of a short last chunk have shorter paths: zero-filled
        let fill = usize::from(height)
            .saturating_sub(path.len())
            .saturating_mul(32);
        records.resize(records.len().saturating_add(fill), 0);
    }
    root
}

/// The RFC 9162 tree hash of `leaves`, appending to `paths[m]` the path of
/// every leaf `m` (bottom level first), in one pass: each node is hashed
/// once, so a chunk of `n` leaves costs `n - 1` node hashes (computing each
/// path on its own would cost `n` per leaf).
fn all_paths(leaves: &[Hash], paths: &mut [Vec<Hash>]) -> Hash {
    match leaves {
        [] => [0; 32],
        [one] => *one,
        _ => {
            let k = split(leaves.len());
            let (ll, rl) = leaves.split_at(k);
            let (lp, rp) = paths.split_at_mut(k.min(paths.len()));
            let l = all_paths(ll, lp);
            let r = all_paths(rl, rp);
            for p in lp.iter_mut() {
                p.push(r);
            }
            for p in rp.iter_mut() {
                p.push(l);
            }
            node_hash(&l, &r)
        }
    }
}

/// Checks a fetched chunk table against the descriptor's root and returns the
/// chunk roots.
pub fn check_table(desc: &ColumnarDescriptor, table: &[u8]) -> Result<Vec<Hash>> {
    let (proof, layout) = proof_of(desc)?;
    let bad = |reason: String| Error::ProofTable {
        object: proof_object_name(&desc.object),
        reason,
    };
    if table.len() as u64 != layout.table_len() {
        return Err(bad(format!(
            "{} bytes, expected {} ({} chunks × 32)",
            table.len(),
            layout.table_len(),
            layout.chunks
        )));
    }
    let roots: Vec<Hash> = table
        .chunks_exact(32)
        .map(|c| c.try_into().unwrap_or([0; 32]))
        .collect();
    if tree_hash(&roots) != Some(proof.root) {
        return Err(bad(format!(
            "its tree hash is not the descriptor's merkle_root {}",
            crate::hex(&proof.root)
        )));
    }
    Ok(roots)
}

/// Verifies `row` (the bytes of row `index`) with its path record against
/// the checked chunk roots.
pub fn check_row(
    desc: &ColumnarDescriptor,
    chunk_roots: &[Hash],
    index: u64,
    row: &[u8],
    record: &[u8],
) -> Result<()> {
    let (_, layout) = proof_of(desc)?;
    let bad = |reason: &str| Error::RowProof {
        object: desc.object.clone(),
        row: index,
        reason: reason.to_owned(),
    };
    if index >= desc.rows || row.len() as u64 != desc.row_bytes {
        return Err(bad("row index or length out of range"));
    }
    if record.len() as u64 != layout.record_len() {
        return Err(bad("path record of the wrong length"));
    }
    let (chunk, m, size) = layout.place(index);
    let depth = path_len(m, size);
    let (path, pad) = record.split_at(depth.saturating_mul(32).min(record.len()));
    if pad.iter().any(|&b| b != 0) {
        return Err(bad("non-zero padding after the path"));
    }
    let path: Vec<Hash> = path
        .chunks_exact(32)
        .map(|c| c.try_into().unwrap_or([0; 32]))
        .collect();
    let expect = usize::try_from(chunk)
        .ok()
        .and_then(|c| chunk_roots.get(c))
        .ok_or_else(|| bad("chunk outside the table"))?;
    match root_from_path(m, size, leaf_hash(row), &path) {
        Some(r) if &r == expect => Ok(()),
        _ => Err(bad("the row and its path do not hash to the chunk root")),
    }
}

/// Verifies the rows of chunk `chunk` (all `2^height` of them, fewer for a
/// short last chunk, concatenated in `rows`) against the checked chunk
/// roots: their tree hash must be the chunk's root. This is how a whole row
/// file is streamed and verified chunk by chunk, without path records.
pub fn check_chunk(
    desc: &ColumnarDescriptor,
    chunk_roots: &[Hash],
    chunk: u64,
    rows: &[u8],
) -> Result<()> {
    let (_, layout) = proof_of(desc)?;
    let first = chunk.saturating_mul(layout.chunk_rows());
    let bad = |reason: String| Error::RowProof {
        object: desc.object.clone(),
        row: first,
        reason,
    };
    let count = layout.rows.saturating_sub(first).min(layout.chunk_rows());
    if chunk >= layout.chunks || rows.len() as u64 != count.saturating_mul(desc.row_bytes) {
        return Err(bad(format!(
            "chunk {chunk}: {} bytes, expected {count} rows of {} bytes",
            rows.len(),
            desc.row_bytes
        )));
    }
    let rb = usize::try_from(desc.row_bytes).unwrap_or(usize::MAX).max(1);
    let leaves: Vec<Hash> = rows.chunks(rb).map(leaf_hash).collect();
    let expect = usize::try_from(chunk).ok().and_then(|c| chunk_roots.get(c));
    match (tree_hash(&leaves), expect) {
        (Some(r), Some(e)) if r == *e => Ok(()),
        _ => Err(bad(format!(
            "chunk {chunk} (rows {first}-{}) does not hash to its root in the chunk table",
            first.saturating_add(count).saturating_sub(1)
        ))),
    }
}

/// Length of RFC 9162's `PATH(m, D[n])`.
fn path_len(m: u64, n: u64) -> usize {
    if n < 2 {
        return 0;
    }
    let k = split(n as usize) as u64;
    let below = if m < k {
        path_len(m, k)
    } else {
        path_len(m.saturating_sub(k), n.saturating_sub(k))
    };
    below.saturating_add(1)
}

fn proof_of(desc: &ColumnarDescriptor) -> Result<(RowProof, ProofLayout)> {
    let proof = desc.proof.ok_or_else(|| Error::ProofTable {
        object: desc.object.clone(),
        reason: "the descriptor has no row proof (a version 2 knot)".into(),
    })?;
    let layout = ProofLayout::new(desc.rows, proof.height).ok_or_else(|| Error::ProofTable {
        object: proof_object_name(&desc.object),
        reason: format!("proof_height {} is out of range", proof.height),
    })?;
    Ok((proof, layout))
}

/// The name of the proof object of row file `object`.
pub fn proof_object_name(object: &str) -> String {
    format!("{object}{PROOF_SUFFIX}")
}

/// The layout of a descriptor's proof object, if it has one.
pub fn layout_of(desc: &ColumnarDescriptor) -> Option<ProofLayout> {
    ProofLayout::new(desc.rows, desc.proof?.height)
}

/// The length of a descriptor's proof object, if it has one: the chunk
/// table and the records, or the table alone when the records are inline
/// in the row file (section 7e).
pub fn proof_object_len(desc: &ColumnarDescriptor) -> Option<u64> {
    let layout = layout_of(desc)?;
    if desc.inline_proof() {
        return Some(layout.table_len());
    }
    layout.object_len()
}
