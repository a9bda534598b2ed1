//! The `columnar` check: each row file of a block, read alongside the
//! block's payload (one pass, see [`super::knot`]): its length, its digest,
//! every row against the block after the documented cast, its
//! `BLOCK_EXACT` claim, and its proof object rebuilt from the rows' Merkle
//! leaves and compared byte for byte (FORMAT.md 7a).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use gkq_format::{Block, ColumnarDescriptor, RowProof, cast_row, hex, merkle};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::files::open_regular;
use crate::report::{CheckFindings, Differ, Finding};

/// Mismatching rows listed per file before summarising.
const MAX_LISTED: usize = 5;

/// Lists rows of `a` and `b` (whole rows of `row_bytes`, starting at row
/// `first_row`) that differ, up to `room` of them; returns how many differ.
pub(crate) fn diff_rows(
    a: &[u8],
    b: &[u8],
    row_bytes: usize,
    first_row: u64,
    listed: &mut Vec<u64>,
    room: usize,
) -> u64 {
    if a == b {
        return 0;
    }
    let mut n = 0;
    for (i, (x, y)) in a
        .chunks(row_bytes.max(1))
        .zip(b.chunks(row_bytes.max(1)))
        .enumerate()
    {
        if x != y {
            n += 1;
            if listed.len() < room {
                listed.push(first_row + i as u64);
            }
        }
    }
    n
}

/// One row file while its block's payload streams by.
pub(crate) struct RowFile<'d> {
    d: &'d ColumnarDescriptor,
    file: File,
    hasher: Sha256,
    diff: u64,
    listed: Vec<u64>,
    len: u64,
    leaves: Vec<merkle::Hash>,
    /// First row that breaks the descriptor's BLOCK_EXACT claim.
    not_block_exact: Option<u64>,
    /// A read failed: nothing more is checked.
    broken: bool,
    /// What was read: rows, and records after each with an inline proof.
    raw: Vec<u8>,
    buf: Vec<u8>,
    converted: Vec<u8>,
}

/// Opens the row files of `block` that can be checked; the others are
/// reported into `cols`.
pub(crate) fn open_all<'b>(
    block: &'b Block,
    dir: &Path,
    cols: &mut CheckFindings,
) -> Vec<RowFile<'b>> {
    let mut files = Vec::new();
    for d in &block.columnar {
        let path = dir.join(&d.object);
        let shown = path.display().to_string();
        match open_regular(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let what = "row file";
                let object = d.object.clone();
                cols.fail(shown, gkq_format::Error::ObjectMissing { what, object });
            }
            Err(error) => cols.fail(
                shown,
                Finding::RowFileUnreadable {
                    block: block.name.clone(),
                    dtype: d.dtype,
                    error,
                },
            ),
            Ok((_, len)) if len != d.byte_len => {
                if let Err(e) = gkq_format::check_row_file_len(d, len) {
                    cols.fail(shown, e);
                }
            }
            Ok((file, len)) => files.push(RowFile {
                d,
                file,
                hasher: Sha256::new(),
                diff: 0,
                listed: Vec::new(),
                len,
                leaves: Vec::new(),
                not_block_exact: None,
                broken: false,
                raw: Vec::new(),
                buf: Vec::new(),
                converted: Vec::new(),
            }),
        }
    }
    files
}

impl<'d> RowFile<'d> {
    /// The row file's name.
    pub(crate) fn object(&self) -> &str {
        &self.d.object
    }

    /// Whether a read failed (nothing more is checked).
    pub(crate) fn broken(&self) -> bool {
        self.broken
    }

    /// Reads the rows of `chunk` (the block's rows from `first_row`) from
    /// the row file and checks them: digest, against the block, Merkle
    /// leaves, BLOCK_EXACT. The digest runs alongside the rest. Returns the
    /// bytes read.
    pub(crate) fn take(
        &mut self,
        block: &Block,
        chunk: &[u8],
        first_row: u64,
        rows: usize,
    ) -> Result<u64, Finding> {
        let rb = self.d.row_bytes as usize;
        let stride = self.d.stride() as usize;
        let RowFile {
            d,
            file,
            hasher,
            diff,
            listed,
            leaves,
            not_block_exact,
            raw,
            buf,
            converted,
            broken,
            ..
        } = self;
        raw.resize(rows * stride, 0);
        if let Err(error) = file.read_exact_at(raw, first_row * stride as u64) {
            *broken = true;
            return Err(Finding::RowFileRead {
                row: first_row,
                error,
            });
        }
        // FORMAT.md 7e: the rows without the records inline (checked with
        // the proof object in `finish`)
        buf.clear();
        for s in raw.chunks(stride.max(1)) {
            buf.extend_from_slice(&s[..rb.min(s.len())]);
        }
        let (raw, buf) = (&raw[..], &buf[..]);
        rayon::join(
            || hasher.update(raw),
            || {
                let expected: &[u8] = if d.dtype == block.dtype {
                    chunk
                } else {
                    converted.clear();
                    cast_row(chunk, block.dtype, d.dtype, converted)
                        .expect("descriptor dtypes are validated castable");
                    converted
                };
                *diff += diff_rows(expected, buf, rb, first_row, listed, MAX_LISTED);
                if d.proof.is_some() {
                    leaves.par_extend(buf.par_chunks(rb.max(1)).map(merkle::leaf_hash));
                }
                if d.is_block_exact()
                    && not_block_exact.is_none()
                    && let Some(i) = gkq_format::first_inexact(buf, d.dtype, chunk, block.dtype)
                {
                    let cols = block.shape.get(1).copied().unwrap_or(1).max(1);
                    *not_block_exact = Some(first_row + i as u64 / cols);
                }
            },
        );
        Ok(raw.len() as u64)
    }

    /// The checks that need the whole file: digest, BLOCK_EXACT, proof
    /// object, rows that differed.
    /// The descriptor of this row file.
    pub(crate) fn descriptor(&self) -> &'d ColumnarDescriptor {
        self.d
    }

    pub(crate) fn finish(self, block: &Block, dir: &Path, cols: &mut CheckFindings) {
        if self.broken {
            return; // reported when the read failed
        }
        let path = dir.join(&self.d.object).display().to_string();
        let digest: [u8; 32] = self.hasher.finalize().into();
        if let Err(error) = gkq_format::check_row_file_digest(self.d, digest) {
            cols.fail(
                path.clone(),
                Finding::RowFileDigest {
                    error,
                    len: self.len,
                },
            );
        }
        if let Some(row) = self.not_block_exact {
            let e = gkq_format::Error::ExactnessClaim {
                object: self.d.object.clone(),
                flag: "BLOCK_EXACT",
                reason: format!(
                    "row {row} does not cast back to block {:?} ({}) bit for bit",
                    block.name, block.dtype
                ),
            };
            cols.fail(path.clone(), e);
        }
        if let Some(proof) = self.d.proof {
            let ppath = dir.join(merkle::proof_object_name(&self.d.object));
            let inline = self.d.inline_proof().then_some((&self.file, self.d));
            match check_proof_file(&ppath, &self.leaves, proof, inline) {
                Err(f) => cols.fail(ppath.display().to_string(), f),
                Ok(()) => cols.bytes += merkle::proof_object_len(self.d).unwrap_or(0),
            }
        }
        if self.diff > 0 {
            let error = gkq_format::Error::RowMismatch {
                object: self.d.object.clone(),
                block: block.name.clone(),
                dtype: self.d.dtype,
                count: self.diff,
                first_row: self.listed.first().copied().unwrap_or(0),
            };
            let rows = Differ::Rows {
                listed: self.listed,
                total: self.diff,
                row_bytes: self.d.row_bytes,
            };
            cols.fail(path, Finding::RowsDiffer { error, rows });
        }
    }
}

/// An object derived from a row file and its proof object (a runs
/// object, 7b, or a warm object, 7d), opened when it has `expected` bytes;
/// else its failure is reported (`length` gives the length error).
fn open_derived(
    (name, what): (&str, &'static str),
    path: &Path,
    expected: u64,
    length: impl FnOnce(u64) -> gkq_format::Error,
    cols: &mut CheckFindings,
) -> Option<File> {
    let shown = path.display().to_string();
    match open_regular(path) {
        Ok((_, len)) if len != expected => cols.fail(shown, length(len)),
        Ok((f, _)) => return Some(f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let object = name.to_owned();
            cols.fail(shown, gkq_format::Error::ObjectMissing { what, object });
        }
        Err(e) => cols.fail(shown, e),
    }
    None
}

/// Compares `file` byte for byte with what `write` writes: the first
/// byte that differs, `at`, is a `RowProof` failure of row `row_at(at)`.
fn compare_derived(
    (name, path): (&str, &Path),
    (file, expected): (File, u64),
    row_at: impl Fn(u64) -> u64,
    write: impl FnOnce(&mut Compare<File>) -> std::io::Result<()>,
    cols: &mut CheckFindings,
) {
    let shown = path.display().to_string();
    let mut cmp = Compare {
        file: std::io::BufReader::with_capacity(1 << 20, file),
        at: 0,
        first_diff: None,
        buf: Vec::new(),
    };
    match write(&mut cmp) {
        Err(e) => cols.fail(shown, e),
        Ok(()) => match cmp.first_diff {
            Some(at) => cols.fail(
                shown,
                gkq_format::Error::RowProof {
                    object: name.to_owned(),
                    row: row_at(at),
                    reason: format!("differs at byte {at} from the row and its record (RowProof)"),
                },
            ),
            None => cols.bytes += expected,
        },
    }
}

/// A runs object (FORMAT.md 7b) against the row file and the proof
/// object's records it interleaves, byte for byte (both already checked
/// against the knot).
pub(crate) fn check_runs(d: &ColumnarDescriptor, dir: &Path, cols: &mut CheckFindings) {
    use gkq_format::runs::{RunsLayout, runs_object_name, write_runs};
    use std::io::{Seek, SeekFrom};
    let name = runs_object_name(&d.object);
    let path = dir.join(&name);
    let Some(layout) = RunsLayout::of(d) else {
        let reason = "listed in columnar.runs, but its row file has no records".into();
        let (object, row) = (name, 0);
        return cols.fail(
            path.display().to_string(),
            gkq_format::Error::RowProof {
                object,
                row,
                reason,
            },
        );
    };
    let expected = layout.object_len().unwrap_or(0);
    let length = |found| gkq_format::Error::RunsLength {
        object: name.clone(),
        expected,
        found,
        rows: d.rows,
        stride: layout.stride(),
    };
    let what = (name.as_str(), "runs object");
    let Some(file) = open_derived(what, &path, expected, length, cols) else {
        return;
    };
    let table = merkle::layout_of(d).map_or(0, |l| l.table_len());
    let opened = File::open(dir.join(&d.object)).and_then(|r| {
        let mut p = File::open(dir.join(merkle::proof_object_name(&d.object)))?;
        p.seek(SeekFrom::Start(table))?;
        Ok((r, p))
    });
    // the row file and proof object were reported already if unreadable
    let Ok((rows, proof)) = opened else { return };
    let mut rows = std::io::BufReader::with_capacity(1 << 20, rows);
    let mut records = std::io::BufReader::with_capacity(1 << 20, proof);
    let write = |cmp: &mut Compare<File>| write_runs(&layout, &mut rows, &mut records, cmp);
    let row_at = |at: u64| at / layout.stride().max(1);
    compare_derived((&name, &path), (file, expected), row_at, write, cols);
}

/// A warm object (FORMAT.md 7d) against the proof object's chunk table
/// and the warm rows of the row file with their records, byte for byte.
pub(crate) fn check_warm(
    d: &ColumnarDescriptor,
    ids: &[u64],
    dir: &Path,
    cols: &mut CheckFindings,
) {
    use gkq_format::warm::{WarmLayout, WarmPart, warm_object_name, write_warm};
    let name = warm_object_name(&d.object);
    let path = dir.join(&name);
    // a validated knot lists only row files with proofs, rows in range
    let Some(layout) = WarmLayout::of(d, ids.len() as u64) else {
        return;
    };
    let expected = layout.object_len().unwrap_or(0);
    let length = |found| gkq_format::Error::WarmLength {
        object: name.clone(),
        expected,
        found,
    };
    let what = (name.as_str(), "warm object");
    let Some(file) = open_derived(what, &path, expected, length, cols) else {
        return;
    };
    let opened = File::open(dir.join(&d.object)).and_then(|r| {
        Ok((
            r,
            File::open(dir.join(merkle::proof_object_name(&d.object)))?,
        ))
    });
    let Ok((rows, proof)) = opened else { return };
    let read = |part, at, buf: &mut [u8]| match part {
        WarmPart::Rows => rows.read_exact_at(buf, at),
        WarmPart::Proof => proof.read_exact_at(buf, at),
    };
    let write = |cmp: &mut Compare<File>| write_warm(d, ids, read, cmp);
    // the warm row of the entry (the first one's for the chunk table)
    let row_at = |at: u64| {
        let k = at.saturating_sub(layout.table_len()) / layout.stride().max(1);
        usize::try_from(k)
            .ok()
            .and_then(|k| ids.get(k))
            .copied()
            .unwrap_or(0)
    };
    compare_derived((&name, &path), (file, expected), row_at, write, cols);
}

/// A `Write` that compares what is written with a file, byte for byte.
struct Compare<R> {
    file: std::io::BufReader<R>,
    at: u64,
    first_diff: Option<u64>,
    buf: Vec<u8>,
}

impl<R: std::io::Read> std::io::Write for Compare<R> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        use std::io::Read;
        self.buf.resize(data.len(), 0);
        let mut got = 0;
        while got < data.len() {
            match self.file.read(&mut self.buf[got..])? {
                0 => break,
                n => got += n,
            }
        }
        if self.first_diff.is_none()
            && let Some(i) = data.iter().zip(&self.buf[..got]).position(|(a, b)| a != b)
        {
            self.first_diff = Some(self.at + i as u64);
        }
        if got < data.len() && self.first_diff.is_none() {
            self.first_diff = Some(self.at + got as u64);
        }
        self.at += data.len() as u64;
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Checks a proof object (FORMAT.md 7a) against the one computed from the
/// row file's leaves, and the root against the descriptor's. With an
/// inline proof (7e, `inline` the row file), the object is the chunk
/// table, and the records compared are the row file's.
fn check_proof_file(
    path: &Path,
    leaves: &[merkle::Hash],
    proof: RowProof,
    inline: Option<(&File, &ColumnarDescriptor)>,
) -> Result<(), Finding> {
    let layout = merkle::ProofLayout::new(leaves.len() as u64, proof.height);
    let expected = match inline {
        Some(_) => layout.map(|l| l.table_len()),
        None => layout.and_then(|l| l.object_len()),
    }
    .unwrap_or(0);
    let object = || {
        path.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    };
    let (file, len) = open_regular(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Finding::Format(gkq_format::Error::ObjectMissing {
            what: "proof object",
            object: object(),
        }),
        _ => Finding::ProofUnreadable(e),
    })?;
    if len != expected {
        return Err(Finding::ProofLength {
            len,
            expected,
            height: proof.height,
        });
    }
    let reader: Box<dyn std::io::Read + '_> = match inline {
        Some((rows, d)) => Box::new(std::io::Read::chain(file, Records::new(rows, d))),
        None => Box::new(file),
    };
    let mut cmp = Compare {
        file: std::io::BufReader::with_capacity(1 << 20, reader),
        at: 0,
        first_diff: None,
        buf: Vec::new(),
    };
    let root = merkle::write_proof(leaves, proof.height, &mut cmp).map_err(Finding::ProofRead)?;
    if root != Some(proof.root) {
        return Err(Finding::MerkleRoot {
            found: root.map(|r| hex(&r)).unwrap_or_default(),
            recorded: hex(&proof.root),
        });
    }
    match (cmp.first_diff, inline) {
        (Some(at), Some((_, d))) if at >= expected => {
            let record = merkle::layout_of(d).map_or(1, |l| l.record_len()).max(1);
            Err(Finding::Format(gkq_format::Error::RowProof {
                object: d.object.clone(),
                row: (at - expected) / record,
                reason: "its inline record differs from the one its rows give".into(),
            }))
        }
        (Some(at), _) => Err(Finding::Format(gkq_format::Error::ProofObject {
            object: object(),
            at,
        })),
        (None, _) => Ok(()),
    }
}

/// The records of a row file with an inline proof (FORMAT.md 7e), one
/// after the other, as a proof object's would be.
struct Records<'f> {
    file: &'f File,
    row: u64,
    rows: u64,
    row_bytes: u64,
    stride: u64,
    /// The unread part of the last record read.
    left: Vec<u8>,
}

impl<'f> Records<'f> {
    fn new(file: &'f File, d: &ColumnarDescriptor) -> Records<'f> {
        Records {
            file,
            row: 0,
            rows: d.rows,
            row_bytes: d.row_bytes,
            stride: d.stride(),
            left: Vec::new(),
        }
    }
}

impl std::io::Read for Records<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.left.is_empty() && self.row < self.rows {
            self.left.resize((self.stride - self.row_bytes) as usize, 0);
            let at = self.row * self.stride + self.row_bytes;
            self.file.read_exact_at(&mut self.left, at)?;
            self.row += 1;
        }
        let n = out.len().min(self.left.len());
        out[..n].copy_from_slice(&self.left[..n]);
        self.left.drain(..n);
        Ok(n)
    }
}
