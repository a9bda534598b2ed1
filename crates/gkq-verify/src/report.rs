//! What the checks find, typed, and the report they add up to.
//!
//! Inside, a check collects [`Finding`]s (something wrong, which fails the
//! check) and [`Note`]s (information, which does not), each with the file,
//! tensor or URL it concerns. The report renders them as the
//! `{object, message}` records of the `--json` output and the lines of the
//! text output, which are pinned (`tests/pinned/`).

use std::time::Instant;

use gkq_format::DType;
use serde::Serialize;

use gkq_store::StoreError;

mod note;
pub use note::Note;

/// The checks, in report order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckName {
    /// The structure rules of docs/FORMAT.md and every payload digest.
    Knot,
    /// Each row file against its block, and its proof object.
    Columnar,
    /// The companion files (`package.files`).
    Package,
    /// Every tensor and source file digest against the original (`--source`).
    Source,
    /// The published objects over HTTP(S) (`--url`).
    Remote,
    /// The signature object against the trusted keys (`--trust-key`).
    Signature,
}

impl CheckName {
    /// The name in the output (`knot`, `columnar`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            CheckName::Knot => "knot",
            CheckName::Columnar => "columnar",
            CheckName::Package => "package",
            CheckName::Source => "source",
            CheckName::Remote => "remote",
            CheckName::Signature => "signature",
        }
    }
}

impl std::fmt::Display for CheckName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `row 5 (bytes 640-767), row 9 (…), and 3 more`.
pub(crate) fn row_list(rows: &[u64], total: u64, row_bytes: u64) -> String {
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

/// Which rows or elements of a tensor differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Differ {
    /// Rows of a 2-D tensor: the first few listed, and how many in all.
    Rows {
        /// The first rows that differ.
        listed: Vec<u64>,
        /// How many differ.
        total: u64,
        /// Bytes per row (for the byte ranges shown).
        row_bytes: u64,
    },
    /// Elements of a tensor that is not 2-D.
    Elements {
        /// How many differ.
        count: u64,
        /// The first.
        first: u64,
    },
}

impl std::fmt::Display for Differ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Differ::Rows {
                listed,
                total,
                row_bytes,
            } => f.write_str(&row_list(listed, *total, *row_bytes)),
            Differ::Elements { count, first } => {
                write!(f, "{count} elements differ, the first at element {first}")
            }
        }
    }
}

/// Something a check found wrong. Its text is what the report prints.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Finding {
    /// A rule of docs/FORMAT.md, as gkq-format states it.
    #[error(transparent)]
    Format(#[from] gkq_format::Error),
    /// The source model could not be read.
    #[error(transparent)]
    Source(#[from] gkq_source::SourceError),
    /// Reading a file failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The package is not signed as `--trust-key` requires.
    #[error(transparent)]
    Signature(#[from] gkq_sign::SignError),
    /// A row file that cannot be opened.
    #[error("row file of block {block:?} ({dtype} rows): {error}")]
    RowFileUnreadable {
        /// The block.
        block: String,
        /// The row file's dtype.
        dtype: DType,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// A block stored in its row file (FORMAT.md 7e) whose row file cannot
    /// be read: the block's payload cannot be checked.
    #[error(
        "block {block:?} is stored in its row file {object} (FORMAT.md 7e), which cannot be read: {reason}"
    )]
    HomeUnreadable {
        /// The block.
        block: String,
        /// The row file.
        object: String,
        /// Why.
        reason: String,
    },
    /// A row file that could not be read at a row.
    #[error("read at row {row}: {error}")]
    RowFileRead {
        /// The first row of the read.
        row: u64,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// A row file whose digest is not the descriptor's.
    #[error("{error} ({len} bytes)")]
    RowFileDigest {
        /// The rule broken.
        #[source]
        error: gkq_format::Error,
        /// The file's length.
        len: u64,
    },
    /// Rows of a row file that differ from the block after the cast.
    #[error("{error}: {rows}")]
    RowsDiffer {
        /// The rule broken (`RowMismatch`).
        #[source]
        error: gkq_format::Error,
        /// The rows.
        rows: Differ,
    },
    /// A spectral block that reconstructs to a value that is not finite.
    #[error("spectral block reconstructs to {value} at row {row} col {col}")]
    SpectralNotFinite {
        /// The value.
        value: f32,
        /// Row.
        row: usize,
        /// Column.
        col: usize,
    },
    /// A proof object that cannot be opened.
    #[error("proof object: {0}")]
    ProofUnreadable(#[source] std::io::Error),
    /// A proof object of the wrong length.
    #[error("proof object: {len} bytes, expected {expected} (32 × (chunks + rows × {height}))")]
    ProofLength {
        /// Its length.
        len: u64,
        /// The length FORMAT.md 7a gives.
        expected: u64,
        /// `proof_height`.
        height: u8,
    },
    /// A proof object that failed to read midway.
    #[error("proof object: read: {0}")]
    ProofRead(#[source] std::io::Error),
    /// Rows whose Merkle root is not the descriptor's.
    #[error("the rows' Merkle root is {found}, the knot records {recorded}")]
    MerkleRoot {
        /// The root of the rows.
        found: String,
        /// The root the knot records.
        recorded: String,
    },
    /// A companion file that cannot be opened.
    #[error("companion file listed in package.files: {0}")]
    CompanionUnreadable(#[source] std::io::Error),
    /// A file whose SHA-256 is not the one the knot records.
    #[error("sha256 is {found}, the knot records {recorded}")]
    Digest {
        /// The file's digest.
        found: String,
        /// What the knot records (`nothing` when it records none).
        recorded: String,
    },
    /// A source tensor the knot does not have.
    #[error("tensor {tensor:?} is not in the knot")]
    TensorNotInKnot {
        /// The tensor.
        tensor: String,
    },
    /// A source tensor whose block has another shape or an uncastable dtype.
    #[error(
        "tensor {tensor:?}: source is {source_dtype} {source_shape:?}, knot block {block:?} is {block_dtype} {block_shape:?}"
    )]
    TensorShape {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        source_dtype: DType,
        /// Its shape.
        source_shape: Vec<u64>,
        /// The block.
        block: String,
        /// The block's dtype.
        block_dtype: DType,
        /// The block's shape.
        block_shape: Vec<u64>,
    },
    /// A source tensor whose values are not the block's after the cast.
    #[error("tensor {tensor:?} differs from the knot after the documented cast: {differ}")]
    TensorDiffers {
        /// The tensor.
        tensor: String,
        /// Where.
        differ: Differ,
    },
    /// No source file is the one packed and tensors differ: the wrong model.
    #[error(
        "this looks like a different model than the one packed: none of its {files} source files has the digest the knot records (source.sha256), and {differ} of the knot's {tensors} tensors are missing or differ; check the --source directory (the lines below give the details)"
    )]
    DifferentModel {
        /// Source files the knot lists.
        files: usize,
        /// Tensors missing from the source or different.
        differ: usize,
        /// Tensors of the knot (aliases aside).
        tensors: usize,
    },
    /// A source file the knot's `source.files` does not list.
    #[error("source file is not listed in the knot's source.files")]
    SourceFileNotListed,
    /// A block that is no tensor of the source.
    #[error("block is not a tensor of the source model")]
    BlockNotInSource,
    /// A companion file the package lists that the source directory lacks.
    #[error("the package carries this companion file, but the source model has none")]
    CompanionNotInSource,
    /// A companion file of the source directory that the package lacks.
    #[error("the source model has this companion file, but the package does not carry it")]
    CompanionNotInPackage,
    /// A companion file whose bytes differ from the source's.
    #[error(
        "the package's copy differs from the source's: sha256 {package} in the knot, {in_source} in the source"
    )]
    CompanionDiffers {
        /// The source file's digest.
        in_source: String,
        /// The digest the knot pins.
        package: String,
    },
    /// A file the knot's `source.files` lists that the source lacks.
    #[error("listed in the knot's source.files but not in the source model")]
    ListedFileMissing,
    /// A GGUF-born package whose `metadata.gguf` is not the source's
    /// key/values byte for byte (FORMAT.md 3.6).
    #[error(
        "metadata.gguf is not the source GGUF's metadata (its version, key/values and alignment, byte for byte)"
    )]
    GgufMetadata,
    /// A GGUF-born knot whose blocks are not in the order of the source's
    /// tensor data (FORMAT.md 3.6).
    #[error(
        "block {position} is {block:?}, but the source GGUF's tensor {position} (in data order) is {tensor:?}"
    )]
    GgufOrder {
        /// Where the order first differs, from 0.
        position: usize,
        /// The knot's block there.
        block: String,
        /// The source's tensor there.
        tensor: String,
    },
    /// A finding of the remote check.
    #[error(transparent)]
    Remote(#[from] RemoteFinding),
}

/// One problem found by a check, as the report shows it.
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
    /// Which check.
    pub name: CheckName,
    /// No failures.
    pub passed: bool,
    /// What was found wrong.
    pub failures: Vec<Failure>,
    /// Information that does not fail the check: a role block narrower
    /// than its source (lossy by the publisher's choice), with its largest
    /// error; a spectral block's measured error.
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
    /// The checks, in the order of [`CheckName`].
    pub checks: Vec<Check>,
    /// Sum of the bytes of all checks.
    pub bytes: u64,
    /// Total wall time.
    pub seconds: f64,
}

/// What one check collects while it runs.
#[derive(Debug, Default)]
pub(crate) struct CheckFindings {
    pub(crate) findings: Vec<(String, Finding)>,
    pub(crate) notes: Vec<(String, Note)>,
    pub(crate) bytes: u64,
}

impl CheckFindings {
    pub(crate) fn fail(&mut self, object: impl Into<String>, finding: impl Into<Finding>) {
        self.findings.push((object.into(), finding.into()));
    }

    pub(crate) fn note(&mut self, object: impl Into<String>, note: Note) {
        self.notes.push((object.into(), note));
    }

    pub(crate) fn merge(&mut self, other: CheckFindings) {
        self.findings.extend(other.findings);
        self.notes.extend(other.notes);
        self.bytes += other.bytes;
    }

    /// The check this adds up to, timed from `started`.
    pub(crate) fn check(self, name: CheckName, started: Instant, summary: String) -> Check {
        let render = |(object, text): (String, String)| Failure {
            object,
            message: text,
        };
        Check {
            name,
            passed: self.findings.is_empty(),
            failures: self
                .findings
                .into_iter()
                .map(|(o, f)| render((o, gkq_format::error_chain(&f))))
                .collect(),
            notes: self
                .notes
                .into_iter()
                .map(|(o, n)| render((o, n.to_string())))
                .collect(),
            bytes: self.bytes,
            seconds: started.elapsed().as_secs_f64(),
            summary,
        }
    }
}

/// What the remote check found wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteFinding {
    /// A HEAD that failed.
    #[error("HEAD failed: {0}")]
    HeadFailed(#[source] StoreError),
    /// A HEAD answered with a redirect.
    #[error("HEAD answered a redirect (HTTP {status}) to {location}: publish the final URL")]
    HeadRedirect {
        /// The status.
        status: u16,
        /// Where to.
        location: String,
    },
    /// A HEAD answered with another status.
    #[error("HEAD answered HTTP {0}")]
    HeadStatus(u16),
    /// A HEAD without a Content-Length.
    #[error("HEAD has no Content-Length")]
    HeadNoLength,
    /// The wrong Content-Length.
    #[error("Content-Length is {found}, expected {expected}")]
    Length {
        /// What the server says.
        found: u64,
        /// The local length.
        expected: u64,
    },
    /// A server that ignores Range.
    #[error(
        "server ignored the Range header: HTTP 200 to bytes={start}-{end} (nodes would download all {total} bytes)"
    )]
    IgnoresRange {
        /// Range start.
        start: u64,
        /// Range end.
        end: u64,
        /// The object's length.
        total: u64,
    },
    /// A range answered with another status.
    #[error("GET bytes={start}-{end} answered HTTP {status}")]
    GetStatus {
        /// Range start.
        start: u64,
        /// Range end.
        end: u64,
        /// The status.
        status: u16,
    },
    /// The wrong Content-Range.
    #[error("Content-Range is {found:?}, expected {expected:?}")]
    ContentRange {
        /// The header received.
        found: String,
        /// The header expected.
        expected: String,
    },
    /// A body of the wrong length.
    #[error(transparent)]
    BodyLength(StoreError),
    /// A range GET that failed.
    #[error("GET bytes={start}-{end} failed: {error}")]
    GetFailed {
        /// Range start.
        start: u64,
        /// Range end.
        end: u64,
        /// Why.
        #[source]
        error: StoreError,
    },
    /// The published header is not the local one.
    #[error("remote header (bytes 0-{end}) differs from the local knot")]
    HeaderDiffers {
        /// The header's last byte.
        end: u64,
    },
    /// A rule of the format (the chunk table, a row's proof).
    #[error(transparent)]
    Format(#[from] gkq_format::Error),
    /// A row that fails its proof, with the proof object it came from.
    #[error("{error} (path record from {proof_url})")]
    RowProof {
        /// The failure.
        #[source]
        error: gkq_format::Error,
        /// The proof object's URL.
        proof_url: String,
    },
    /// A row's path record could not be fetched.
    #[error("{proof_url}: row {row}'s path record: {inner}")]
    Record {
        /// The proof object's URL.
        proof_url: String,
        /// The row.
        row: u64,
        /// What went wrong.
        inner: Box<RemoteFinding>,
    },
    /// A row's range was answered wrongly.
    #[error("row {row}: {inner}")]
    Row {
        /// The row.
        row: u64,
        /// What went wrong.
        inner: Box<RemoteFinding>,
    },
    /// A published row is not the local one.
    #[error("row {row} (bytes {start}-{end}) differs from the local row file")]
    RowDiffers {
        /// The row.
        row: u64,
        /// First byte.
        start: u64,
        /// Last byte.
        end: u64,
    },
    /// A published companion file whose digest is not the recorded one.
    #[error("sha256 is {found}, the knot records {recorded}")]
    Digest {
        /// The file's digest.
        found: String,
        /// What the knot records.
        recorded: String,
    },
}
