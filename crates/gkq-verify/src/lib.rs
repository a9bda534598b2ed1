//! `gkq-verify`: the release gate for a packed model.
//!
//! Checks, each reported with every failure it found (file, tensor, row or
//! byte range, expected vs found):
//!
//! 1. `knot`: the structure rules of docs/FORMAT.md and every payload digest;
//! 2. `columnar`: each row file present, of the right length and digest, and
//!    every row bit-identical to the dense block after the documented cast;
//! 3. `source` (`--source`): every tensor bit-identical to the original
//!    safetensors after the documented cast, every source tensor accounted
//!    for, and the recorded source file digests;
//! 4. `remote` (`--url`): Content-Length and Range behaviour of the published
//!    objects (see [`remote`]).
//!
//! Local work is one pass per byte where it can be: a block's payload is
//! hashed in the same pass that compares it with its row files, a row file
//! is hashed while it is compared, and a source file while its tensors are
//! compared. Independent files go in parallel (rayon).

mod error;
pub mod remote;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gkq_format::{
    Block, ColumnarDescriptor, Encoding, Knot, RowProof, cast_row, hex, keys, merkle,
};
use gkq_source::SourceModel;
use rayon::prelude::*;
use serde::Serialize;
use sha2::{Digest, Sha256};

pub use error::{Result, VerifyError};
use remote::RemoteOutcome;

/// Bytes read per step.
const CHUNK: usize = 8 << 20;
/// Mismatching rows listed per file before summarising.
const MAX_LISTED: usize = 5;

/// What to verify.
#[derive(Clone, Debug)]
pub struct VerifyOptions {
    /// An output directory of gkq-pack, or the knot itself.
    pub target: PathBuf,
    /// The original Hugging Face model directory.
    pub source: Option<PathBuf>,
    /// Base URL where the objects are published.
    pub url: Option<String>,
    /// Random rows checked per row file over HTTP (besides first and last).
    pub sample_rows: u64,
    /// Seed of the row sample.
    pub seed: u64,
    /// Per-request timeout for `--url`.
    pub timeout: Duration,
    /// Extra CA certificate files (PEM) to trust for `--url` (`--ca-cert`).
    pub ca_certs: Vec<PathBuf>,
}

impl VerifyOptions {
    /// Local checks only, with the defaults.
    pub fn new(target: impl Into<PathBuf>) -> VerifyOptions {
        VerifyOptions {
            target: target.into(),
            source: None,
            url: None,
            sample_rows: 64,
            seed: 0x6b6e_6f74,
            timeout: Duration::from_secs(10),
            ca_certs: Vec::new(),
        }
    }
}

/// Progress sink for the local checks (the binary shows a bar on a
/// terminal; the library prints nothing).
pub trait Progress: Sync {
    /// Total bytes the local checks will read: payloads and source tensors.
    fn start(&self, _total: u64) {}
    /// Bytes read since the last call.
    fn advance(&self, _bytes: u64) {}
}

/// A [`Progress`] that shows nothing.
pub struct NoProgress;
impl Progress for NoProgress {}

/// One problem found by a check.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Failure {
    /// The file or URL concerned.
    pub object: String,
    /// What is wrong, naming tensor, row or byte range, expected vs found.
    pub message: String,
}

/// The outcome of one check.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Check {
    /// `knot`, `columnar`, `source` or `remote`.
    pub name: &'static str,
    /// No failures.
    pub passed: bool,
    /// What was found wrong.
    pub failures: Vec<Failure>,
    /// Information that does not fail the check: a role block narrower
    /// than its source (lossy by the publisher's choice), with its largest
    /// error.
    pub notes: Vec<Failure>,
    /// Bytes read and hashed or compared.
    pub bytes: u64,
    /// Wall time of the check (checks run in parallel, so these overlap).
    pub seconds: f64,
    /// What was checked, in a few words.
    pub summary: String,
}

/// All checks.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct VerifyReport {
    /// Every check passed.
    pub passed: bool,
    /// The checks, in the order above.
    pub checks: Vec<Check>,
    /// Sum of the bytes of all checks.
    pub bytes: u64,
    /// Total wall time.
    pub seconds: f64,
}

#[derive(Default)]
struct Acc {
    failures: Vec<Failure>,
    notes: Vec<Failure>,
    bytes: u64,
}

impl Acc {
    fn fail(&mut self, object: impl Into<String>, message: impl Into<String>) {
        self.failures.push(Failure {
            object: object.into(),
            message: message.into(),
        });
    }
    fn note(&mut self, object: impl Into<String>, message: impl Into<String>) {
        self.notes.push(Failure {
            object: object.into(),
            message: message.into(),
        });
    }
    fn merge(&mut self, other: Acc) {
        self.failures.extend(other.failures);
        self.notes.extend(other.notes);
        self.bytes += other.bytes;
    }
}

fn check(name: &'static str, acc: Acc, started: Instant, summary: String) -> Check {
    Check {
        name,
        passed: acc.failures.is_empty(),
        failures: acc.failures,
        notes: acc.notes,
        bytes: acc.bytes,
        seconds: started.elapsed().as_secs_f64(),
        summary,
    }
}

/// Opens `path` only if it is a regular file (a FIFO would block forever,
/// a device never end). Returns the file and its length.
fn open_regular(path: &Path) -> std::io::Result<(File, u64)> {
    let m = std::fs::metadata(path)?;
    if !m.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, device or directory is refused)",
        ));
    }
    let f = File::open(path)?;
    let len = f.metadata()?.len();
    Ok((f, len))
}

/// The knot path for a target that is a directory or a knot.
pub fn knot_path(target: &Path) -> PathBuf {
    if target.is_dir() {
        target.join(gkq_format::KNOT_NAME)
    } else {
        target.to_path_buf()
    }
}

/// Lists rows of `a` and `b` (whole rows of `row_bytes`, starting at row
/// `first_row`) that differ, up to `room` of them; returns how many differ.
fn diff_rows(
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

fn row_list(rows: &[u64], total: u64, row_bytes: u64) -> String {
    let mut parts: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "row {r} (bytes {}-{})",
                r * row_bytes,
                (r + 1) * row_bytes - 1
            )
        })
        .collect();
    if total > rows.len() as u64 {
        parts.push(format!("and {} more", total - rows.len() as u64));
    }
    parts.join(", ")
}

/// The knot's map, whose pages go back to the kernel once a chunk has been
/// checked, so that verify's resident memory stays bounded whatever the
/// knot's size (they are clean pages of a read-only file mapping: touching
/// them again reads the file again).
struct Pages<'m>(&'m memmap2::Mmap);

impl Pages<'_> {
    /// Drops the whole pages of `chunk` (a slice of the map) from this
    /// process's resident set.
    fn release(&self, chunk: &[u8]) {
        const PAGE: usize = 4096;
        let start = (chunk.as_ptr() as usize).wrapping_sub(self.0.as_ptr() as usize);
        if start >= self.0.len() {
            return;
        }
        let end = start.saturating_add(chunk.len()).min(self.0.len());
        let (a, b) = (start.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
        if b > a {
            // SAFETY: a private read-only mapping of a file this process
            // never writes: MADV_DONTNEED only drops clean pages, which the
            // next access reads from the file again.
            #[allow(unsafe_code)]
            let _ = unsafe {
                self.0
                    .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a, b - a)
            };
        }
    }
}

/// Hashes a block's payload; for a columnar block, also checks each row
/// file in the same pass.
fn check_block(
    knot: &Knot<'_>,
    pages: &Pages<'_>,
    dir: &Path,
    index: usize,
    cols: &mut Acc,
    progress: &dyn Progress,
) -> Acc {
    let mut acc = Acc::default();
    let block = &knot.blocks()[index];
    let (Some(payload), Some(p)) = (knot.payload(index), block.encoding.payload()) else {
        return acc;
    };
    struct RowFile<'d> {
        d: &'d ColumnarDescriptor,
        file: File,
        hasher: Sha256,
        diff: u64,
        listed: Vec<u64>,
        len: u64,
        leaves: Vec<merkle::Hash>,
        /// First row that breaks the descriptor's BLOCK_EXACT claim.
        not_block_exact: Option<u64>,
        buf: Vec<u8>,
        converted: Vec<u8>,
    }
    impl RowFile<'_> {
        /// Reads the rows of `chunk` (the block's rows from `first_row`)
        /// from the row file and checks them: digest, against the block,
        /// Merkle leaves, BLOCK_EXACT. The digest runs alongside the rest.
        fn take(
            &mut self,
            block: &Block,
            chunk: &[u8],
            first_row: u64,
            rows: usize,
        ) -> Result<u64, String> {
            let rb = self.d.row_bytes as usize;
            let RowFile {
                d,
                file,
                hasher,
                diff,
                listed,
                leaves,
                not_block_exact,
                buf,
                converted,
                ..
            } = self;
            buf.resize(rows * rb, 0);
            file.read_exact_at(buf, first_row * rb as u64)
                .map_err(|e| format!("read at row {first_row}: {e}"))?;
            let buf = &buf[..];
            rayon::join(
                || hasher.update(buf),
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
            Ok(buf.len() as u64)
        }
    }
    let mut files: Vec<RowFile<'_>> = Vec::new();
    for d in &block.columnar {
        let path = dir.join(&d.object);
        let opened = open_regular(&path);
        match opened {
            Err(e) => cols.fail(
                path.display().to_string(),
                format!("row file of block {:?} ({} rows): {e}", block.name, d.dtype),
            ),
            Ok((_, len)) if len != d.byte_len => cols.fail(
                path.display().to_string(),
                gkq_format::check_row_file_len(d, len)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
            ),
            Ok((file, len)) => files.push(RowFile {
                d,
                file,
                hasher: Sha256::new(),
                diff: 0,
                listed: Vec::new(),
                len,
                leaves: Vec::new(),
                not_block_exact: None,
                buf: Vec::new(),
                converted: Vec::new(),
            }),
        }
    }
    let mut hasher = Sha256::new();
    let item = block.dtype.itemsize() as usize;
    let src_row = block.shape.get(1).copied().unwrap_or(1) as usize * item;
    let step = CHUNK
        .checked_div(src_row)
        .map_or(CHUNK, |n| n.max(1) * src_row);
    let mut at = 0usize;
    for chunk in payload.chunks(step.max(1)) {
        acc.bytes += chunk.len() as u64;
        progress.advance(chunk.len() as u64);
        let first_row = at.checked_div(src_row).unwrap_or(0) as u64;
        let rows = chunk.len().checked_div(src_row).unwrap_or(0);
        // the payload's digest and every row file's checks, all at once
        let ((), taken) = rayon::join(
            || hasher.update(chunk),
            || {
                files
                    .par_iter_mut()
                    .filter(|rf| rf.diff != u64::MAX)
                    .map(|rf| (rf.d.object.clone(), rf.take(block, chunk, first_row, rows)))
                    .collect::<Vec<_>>()
            },
        );
        for (object, r) in taken {
            match r {
                Ok(n) => cols.bytes += n,
                Err(m) => {
                    cols.fail(dir.join(&object).display().to_string(), m);
                    if let Some(rf) = files.iter_mut().find(|rf| rf.d.object == object) {
                        rf.diff = u64::MAX;
                    }
                }
            }
        }
        at += chunk.len();
        pages.release(chunk);
    }
    let digest: [u8; 32] = hasher.finalize().into();
    if let Err(e) = gkq_format::check_payload_digest(knot.header().header(), index, p, digest) {
        acc.fail(format!("block {}", block.name), e.to_string());
    } else if let Err(m) = check_spectral_decodes(block, payload) {
        acc.fail(format!("block {}", block.name), m);
    }
    for rf in files {
        let path = dir.join(&rf.d.object).display().to_string();
        if rf.diff == u64::MAX {
            continue;
        }
        let digest: [u8; 32] = rf.hasher.finalize().into();
        if let Err(e) = gkq_format::check_row_file_digest(rf.d, digest) {
            cols.fail(path.clone(), format!("{e} ({} bytes)", rf.len));
        }
        if let Some(row) = rf.not_block_exact {
            let e = gkq_format::Error::ExactnessClaim {
                object: rf.d.object.clone(),
                flag: "BLOCK_EXACT",
                reason: format!(
                    "row {row} does not cast back to block {:?} ({}) bit for bit",
                    block.name, block.dtype
                ),
            };
            cols.fail(path.clone(), e.to_string());
        }
        if let Some(proof) = rf.d.proof {
            let ppath = dir.join(merkle::proof_object_name(&rf.d.object));
            if let Err(e) = check_proof_file(&ppath, &rf.leaves, proof) {
                cols.fail(ppath.display().to_string(), e);
            } else {
                cols.bytes += merkle::layout_of(rf.d)
                    .and_then(|l| l.object_len())
                    .unwrap_or(0);
            }
        }
        if rf.diff > 0 {
            let e = gkq_format::Error::RowMismatch {
                object: rf.d.object.clone(),
                block: block.name.clone(),
                dtype: rf.d.dtype,
                count: rf.diff,
                first_row: rf.listed.first().copied().unwrap_or(0),
            };
            cols.fail(
                path,
                format!("{e}: {}", row_list(&rf.listed, rf.diff, rf.d.row_bytes)),
            );
        }
    }
    acc
}

/// A `Write` that compares what is written with a file, byte for byte.
struct Compare {
    file: std::io::BufReader<File>,
    at: u64,
    first_diff: Option<u64>,
    buf: Vec<u8>,
}

impl std::io::Write for Compare {
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
/// row file's leaves, and the root against the descriptor's.
fn check_proof_file(
    path: &Path,
    leaves: &[merkle::Hash],
    proof: RowProof,
) -> std::result::Result<(), String> {
    let expected_len = merkle::ProofLayout::new(leaves.len() as u64, proof.height)
        .and_then(|l| l.object_len())
        .unwrap_or(0);
    let (file, len) = open_regular(path).map_err(|e| format!("proof object: {e}"))?;
    if len != expected_len {
        return Err(format!(
            "proof object: {len} bytes, expected {expected_len} (32 × (chunks + rows × {}))",
            proof.height
        ));
    }
    let mut cmp = Compare {
        file: std::io::BufReader::with_capacity(1 << 20, file),
        at: 0,
        first_diff: None,
        buf: Vec::new(),
    };
    let root = merkle::write_proof(leaves, proof.height, &mut cmp)
        .map_err(|e| format!("proof object: read: {e}"))?;
    if root != Some(proof.root) {
        return Err(format!(
            "the rows' Merkle root is {}, the knot records {}",
            root.map(|r| hex(&r)).unwrap_or_default(),
            hex(&proof.root)
        ));
    }
    match cmp.first_diff {
        Some(at) => Err(format!(
            "proof object differs from the one computed from the rows at byte {at}"
        )),
        None => Ok(()),
    }
}

/// The companion files (`package.files`): present, regular, and hashing to
/// the digests the knot records.
fn check_package(knot: &Knot<'_>, dir: &Path) -> Option<(Acc, usize)> {
    let h = knot.header().header();
    let files = h.meta_list(keys::PACKAGE_FILES)?;
    let mut acc = Acc::default();
    for (name, want) in h.package_files() {
        let path = dir.join(name);
        let shown = path.display().to_string();
        let mut f = match open_regular(&path) {
            Ok((f, _)) => f,
            Err(e) => {
                acc.fail(
                    shown,
                    format!("companion file listed in package.files: {e}"),
                );
                continue;
            }
        };
        let mut hasher = Sha256::new();
        match std::io::copy(&mut f, &mut hasher) {
            Ok(n) => acc.bytes += n,
            Err(e) => {
                acc.fail(shown, e.to_string());
                continue;
            }
        }
        let got = hex(&hasher.finalize());
        if got != *want {
            acc.fail(shown, format!("sha256 is {got}, the knot records {want}"));
        }
    }
    Some((acc, files.len()))
}

/// A spectral block's factors decode (FORMAT.md section 5) and reconstruct
/// to finite values in the block's dtype.
fn check_spectral_decodes(block: &Block, payload: &[u8]) -> std::result::Result<(), String> {
    if !matches!(block.encoding, Encoding::Spectral { .. }) {
        return Ok(());
    }
    let w = gkq_format::reconstruct_spectral(block, payload).map_err(|e| e.to_string())?;
    let mut v = Vec::new();
    gkq_format::decode_f32(&w, block.dtype, &mut v);
    match v.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => {
            let cols = block.shape.get(1).copied().unwrap_or(1).max(1) as usize;
            Err(format!(
                "spectral block reconstructs to {} at row {} col {}",
                v[i],
                i / cols,
                i % cols
            ))
        }
    }
}

/// How far the relative Frobenius error measured against `--source` may be
/// from the one recorded in `spectral.rel_frobenius_error` (relative, plus
/// an absolute 1e-9 for errors near 0): room for another summation order,
/// far below what a wrong or swapped factor gives.
pub const SPECTRAL_ERROR_TOLERANCE: f64 = 1e-4;

/// Streams a spectral block's reconstruction against its source tensor.
struct SpectralCheck<'k> {
    block: &'k Block,
    parts: gkq_format::SpectralParts,
    err: gkq_format::FrobeniusError,
    converted: Vec<u8>,
}

impl SpectralCheck<'_> {
    /// Adds `chunk` (whole source rows from `first_row`, in `from`).
    fn add(&mut self, chunk: &[u8], from: gkq_format::DType, first_row: u64) {
        let cols = self.parts.n.max(1);
        let mut exact = Vec::new();
        gkq_format::decode_f32(chunk, from, &mut exact);
        let w = self.parts.rows(first_row as usize, exact.len() / cols);
        let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.converted.clear();
        let mut approx = Vec::new();
        if cast_row(
            &bytes,
            gkq_format::DType::F32,
            self.block.dtype,
            &mut self.converted,
        )
        .is_some()
        {
            gkq_format::decode_f32(&self.converted, self.block.dtype, &mut approx);
        }
        self.err.add(&approx, &exact);
    }

    /// Compares the measured error with the recorded one.
    fn finish(self, knot: &Knot<'_>, tensor: &str, object: &str, acc: &mut Acc) {
        let measured = self.err.relative();
        let header = knot.header().header();
        let figures = header.spectral_figures();
        let Some(f) = figures.iter().find(|f| f.block == self.block.name) else {
            acc.note(
                object,
                format!(
                    "spectral block {tensor:?}: relative Frobenius error {measured:.4e} against the source (the knot records none)"
                ),
            );
            return;
        };
        let want = f.rel_frobenius_error;
        if (measured - want).abs() > SPECTRAL_ERROR_TOLERANCE * want + 1e-9 {
            acc.fail(
                object,
                format!(
                    "spectral block {tensor:?}: relative Frobenius error against the source is {measured:.6e}, the knot records {want:.6e} (tolerance {SPECTRAL_ERROR_TOLERANCE:e} relative)"
                ),
            );
        } else {
            acc.note(
                object,
                format!(
                    "spectral block {tensor:?} (rank {}): relative Frobenius error {measured:.4e} against the source, as recorded; energy kept {}",
                    self.parts.k, f.energy_kept
                ),
            );
        }
    }
}

/// Compares every tensor of one source file with the knot, hashing the file
/// in the same pass.
fn check_source_file(
    knot: &Knot<'_>,
    pages: &Pages<'_>,
    src: &SourceModel,
    file: usize,
    progress: &dyn Progress,
) -> Acc {
    let mut acc = Acc::default();
    let f = &src.files[file];
    let name = f.path.display().to_string();
    let header = knot.header().header();
    let mut hasher = Sha256::new();
    match src.read_header(file) {
        Ok(h) => hasher.update(h),
        Err(e) => {
            acc.fail(name, e.to_string());
            return acc;
        }
    }
    let mut buf = vec![0u8; CHUNK];
    let mut converted = Vec::new();
    for t in src.tensors.iter().filter(|t| t.file == file) {
        let index = header.block_index(&t.name);
        let target: Option<(&Block, &[u8])> =
            index.and_then(|i| Some((header.resolve(i)?, knot.payload(i)?)));
        let mut spectral = target
            .filter(|(b, _)| matches!(b.encoding, Encoding::Spectral { .. }) && b.shape == t.shape)
            .and_then(|(block, payload)| {
                Some(SpectralCheck {
                    block,
                    parts: gkq_format::SpectralParts::decode(block, payload).ok()?,
                    err: gkq_format::FrobeniusError::default(),
                    converted: Vec::new(),
                })
            });
        let target = target.filter(|(b, _)| matches!(b.encoding, Encoding::Dense(_)));
        if index.is_none() {
            acc.fail(
                name.clone(),
                format!("tensor {:?} is not in the knot", t.name),
            );
        }
        if let Some((b, _)) = target
            && (b.shape != t.shape
                || (b.dtype != t.dtype
                    && !(b.dtype.is_castable_float() && t.dtype.is_castable_float())))
        {
            acc.fail(
                name.clone(),
                format!(
                    "tensor {:?}: source is {} {:?}, knot block {:?} is {} {:?}",
                    t.name, t.dtype, t.shape, b.name, b.dtype, b.shape
                ),
            );
        }
        let row = t.shape.get(1).copied().unwrap_or(1).max(1) * t.dtype.itemsize();
        let step = if t.shape.len() == 2 {
            (CHUNK as u64 / row).max(1) * row
        } else {
            CHUNK as u64
        };
        let out_row = t.shape.get(1).copied().unwrap_or(1).max(1)
            * target.map_or(1, |(b, _)| b.dtype.itemsize());
        let (mut at, mut diff, mut listed) = (0u64, 0u64, Vec::new());
        // row files whose SOURCE_EXACT claim fails, and the first element
        let mut not_source_exact: Vec<(String, u64)> = Vec::new();
        // the largest |source - block| of a narrowing role block (lossy by choice)
        let mut loss: Option<f64> = None;
        let item_in = t.dtype.itemsize();
        while at < t.len {
            let n = (t.len - at).min(step) as usize;
            if buf.len() < n {
                buf.resize(n, 0);
            }
            let chunk = &mut buf[..n];
            if let Err(e) = src.read(t, at, chunk) {
                acc.fail(name.clone(), e.to_string());
                return acc;
            }
            let chunk: &[u8] = chunk;
            acc.bytes += n as u64;
            progress.advance(n as u64);
            // the file's digest on one core, the comparisons on the other
            let compare = || {
                if let Some(sc) = &mut spectral {
                    sc.add(chunk, t.dtype, at / row);
                }
                if let Some((b, payload)) = target.filter(|(b, _)| b.shape == t.shape) {
                    let expected: &[u8] = if b.dtype == t.dtype {
                        chunk
                    } else {
                        converted.clear();
                        if cast_row(chunk, t.dtype, b.dtype, &mut converted).is_none() {
                            return false;
                        }
                        &converted
                    };
                    // the chunk starts at element at/itemsize, whatever the shape
                    let first_elem = at / item_in;
                    let start = (first_elem * b.dtype.itemsize()) as usize;
                    let got = payload
                        .get(start..start + expected.len())
                        .unwrap_or_default();
                    let (rb, first_row) = if t.shape.len() == 2 {
                        (out_row as usize, at / row)
                    } else {
                        // report element offsets for tensors that are not 2-D
                        (b.dtype.itemsize() as usize, first_elem)
                    };
                    diff += diff_rows(expected, got, rb, first_row, &mut listed, MAX_LISTED);
                    // The block's values cast to the source's dtype, once:
                    // it is what the rows of a descriptor in the block's or
                    // the source's dtype give when cast to the source's.
                    let mut as_source: Option<Vec<u8>> = None;
                    for d in b.columnar.iter().filter(|d| d.is_source_exact()) {
                        if not_source_exact.iter().any(|(o, _)| *o == d.object) {
                            continue;
                        }
                        let inexact = if d.dtype == b.dtype || d.dtype == t.dtype {
                            let v = as_source.get_or_insert_with(|| {
                                let mut v = Vec::with_capacity(chunk.len());
                                let _ = cast_row(got, b.dtype, t.dtype, &mut v);
                                v
                            });
                            gkq_format::first_inexact(v, t.dtype, chunk, t.dtype)
                        } else {
                            converted.clear();
                            if cast_row(got, b.dtype, d.dtype, &mut converted).is_none() {
                                continue;
                            }
                            gkq_format::first_inexact(&converted, d.dtype, chunk, t.dtype)
                        };
                        if let Some(i) = inexact {
                            not_source_exact.push((d.object.clone(), first_elem + i as u64));
                        }
                    }
                    if b.dtype != t.dtype
                        && b.dtype.itemsize() < t.dtype.itemsize()
                        && let Some(e) = gkq_format::max_abs_diff(chunk, t.dtype, got, b.dtype)
                    {
                        loss = Some(loss.map_or(e, |l| l.max(e)));
                    }
                    pages.release(got);
                }
                true
            };
            let ((), whole) = rayon::join(|| hasher.update(chunk), compare);
            if !whole {
                break;
            }
            at += n as u64;
        }
        if let Some(sc) = spectral {
            sc.finish(knot, &t.name, &name, &mut acc);
        }
        if let Some(e) = loss {
            let b = target.map(|(b, _)| b.dtype.to_string()).unwrap_or_default();
            acc.note(
                name.clone(),
                format!(
                    "tensor {:?} is lossy: the knot holds it as {b}, narrower than its source {} (largest error {e:e}); every value is the documented cast",
                    t.name, t.dtype
                ),
            );
        }
        for (object, elem) in not_source_exact {
            let cols = t.shape.get(1).copied().unwrap_or(1).max(1);
            let e = gkq_format::Error::ExactnessClaim {
                object,
                flag: "SOURCE_EXACT",
                reason: format!(
                    "row {} col {} does not cast back to tensor {:?}'s {} bits",
                    elem / cols,
                    elem % cols,
                    t.name,
                    t.dtype
                ),
            };
            acc.fail(name.clone(), e.to_string());
        }
        if diff > 0 {
            let what = if t.shape.len() == 2 {
                row_list(&listed, diff, out_row)
            } else {
                format!(
                    "{diff} elements differ, the first at element {}",
                    listed.first().copied().unwrap_or(0)
                )
            };
            acc.fail(
                name.clone(),
                format!(
                    "tensor {:?} differs from the knot after the documented cast: {what}",
                    t.name
                ),
            );
        }
    }
    let digest = hex(&hasher.finalize());
    let files = header.meta_list(keys::SOURCE_FILES).unwrap_or_default();
    let hashes = header.meta_list(keys::SOURCE_SHA256).unwrap_or_default();
    match files.iter().position(|n| *n == f.name) {
        None => acc.fail(name, "source file is not listed in the knot's source.files"),
        Some(i) if hashes.get(i) != Some(&digest) => acc.fail(
            name,
            format!(
                "sha256 is {digest}, the knot records {}",
                hashes.get(i).map_or("nothing", String::as_str)
            ),
        ),
        Some(_) => {}
    }
    acc
}

/// Runs every check that the options ask for.
pub fn verify(opts: &VerifyOptions) -> Result<VerifyReport> {
    verify_with(opts, &NoProgress)
}

/// [`verify`], reporting the bytes the local checks read to `progress`.
pub fn verify_with(opts: &VerifyOptions, progress: &dyn Progress) -> Result<VerifyReport> {
    let started = Instant::now();
    let path = knot_path(&opts.target);
    let dir = path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    // --source: a directory, or ORG/NAME in the local Hugging Face cache
    let source_dir = match &opts.source {
        Some(s) if s.is_dir() => Some(s.clone()),
        Some(s) => match gkq_source::hub::locate(s) {
            Ok(l) => Some(l.dir),
            Err(_) => return Err(VerifyError::SourceNotDir { path: s.clone() }),
        },
        None => None,
    };
    if let Some(u) = &opts.url {
        remote::check_url(u)?;
    }
    let http = match &opts.url {
        Some(_) => Some(remote::client(opts)?),
        None => None,
    };
    let (file, _) = open_regular(&path).map_err(|error| VerifyError::OpenKnot {
        path: path.clone(),
        error,
    })?;
    // SAFETY: read-only map of a file this process does not modify; a knot
    // changed underneath verification is reported as whatever mismatch it causes.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|error| VerifyError::OpenKnot {
        path: path.clone(),
        error,
    })?;
    let knot_name = path.display().to_string();
    let pages = Pages(&map);
    let knot = match Knot::parse(&map) {
        Ok(k) => k,
        Err(e) => {
            let mut acc = Acc::default();
            acc.fail(knot_name, e.to_string());
            let c = check("knot", acc, started, "structure".into());
            return Ok(VerifyReport {
                passed: false,
                bytes: 0,
                seconds: started.elapsed().as_secs_f64(),
                checks: vec![c],
            });
        }
    };

    // Local work items: every payload (with its row files), every source file.
    let source = source_dir.as_ref().map(|s| SourceModel::open(s));
    enum Item {
        Block(usize),
        Source(usize),
    }
    let mut items: Vec<Item> = (0..knot.blocks().len())
        .filter(|&i| knot.blocks()[i].encoding.payload().is_some())
        .map(Item::Block)
        .collect();
    if let Some(Ok(src)) = &source {
        items.extend((0..src.files.len()).map(Item::Source));
    }
    // Largest first so the tail of the parallel run is short.
    let size = |it: &Item| match it {
        Item::Block(i) => knot.blocks()[*i]
            .encoding
            .payload()
            .map_or(0, |p| p.len * (1 + knot.blocks()[*i].columnar.len() as u64)),
        Item::Source(i) => source
            .as_ref()
            .and_then(|s| s.as_ref().ok())
            .map_or(0, |s| s.files[*i].len),
    };
    items.sort_by_key(|it| std::cmp::Reverse(size(it)));
    let total: u64 = items
        .iter()
        .map(|it| match it {
            Item::Block(i) => knot.blocks()[*i].encoding.payload().map_or(0, |p| p.len),
            Item::Source(i) => source
                .as_ref()
                .and_then(|s| s.as_ref().ok())
                .map_or(0, |s| {
                    s.tensors
                        .iter()
                        .filter(|t| t.file == *i)
                        .map(|t| t.len)
                        .sum()
                }),
        })
        .sum();
    progress.start(total);
    let remote_started = Instant::now();
    let (results, remote) = rayon::join(
        || {
            items
                .par_iter()
                .map(|it| {
                    let t = Instant::now();
                    match it {
                        Item::Block(i) => {
                            let mut cols = Acc::default();
                            let k = check_block(&knot, &pages, &dir, *i, &mut cols, progress);
                            (k, cols, Acc::default(), t.elapsed())
                        }
                        Item::Source(i) => {
                            let src = source
                                .as_ref()
                                .and_then(|s| s.as_ref().ok())
                                .expect("source opened");
                            (
                                Acc::default(),
                                Acc::default(),
                                check_source_file(&knot, &pages, src, *i, progress),
                                t.elapsed(),
                            )
                        }
                    }
                })
                .collect::<Vec<_>>()
        },
        || {
            opts.url
                .as_ref()
                .zip(http.as_ref())
                .map(|(u, http)| remote::check_remote(http, &knot, &map, &dir, u, opts))
        },
    );
    let (mut k, mut c, mut s) = (Acc::default(), Acc::default(), Acc::default());
    for (a, b, d, _) in results {
        k.merge(a);
        c.merge(b);
        s.merge(d);
    }
    let header = knot.header().header();
    let n_desc: usize = header.blocks.iter().map(|b| b.columnar.len()).sum();
    let mut checks = vec![
        check("knot", k, started, {
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
        }),
        check(
            "columnar",
            c,
            started,
            format!(
                "{n_desc} row files: size, sha256, every row against its block, exactness flags, proof objects (Merkle roots)"
            ),
        ),
    ];
    if let Some((acc, n)) = check_package(&knot, &dir) {
        checks.push(check(
            "package",
            acc,
            started,
            format!("{n} companion files: sha256 against the knot"),
        ));
    }
    if let Some(src) = source {
        match src {
            Err(e) => s.fail(
                opts.source
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                e.to_string(),
            ),
            Ok(src) => {
                // every knot block must come from the source
                for b in &header.blocks {
                    let aliased = matches!(b.encoding, Encoding::Alias { .. });
                    if src.tensor(&b.name).is_none() && !aliased {
                        s.fail(b.name.clone(), "block is not a tensor of the source model");
                    }
                }
                let listed = header.meta_list(keys::SOURCE_FILES).unwrap_or_default();
                for name in listed {
                    if !src.files.iter().any(|f| &f.name == name) {
                        s.fail(
                            name.clone(),
                            "listed in the knot's source.files but not in the source model",
                        );
                    }
                }
            }
        }
        checks.push(check(
            "source",
            s,
            started,
            "every tensor and source file digest against the original".into(),
        ));
    }
    if let Some(RemoteOutcome {
        unreachable: Some((url, reason)),
        ..
    }) = remote
    {
        return Err(VerifyError::Unreachable { url, reason });
    }
    if let Some(r) = remote {
        let mut c = check("remote", r.acc, remote_started, r.summary);
        c.seconds = r.seconds;
        checks.push(c);
    }
    let bytes = checks.iter().map(|c| c.bytes).sum();
    Ok(VerifyReport {
        passed: checks.iter().all(|c| c.passed),
        checks,
        bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}
