//! The row files while packing: each row file of a role block is written
//! as its rows stream by, cast from the block (in parallel), checked for
//! exactness against the source and the block, and hashed into Merkle
//! leaves; at the end its proof object is written and its descriptor
//! completed (FORMAT.md 3.4, 7a). A row file with inline records (7e) is
//! written a chunk at a time, each row followed by its record, as soon as
//! the chunk is whole; its proof object is the chunk table.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use gkq_format::merkle::{self, Hash};
use gkq_format::{
    BLOCK_EXACT, CastReport, DType, INLINE_PROOF, KnotWriter, Role, RowProof, SOURCE_EXACT,
    cast_row,
};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::companions::hash_file;
use crate::error::{IoContext, PackError, Result, format_err};
use crate::output::{Output, flush_file, write_all};
use crate::report::{CastSummary, ColumnarReport, FileReport};

/// One row file while packing.
pub(crate) struct RowSink {
    pub(crate) dtype: DType,
    pub(crate) path: PathBuf,
    pub(crate) w: BufWriter<File>,
    /// `None` for the row file in the block's dtype without inline records:
    /// its digest is the payload's.
    pub(crate) hasher: Option<Sha256>,
    /// Leaf hashes of the rows written so far (FORMAT.md 7a); with inline
    /// records, of the rows of the chunk not yet whole.
    pub(crate) leaves: Vec<Hash>,
    /// Inline records (FORMAT.md 7e): the file is written a chunk at a time.
    pub(crate) inline: Option<Inline>,
    pub(crate) source_exact: bool,
    pub(crate) block_exact: bool,
    /// Largest error against the source.
    pub(crate) vs_source: f64,
    /// The cast from the block's dtype (for the other dtypes).
    pub(crate) cast: CastReport,
}

/// A row file whose records are inline (FORMAT.md 7e) while packing: each
/// chunk of rows is written, each row followed by its record, once it is
/// whole, so the file is written once, in order, and hashed as it goes.
pub(crate) struct Inline {
    /// The proof's height: chunks of `2^height` rows.
    pub(crate) height: u8,
    /// The rows of the chunk not yet whole.
    pub(crate) pending: Vec<u8>,
    /// The chunk roots so far: the proof object's table.
    pub(crate) roots: Vec<Hash>,
}

/// One role block and its row files while packing.
pub(crate) struct RoleOut {
    pub(crate) block: usize,
    pub(crate) role: Role,
    /// The row files, the one in the block's dtype first.
    pub(crate) files: Vec<RowSink>,
    pub(crate) casts: Vec<CastSummary>,
}

/// Rows per rayon task when casting, hashing or comparing rows.
const ROWS_PER_TASK: usize = 256;

/// Leaf hashes of whole rows, in parallel.
fn leaves_of(bytes: &[u8], row_bytes: usize) -> Vec<Hash> {
    bytes
        .par_chunks(row_bytes.max(1))
        .map(merkle::leaf_hash)
        .collect()
}

/// Bytes of a row of `cols` values in `dtype` (whole blocks: checked by the plan).
pub(crate) fn row_len(dtype: DType, cols: usize) -> usize {
    dtype.row_bytes(cols as u64).unwrap_or(0) as usize
}

/// Whether every value of `values` (rows in `vd`) casts to `rd` giving the
/// bits of `reference`, in parallel over groups of rows.
fn casts_back_exactly(values: &[u8], vd: DType, reference: &[u8], rd: DType, cols: usize) -> bool {
    values
        .par_chunks(row_len(vd, cols).max(1) * ROWS_PER_TASK)
        .zip(reference.par_chunks(row_len(rd, cols).max(1) * ROWS_PER_TASK))
        .all(|(a, b)| gkq_format::first_inexact(a, vd, b, rd).is_none())
}

/// Where the rows pushed to a row file come from.
pub(crate) enum Origin<'a> {
    /// Cast or converted from the block's rows (bytes, dtype): checked
    /// against them.
    Block((&'a [u8], DType)),
    /// The block's rows themselves (its row file in its own dtype), exact
    /// to the block by identity, with their largest error against the
    /// source when converting them measured it.
    Own(Option<f64>),
}

impl RowSink {
    /// Writes the next rows of this file (`bytes`, in its dtype), and checks
    /// them against the source `chunk` and the block's rows.
    pub(crate) fn push(
        &mut self,
        bytes: &[u8],
        chunk: (&[u8], DType),
        origin: Origin<'_>,
        cols: usize,
    ) -> Result<()> {
        let row_bytes = row_len(self.dtype, cols);
        let (block, measured) = match origin {
            Origin::Block(b) => (Some(b), None),
            Origin::Own(loss) => (None, loss),
        };
        // block-type values are never SOURCE_EXACT, and rows of a block
        // type are BLOCK_EXACT only as the block's own (FORMAT.md 3.5)
        if self.dtype.is_quantized() {
            self.source_exact = false;
            self.block_exact &= block.is_none_or(|b| self.dtype == b.1);
        }
        let (src_exact, (blk_exact, (vs, leaves))) = rayon::join(
            || self.source_exact && casts_back_exactly(bytes, self.dtype, chunk.0, chunk.1, cols),
            || {
                rayon::join(
                    || {
                        self.block_exact
                            && block.is_none_or(|b| {
                                casts_back_exactly(bytes, self.dtype, b.0, b.1, cols)
                            })
                    },
                    || {
                        rayon::join(
                            || {
                                measured.unwrap_or_else(|| {
                                    loss_vs_source(chunk.0, chunk.1, bytes, self.dtype, cols)
                                })
                            },
                            || leaves_of(bytes, row_bytes),
                        )
                    },
                )
            },
        );
        self.source_exact = src_exact;
        self.block_exact = blk_exact;
        self.vs_source = self.vs_source.max(vs);
        self.write_rows(bytes, leaves, row_bytes, false)
    }

    /// Writes rows whose leaves are `leaves`, or with inline records, each
    /// chunk made whole by them (every pending row when `last`).
    fn write_rows(
        &mut self,
        bytes: &[u8],
        leaves: Vec<Hash>,
        row_bytes: usize,
        last: bool,
    ) -> Result<()> {
        self.leaves.extend(leaves);
        let Some(inline) = &mut self.inline else {
            return emit(&mut self.hasher, &mut self.w, bytes, &self.path);
        };
        inline.pending.extend_from_slice(bytes);
        let chunk = 1usize << inline.height;
        let whole = match last {
            true => self.leaves.len(),
            false => self.leaves.len() / chunk * chunk,
        };
        let (rows, leaves) = (
            inline.pending.drain(..whole * row_bytes),
            self.leaves.drain(..whole),
        );
        let (rows, leaves) = (rows.as_slice(), leaves.as_slice());
        let mut out = Vec::with_capacity(rows.len() + whole * 32 * usize::from(inline.height));
        for (r, l) in rows
            .chunks((chunk * row_bytes).max(1))
            .zip(leaves.chunks(chunk))
        {
            let root = gkq_format::runs::inline_chunk(r, row_bytes, l, inline.height, &mut out);
            inline.roots.push(root);
        }
        emit(&mut self.hasher, &mut self.w, &out, &self.path)
    }
}

/// Writes `bytes` to a row file, hashing them when its digest is its own.
fn emit(
    hasher: &mut Option<Sha256>,
    w: &mut BufWriter<File>,
    bytes: &[u8],
    path: &Path,
) -> Result<()> {
    if let Some(h) = hasher {
        h.update(bytes);
    }
    write_all(w, bytes, path)
}

/// Casts a chunk of whole rows of `cols` values between float dtypes in
/// parallel. Returns the bytes and the merged report.
pub(crate) fn cast_rows(src: &[u8], from: DType, to: DType, cols: usize) -> (Vec<u8>, CastReport) {
    let per_task = row_len(from, cols).max(1) * ROWS_PER_TASK;
    let parts: Vec<(Vec<u8>, CastReport)> = src
        .par_chunks(per_task)
        .map(|c| {
            let mut out =
                Vec::with_capacity(c.len() / row_len(from, cols).max(1) * row_len(to, cols));
            let r = cast_row(c, from, to, &mut out).expect("role dtypes are castable floats");
            (out, r)
        })
        .collect();
    let mut report = CastReport::default();
    let mut bytes = Vec::with_capacity(parts.iter().map(|p| p.0.len()).sum());
    let elems_per_task = cols * ROWS_PER_TASK;
    for (i, (b, r)) in parts.into_iter().enumerate() {
        report.merge(r, i * elems_per_task);
        bytes.extend_from_slice(&b);
    }
    (bytes, report)
}

/// Closes a row file: writes its proof object (FORMAT.md 7a) and records
/// digest, exactness flags and Merkle root in its descriptor. Returns its
/// report (paths relative to the package, tensor and role left empty) and
/// the files to sync before commit.
pub(crate) fn finish_row_file<W: Write + std::io::Seek>(
    out: &mut Output,
    writer: &mut KnotWriter<W>,
    block: usize,
    mut f: RowSink,
    knot_tmp: &Path,
) -> Result<(ColumnarReport, Vec<(File, PathBuf)>)> {
    let fmt = |e| format_err(knot_tmp, e);
    let d = writer.columnar_mut(block, f.dtype).map_err(fmt)?;
    if f.inline.is_some() {
        // the short last chunk
        let row_bytes = usize::try_from(d.row_bytes).unwrap_or(0);
        f.write_rows(&[], Vec::new(), row_bytes, true)?;
    }
    let file = flush_file(f.w, &f.path)?;
    if let Some(h) = f.hasher {
        d.sha256 = h.finalize().into();
    }
    d.flags = (d.flags & INLINE_PROOF)
        | if f.source_exact { SOURCE_EXACT } else { 0 }
        | if f.block_exact { BLOCK_EXACT } else { 0 };
    let height = d.proof.map_or(0, |p| p.height);
    let proof_name = merkle::proof_object_name(&d.object);
    let (proof_path, mut pw) = out.create(&proof_name)?;
    let root = match &f.inline {
        Some(inline) => merkle::write_table(&inline.roots, &mut pw),
        None => merkle::write_proof(&f.leaves, height, &mut pw),
    }
    .at(&proof_path)?
    .ok_or_else(|| PackError::Dtype(format!("{}: no rows to prove", d.object)))?;
    d.proof = Some(RowProof { height, root });
    let d = d.clone();
    let proof_file = flush_file(pw, &proof_path)?;
    let mut synced = vec![(file, f.path.clone()), (proof_file, proof_path.clone())];
    let listed = writer.header().has_runs(&d.object);
    let runs = match gkq_format::runs::RunsLayout::of(&d).filter(|_| listed) {
        Some(layout) => {
            let (report, file, path) = write_runs(out, &d, &layout, (&f.path, &proof_path))?;
            synced.push((file, path));
            Some(report)
        }
        None => None,
    };
    let warm = match writer.header().has_warm(&d.object) {
        true => {
            let ids = writer.header().warm_rows();
            let (report, file, path) = crate::warm::write(out, &d, &ids, (&f.path, &proof_path))?;
            synced.push((file, path));
            Some(report)
        }
        false => None,
    };
    let (proof_len, proof_sha) = hash_file(&proof_path)?;
    let report = ColumnarReport {
        tensor: String::new(),
        role: String::new(),
        dtype: d.dtype.to_string(),
        path: PathBuf::from(&d.object),
        rows: d.rows,
        row_bytes: d.row_bytes,
        bytes: d.byte_len,
        sha256: gkq_format::hex(&d.sha256),
        max_abs_error_vs_source: f.vs_source,
        source_exact: f.source_exact,
        block_exact: f.block_exact,
        merkle_root: gkq_format::hex(&root),
        proof: FileReport {
            path: PathBuf::from(&proof_name),
            bytes: proof_len,
            sha256: proof_sha,
        },
        proof_height: height,
        runs,
        warm,
    };
    Ok((report, synced))
}

/// Writes the runs object of a closed row file (FORMAT.md 7b): each row
/// read back from the row file, followed by its record from the proof
/// object.
fn write_runs(
    out: &mut Output,
    d: &gkq_format::ColumnarDescriptor,
    layout: &gkq_format::runs::RunsLayout,
    (rows_path, proof_path): (&Path, &Path),
) -> Result<(FileReport, File, PathBuf)> {
    use std::io::{BufReader, Seek, SeekFrom};
    let name = gkq_format::runs::runs_object_name(&d.object);
    let (path, mut w) = out.create(&name)?;
    let mut rows = BufReader::with_capacity(1 << 20, File::open(rows_path).at(rows_path)?);
    let mut proof = File::open(proof_path).at(proof_path)?;
    let table = merkle::layout_of(d).map_or(0, |l| l.table_len());
    proof.seek(SeekFrom::Start(table)).at(proof_path)?;
    let mut records = BufReader::with_capacity(1 << 20, proof);
    gkq_format::runs::write_runs(layout, &mut rows, &mut records, &mut w).at(&path)?;
    let file = flush_file(w, &path)?;
    let (bytes, sha256) = hash_file(&path)?;
    let report = FileReport {
        path: PathBuf::from(&name),
        bytes,
        sha256,
    };
    Ok((report, file, path))
}

/// Largest error of `out` (row file bytes, `to`) against `src` (source
/// bytes, `from`), for whole rows of `cols` values, in parallel.
fn loss_vs_source(src: &[u8], from: DType, out: &[u8], to: DType, cols: usize) -> f64 {
    src.par_chunks(row_len(from, cols).max(1) * ROWS_PER_TASK)
        .zip(out.par_chunks(row_len(to, cols).max(1) * ROWS_PER_TASK))
        .map(|(a, b)| gkq_format::max_abs_diff(a, from, b, to).unwrap_or(f64::NAN))
        .reduce(|| 0.0, f64::max)
}
