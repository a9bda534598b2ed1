//! What [`crate::pack`] reports (the `--json` output): the knot, each row
//! file with its exactness and proof, the companion files, the casts.

use std::path::PathBuf;

use serde::Serialize;

use crate::spectral;

/// A file written, for the report.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FileReport {
    /// Path.
    pub path: PathBuf,
    /// Length.
    pub bytes: u64,
    /// Hex SHA-256.
    pub sha256: String,
}

/// The knot, for the report.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct KnotFile {
    /// Path.
    pub path: PathBuf,
    /// Length.
    pub bytes: u64,
}

/// A columnar row file, for the report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ColumnarReport {
    /// Block name.
    pub tensor: String,
    /// `token_embd` or `lm_head`.
    pub role: String,
    /// Row dtype.
    pub dtype: String,
    /// Path.
    pub path: PathBuf,
    /// Rows.
    pub rows: u64,
    /// Bytes per row.
    pub row_bytes: u64,
    /// Length.
    pub bytes: u64,
    /// Hex SHA-256.
    pub sha256: String,
    /// Largest `|source - row value|` over finite values: the loss of this
    /// row file against the source tensor (not against the knot's block).
    pub max_abs_error_vs_source: f64,
    /// `SOURCE_EXACT`: every value casts back to the source's bits.
    pub source_exact: bool,
    /// `BLOCK_EXACT`: every value casts to the block's dtype bit for bit, so
    /// a node may fetch these rows instead of the block's.
    pub block_exact: bool,
    /// Hex of the Merkle root over the rows (FORMAT.md 7a).
    pub merkle_root: String,
    /// The proof object next to the row file.
    pub proof: FileReport,
    /// `proof_height`: 32 × this many bytes of proof per row fetched.
    pub proof_height: u8,
    /// Its runs object (FORMAT.md 7b: each row followed by its record),
    /// when the proof height is 1 or more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs: Option<FileReport>,
    /// Its warm object (FORMAT.md 7d: the chunk table and the warm rows
    /// with their records), with a warm set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm: Option<FileReport>,
}

/// A companion file copied into the package, for the report.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CompanionReport {
    /// File name (the same in the model directory and the package).
    pub name: String,
    /// Path in the package.
    pub path: PathBuf,
    /// Length.
    pub bytes: u64,
    /// Hex SHA-256 (recorded in `package.sha256`).
    pub sha256: String,
}

/// A cast that was performed, for the report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CastSummary {
    /// Tensor.
    pub tensor: String,
    /// From dtype.
    pub from: String,
    /// To dtype.
    pub to: String,
    /// Largest absolute rounding error (0 for widening casts).
    pub max_abs_error: f64,
    /// Whether any finite value became infinite (only with `--allow-lossy`).
    pub overflowed: bool,
}

/// A block stored in another type than its tensor's (`--quant` and the
/// role types, or a fallback), for the report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct QuantReport {
    /// The tensor.
    pub tensor: String,
    /// The type it is stored in.
    pub dtype: String,
    /// Its payload's length.
    pub bytes: u64,
    /// Root mean square of `source - stored` (over finite values).
    pub rmse: f64,
    /// Largest `|source - stored|` (over finite values).
    pub max_abs_error: f64,
}

/// What [`crate::pack`] produced (the `--json` output).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PackReport {
    /// The knot id: hex of the preamble's `header_sha256`, which
    /// authenticates the header and through its digests every payload, row
    /// file and companion file. A node pins a model with it (`--knot-id`).
    pub knot_id: String,
    /// The knot. No whole-file digest is computed for it: the knot id
    /// (the header's digest, which records every payload's) authenticates
    /// it, and computing one would mean reading the knot again, since its
    /// header is written last.
    pub knot: KnotFile,
    /// The row files.
    pub columnar: Vec<ColumnarReport>,
    /// The companion files (config, tokenizer).
    pub companions: Vec<CompanionReport>,
    /// lm_head recorded as an alias of the embedding.
    pub tied: bool,
    /// Blocks in the knot.
    pub tensors: usize,
    /// Sum of the source file sizes.
    pub source_bytes: u64,
    /// Wall time.
    pub seconds: f64,
    /// Casts performed.
    pub casts: Vec<CastSummary>,
    /// The blocks stored in another type (`--quant`, the role types), with
    /// their figures (recorded in `quant.*` for the block types).
    pub quantized: Vec<QuantReport>,
    /// Tensors stored in another type than the one asked for, and why.
    pub fallbacks: Vec<crate::types::Fallback>,
    /// The spectral blocks (`--spectral`), with their recorded figures.
    pub spectral: Vec<spectral::SpectralReport>,
    /// `config.json` architecture.
    pub architecture: String,
    /// Embedding tensor name.
    pub token_embd: String,
    /// lm_head block name (`None`: the model has no output projection).
    pub lm_head: Option<String>,
    /// `source.model_id` recorded in the knot.
    pub model_id: Option<String>,
    /// `source.revision` recorded in the knot.
    pub revision: Option<String>,
    /// Peak resident set size of this process (Linux `VmHWM`), when known.
    pub peak_rss_bytes: Option<u64>,
    /// The warm set (`--warm-set`, `--warm-corpus`, `--warm-ids`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm: Option<WarmSetReport>,
    /// The replaced package's `model.sig`, which signed another knot, was
    /// removed: the package needs signing again.
    pub stale_signature: bool,
}

impl PackReport {
    /// The bytes of the package's files: the knot, each row file with its
    /// proof, runs and warm objects, and the companion files.
    pub fn package_bytes(&self) -> u64 {
        let objects = |c: &ColumnarReport| {
            let extra = [&c.runs, &c.warm].into_iter().flatten();
            c.bytes + c.proof.bytes + extra.map(|f| f.bytes).sum::<u64>()
        };
        self.knot.bytes
            + self.columnar.iter().map(objects).sum::<u64>()
            + self.companions.iter().map(|c| c.bytes).sum::<u64>()
    }
}

/// The warm set written, for the report.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct WarmSetReport {
    /// Rows in the set.
    pub rows: usize,
    /// Where they came from: `corpus` or `ids`.
    pub from: String,
    /// Sessions of the corpus (0 for a list of ids).
    pub sessions: usize,
}
