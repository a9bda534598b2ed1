//! The `source` check (`--source`): every tensor of the original model
//! bit-identical to its block after the documented cast (a spectral block's
//! reconstruction error as recorded), every exactness claim, every source
//! file's digest, and every block and listed file accounted for. Each
//! source file is hashed on one core while its tensors are compared on the
//! other.

use gkq_format::{Block, Encoding, Knot, cast_row, hex, keys};
use gkq_source::{SourceModel, SourceTensor};
use sha2::{Digest, Sha256};

use super::columnar::diff_rows;
use super::home::{Buffers, Homes, Source};
use super::quant::QuantCheck;
use super::spectral::SpectralCheck;
use crate::Progress;
use crate::files::Pages;
use crate::report::{CheckFindings, Differ, Finding, Note};

/// Bytes read per step.
const CHUNK: usize = 8 << 20;
/// Mismatching rows listed per tensor before summarising.
const MAX_LISTED: usize = 5;

/// One source tensor against its block, chunk by chunk.
struct TensorCheck<'k> {
    t: &'k SourceTensor,
    /// The dense block and where its payload is read from.
    target: Option<(&'k Block, Source<'k>)>,
    /// The buffers of reads from a home row file.
    bufs: Buffers,
    spectral: Option<SpectralCheck<'k>>,
    quant: Option<QuantCheck<'k>>,
    /// A block type on either side: compared row by row.
    blocky: bool,
    /// Bytes per source row, and per block row (a row is the last
    /// dimension of a block-type tensor, else the second of a 2-D one).
    row: u64,
    out_row: u64,
    diff: u64,
    listed: Vec<u64>,
    /// Row files whose SOURCE_EXACT claim fails, and the first element.
    not_source_exact: Vec<(String, u64)>,
    /// The largest |source - block| of a narrowing block (lossy by choice).
    loss: Option<f64>,
    converted: Vec<u8>,
}

impl<'k> TensorCheck<'k> {
    /// The check of `t`, and what is wrong before any value is read.
    fn new(
        (knot, homes): (&'k Knot<'k>, &'k Homes),
        t: &'k SourceTensor,
        name: &str,
        acc: &mut CheckFindings,
    ) -> TensorCheck<'k> {
        let header = knot.header().header();
        let index = header.block_index(&t.name);
        let target: Option<(&Block, Source<'_>)> =
            index.and_then(|i| Some((header.resolve(i)?, homes.source(knot, i)?)));
        let spectral = match &target {
            Some((b, Source::Knot(payload)))
                if matches!(b.encoding, Encoding::Spectral { .. }) && b.shape == t.shape =>
            {
                SpectralCheck::new(b, payload)
            }
            _ => None,
        };
        let target = target.filter(|(b, _)| matches!(b.encoding, Encoding::Dense(_)));
        if index.is_none() {
            acc.fail(
                name,
                Finding::TensorNotInKnot {
                    tensor: t.name.clone(),
                },
            );
        }
        // a float source cast or quantized; a block-type source quantized
        // again (gkq-pack --allow-requantize)
        let castable = |b: &Block| {
            (b.dtype.is_castable_float() || b.dtype.is_quantized())
                && (t.dtype.is_castable_float()
                    || (t.dtype.is_quantized() && b.dtype.is_quantized()))
        };
        if let Some((b, _)) = target
            && (b.shape != t.shape || (b.dtype != t.dtype && !castable(b)))
        {
            acc.fail(
                name,
                Finding::TensorShape {
                    tensor: t.name.clone(),
                    source_dtype: t.dtype,
                    source_shape: t.shape.clone(),
                    block: b.name.clone(),
                    block_dtype: b.dtype,
                    block_shape: b.shape.clone(),
                },
            );
        }
        // a block type on either side (a quantized block, or a GGUF's
        // tensor) is compared row by row, a row being the last dimension
        let blocky = t.dtype.is_quantized() || target.is_some_and(|(b, _)| b.dtype.is_quantized());
        let cols = if blocky {
            t.shape.last()
        } else {
            t.shape.get(1)
        };
        let cols = cols.copied().unwrap_or(1).max(1);
        let out_row = target.map_or(Some(1), |(b, _)| b.dtype.row_bytes(cols));
        // figures of a block quantized by the packer (not of a GGUF's own)
        let quantized = target
            .filter(|(b, _)| b.dtype.is_quantized() && b.dtype != t.dtype && b.shape == t.shape);
        TensorCheck {
            t,
            target,
            bufs: Buffers::default(),
            spectral,
            quant: quantized.and_then(|(b, _)| QuantCheck::new(b)),
            blocky,
            row: t.dtype.row_bytes(cols).unwrap_or(1).max(1),
            out_row: out_row.unwrap_or(1),
            diff: 0,
            listed: Vec::new(),
            not_source_exact: Vec::new(),
            loss: None,
            converted: Vec::new(),
        }
    }

    /// Bytes of the tensor per read: whole rows of a 2-D or block-type tensor.
    fn step(&self) -> u64 {
        if self.by_rows() {
            (CHUNK as u64 / self.row).max(1) * self.row
        } else {
            CHUNK as u64
        }
    }

    /// Whether the tensor is compared row by row.
    fn by_rows(&self) -> bool {
        self.t.shape.len() == 2 || self.blocky
    }

    /// Compares `chunk` (the tensor's bytes from `at`) with the block;
    /// false when the chunk cannot be cast (nothing more to compare).
    fn compare(&mut self, chunk: &[u8], at: u64, pages: &Pages<'_>) -> bool {
        let t = self.t;
        if let Some(sc) = &mut self.spectral {
            sc.add(chunk, t.dtype, at / self.row);
        }
        let Some((b, payload)) = self.target.filter(|(b, _)| b.shape == t.shape) else {
            return true;
        };
        let expected: &[u8] = if b.dtype == t.dtype {
            chunk
        } else {
            self.converted.clear();
            if cast_row(chunk, t.dtype, b.dtype, &mut self.converted).is_none() {
                return false;
            }
            &self.converted
        };
        // the chunk starts at element at/itemsize, whatever the shape (at
        // row at/row of a block type's)
        let first_elem = at.checked_div(t.dtype.itemsize()).unwrap_or(0);
        let start = if self.blocky {
            (at / self.row * self.out_row) as usize
        } else {
            (first_elem * b.dtype.itemsize()) as usize
        };
        let mut bufs = std::mem::take(&mut self.bufs);
        let Ok(got) = payload.read(start as u64, expected.len(), &mut bufs) else {
            return false; // the block check reports the home row file
        };
        let (rb, first_row) = if self.by_rows() {
            (self.out_row as usize, at / self.row)
        } else {
            // element offsets for tensors that are not 2-D
            (b.dtype.itemsize() as usize, first_elem)
        };
        self.diff += diff_rows(expected, got, rb, first_row, &mut self.listed, MAX_LISTED);
        self.check_source_exact(b, chunk, got, first_elem);
        if let Some(q) = &mut self.quant {
            q.add(chunk, t.dtype, got);
        } else if b.dtype != t.dtype
            && b.dtype.itemsize() < t.dtype.itemsize()
            && let Some(e) = gkq_format::max_abs_diff(chunk, t.dtype, got, b.dtype)
        {
            self.loss = Some(self.loss.map_or(e, |l| l.max(e)));
        }
        pages.release(got);
        self.bufs = bufs;
        true
    }

    /// The SOURCE_EXACT claims of the block's row files over this chunk.
    /// The block's values are cast to the source's dtype once: it is what
    /// the rows of a descriptor in the block's or the source's dtype give
    /// when cast to the source's.
    fn check_source_exact(&mut self, b: &Block, chunk: &[u8], got: &[u8], first_elem: u64) {
        let t = self.t;
        let mut as_source: Option<Vec<u8>> = None;
        for d in b.columnar.iter().filter(|d| d.is_source_exact()) {
            if self.not_source_exact.iter().any(|(o, _)| *o == d.object) {
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
                self.converted.clear();
                if cast_row(got, b.dtype, d.dtype, &mut self.converted).is_none() {
                    continue;
                }
                gkq_format::first_inexact(&self.converted, d.dtype, chunk, t.dtype)
            };
            if let Some(i) = inexact {
                self.not_source_exact
                    .push((d.object.clone(), first_elem + i as u64));
            }
        }
    }

    /// What the whole tensor showed: the spectral error, the loss note,
    /// exactness claims that failed, rows that differ.
    fn finish(self, knot: &Knot<'_>, name: &str, acc: &mut CheckFindings) {
        let t = self.t;
        let by_rows = self.by_rows();
        if let Some(sc) = self.spectral {
            sc.finish(knot, &t.name, name, acc);
        }
        if let Some(q) = self.quant {
            q.finish(knot, name, acc);
        }
        if let Some(max_error) = self.loss {
            let block = self
                .target
                .map(|(b, _)| b.dtype.to_string())
                .unwrap_or_default();
            let note = Note::Lossy {
                tensor: t.name.clone(),
                block,
                source: t.dtype,
                max_error,
            };
            acc.note(name, note);
        }
        let cols = t.shape.get(1).copied().unwrap_or(1).max(1);
        for (object, elem) in self.not_source_exact {
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
            acc.fail(name, e);
        }
        if self.diff > 0 {
            let differ = if by_rows {
                Differ::Rows {
                    listed: self.listed,
                    total: self.diff,
                    row_bytes: self.out_row,
                }
            } else {
                Differ::Elements {
                    count: self.diff,
                    first: self.listed.first().copied().unwrap_or(0),
                }
            };
            acc.fail(
                name,
                Finding::TensorDiffers {
                    tensor: t.name.clone(),
                    differ,
                },
            );
        }
    }
}

/// Compares every tensor of source file `file` with the knot, hashing the
/// file in the same pass.
pub(crate) fn check_file(
    (knot, homes): (&Knot<'_>, &Homes),
    pages: &Pages<'_>,
    src: &SourceModel,
    file: usize,
    progress: &dyn Progress,
) -> CheckFindings {
    let mut acc = CheckFindings::default();
    let name = src.files[file].path.display().to_string();
    let mut hasher = Sha256::new();
    match src.read_header(file) {
        Ok(h) => hasher.update(h),
        Err(e) => {
            acc.fail(name, e);
            return acc;
        }
    }
    let mut buf = vec![0u8; CHUNK];
    for t in src.tensors.iter().filter(|t| t.file == file) {
        let mut tc = TensorCheck::new((knot, homes), t, &name, &mut acc);
        let step = tc.step();
        let mut at = 0u64;
        while at < t.len {
            let n = (t.len - at).min(step) as usize;
            if buf.len() < n {
                buf.resize(n, 0);
            }
            let chunk = &mut buf[..n];
            if let Err(e) = src.read(t, at, chunk) {
                acc.fail(name, e);
                return acc;
            }
            let chunk: &[u8] = chunk;
            acc.bytes += n as u64;
            progress.advance(n as u64);
            // the file's digest on one core, the comparisons on the other
            let ((), whole) = rayon::join(|| hasher.update(chunk), || tc.compare(chunk, at, pages));
            if !whole {
                break;
            }
            at += n as u64;
        }
        tc.finish(knot, &name, &mut acc);
        // the bytes between tensors (a GGUF's padding) are part of the file
        match src.read_pad(t) {
            Ok(pad) => hasher.update(&pad),
            Err(e) => {
                acc.fail(name, e);
                return acc;
            }
        }
    }
    check_file_digest(
        knot,
        &src.files[file].name,
        &hex(&hasher.finalize()),
        &name,
        &mut acc,
    );
    acc
}

/// The file's digest against `source.sha256`.
fn check_file_digest(
    knot: &Knot<'_>,
    file: &str,
    digest: &str,
    name: &str,
    acc: &mut CheckFindings,
) {
    let header = knot.header().header();
    let files = header.meta_list(keys::SOURCE_FILES).unwrap_or_default();
    let hashes = header.meta_list(keys::SOURCE_SHA256).unwrap_or_default();
    match files.iter().position(|n| *n == file) {
        None => acc.fail(name, Finding::SourceFileNotListed),
        Some(i) if hashes.get(i).map(String::as_str) != Some(digest) => acc.fail(
            name,
            Finding::Digest {
                found: digest.to_owned(),
                recorded: hashes.get(i).map_or("nothing", String::as_str).to_owned(),
            },
        ),
        Some(_) => {}
    }
}

/// Every knot block comes from the source, and every file the knot lists
/// is in it.
pub(crate) fn check_model(knot: &Knot<'_>, src: &SourceModel, acc: &mut CheckFindings) {
    let header = knot.header().header();
    for b in &header.blocks {
        let aliased = matches!(b.encoding, Encoding::Alias { .. });
        if src.tensor(&b.name).is_none() && !aliased {
            acc.fail(b.name.clone(), Finding::BlockNotInSource);
        }
    }
    for name in header.meta_list(keys::SOURCE_FILES).unwrap_or_default() {
        if !src.files.iter().any(|f| &f.name == name) {
            acc.fail(name.clone(), Finding::ListedFileMissing);
        }
    }
}

/// The package's companion files against the source's (issue 57, J13):
/// they decide every token a node feeds the model (the tokenizer, its
/// template, the config), so each companion file of the source directory
/// must be in the package with the source's bytes (the digest the knot
/// pins), and each one the package lists must come from the source. A
/// GGUF source's are made from its metadata (`config.json`,
/// `metadata.gguf`: [`check_gguf_layout`]) and are not compared here.
pub(crate) fn check_companions(knot: &Knot<'_>, src: &SourceModel, acc: &mut CheckFindings) {
    if src.gguf.is_some() {
        return;
    }
    let files = knot.header().header().package_files();
    let pinned = |name: &str| files.iter().find(|(f, _)| *f == name).map(|(_, d)| *d);
    for name in gkq_source::COMPANION_FILES {
        let path = src.dir.join(name);
        if std::fs::symlink_metadata(&path).is_err() {
            if pinned(name).is_some() {
                acc.fail((*name).to_owned(), Finding::CompanionNotInSource);
            }
            continue;
        }
        let digest = match gkq_files::open_regular(&path, gkq_files::Follow::Yes)
            .and_then(|(f, _)| sha256_of(f, &path))
        {
            Ok(d) => d,
            Err(e) => {
                acc.fail(path.display().to_string(), std::io::Error::other(e));
                continue;
            }
        };
        match pinned(name) {
            None => acc.fail((*name).to_owned(), Finding::CompanionNotInPackage),
            Some(d) if d != digest => acc.fail(
                (*name).to_owned(),
                Finding::CompanionDiffers {
                    in_source: digest,
                    package: d.to_owned(),
                },
            ),
            Some(_) => {}
        }
    }
}

/// The hex SHA-256 of what `f` (the file at `path`) holds.
fn sha256_of(mut f: std::fs::File, path: &std::path::Path) -> gkq_files::Result<String> {
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|error| gkq_files::FileError::Io {
        path: path.to_owned(),
        error,
    })?;
    Ok(hex(&h.finalize()))
}

/// A GGUF source (FORMAT.md 3.6): the package's `metadata.gguf` is the
/// source's metadata byte for byte, and the knot's blocks (aliases apart)
/// are the source's tensors in the order of their data.
pub(crate) fn check_gguf_layout(
    knot: &Knot<'_>,
    src: &SourceModel,
    dir: &std::path::Path,
    acc: &mut CheckFindings,
) {
    let Some(g) = &src.gguf else {
        return;
    };
    let header = knot.header().header();
    let listed = header.package_file_names();
    if listed.iter().any(|f| f == "metadata.gguf") {
        let path = dir.join("metadata.gguf");
        let limit = gkq_format::layout::MAX_HEADER_LEN.saturating_mul(64);
        match gkq_files::read_bounded(&path, limit, "metadata.gguf", gkq_files::Follow::No) {
            Ok(b) if b == g.metadata_file() => {}
            Ok(_) => acc.fail(path.display().to_string(), Finding::GgufMetadata),
            Err(e) => acc.fail(path.display().to_string(), std::io::Error::other(e)),
        }
    }
    let blocks = header
        .blocks
        .iter()
        .filter(|b| !matches!(b.encoding, Encoding::Alias { .. }))
        .map(|b| b.name.as_str());
    let tensors = src.tensors.iter().map(|t| t.name.as_str());
    if let Some((position, (block, tensor))) =
        blocks.zip(tensors).enumerate().find(|(_, (b, t))| b != t)
    {
        let finding = Finding::GgufOrder {
            position,
            block: block.to_owned(),
            tensor: tensor.to_owned(),
        };
        acc.fail(block.to_owned(), finding);
    }
}

/// After every source check: when no source file has the digest the knot
/// records and tensors are missing or differ, one line first that says
/// what that means (the wrong model directory), before the details.
pub(crate) fn different_model(knot: &Knot<'_>, acc: &mut CheckFindings) {
    let header = knot.header().header();
    let files = header.meta_list(keys::SOURCE_FILES).unwrap_or_default();
    let digests = acc
        .findings
        .iter()
        .filter(|(_, f)| matches!(f, Finding::Digest { .. } | Finding::SourceFileNotListed))
        .count();
    let tensors = header
        .blocks
        .iter()
        .filter(|b| !matches!(b.encoding, Encoding::Alias { .. }))
        .count();
    let differ = acc
        .findings
        .iter()
        .filter(|(_, f)| matches!(f, Finding::BlockNotInSource | Finding::TensorDiffers { .. }))
        .count();
    if files.is_empty() || digests < files.len() || differ == 0 {
        return;
    }
    let finding = Finding::DifferentModel {
        files: files.len(),
        differ,
        tensors,
    };
    acc.findings.insert(0, ("--source".to_owned(), finding));
}

/// Bytes of the source's tensors in file `file`.
pub(crate) fn tensor_bytes(src: &SourceModel, file: usize) -> u64 {
    src.tensors
        .iter()
        .filter(|t| t.file == file)
        .map(|t| t.len)
        .sum()
}
