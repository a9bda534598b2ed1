use std::path::{Path, PathBuf};

/// Why the embedding and the lm_head are never spectral (FORMAT.md 5): the
/// measured failures of the proposal and of the LM-head router study.
pub(crate) const REFUSAL: &str = "the token embedding and the lm_head are never spectral: a rank-256 SVD of Qwen2.5-0.5B's embedding gave gibberish, and an SVD lm_head router reached recall@50 of only 11.7 % at rank 256; they are packed dense with columnar row files";

/// `Result` with [`PackError`].
pub type Result<T, E = PackError> = std::result::Result<T, E>;

/// Everything that stops a pack. Each names the file and, where there is
/// one, the tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PackError {
    /// Role detection failed.
    #[error("cannot decide which tensor is the {}: {reason}; candidates (2-D, first dim = vocab_size {vocab}): {}; pass --{flag} NAME", role.describe(), if candidates.is_empty() { "none".to_string() } else { candidates.join(", ") })]
    RoleUndecided {
        /// `token embedding` or `lm_head`.
        role: gkq_format::Role,
        /// Why.
        reason: String,
        /// vocab_size from config.
        vocab: u64,
        /// 2-D tensors with `vocab` rows.
        candidates: Vec<String>,
        /// The override flag.
        flag: &'static str,
    },
    /// An override names a tensor that is not there.
    #[error("--{flag} {name}: no such tensor in {dir}")]
    UnknownTensor {
        /// The flag.
        flag: &'static str,
        /// The name given.
        name: String,
        /// The model directory.
        dir: PathBuf,
    },
    /// The embedding or lm_head is not 2-D.
    #[error("{path}: {} tensor {tensor:?} has shape {shape:?}, expected 2-D [vocab, hidden]", role.describe())]
    NotTwoD {
        /// The file.
        path: PathBuf,
        /// Role.
        role: gkq_format::Role,
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// The embedding or lm_head has a zero dimension: no rows to publish.
    #[error("{path}: {} tensor {tensor:?} has shape {shape:?}: a zero dimension, so there are no rows to publish", role.describe())]
    EmptyRole {
        /// The file.
        path: PathBuf,
        /// Role.
        role: gkq_format::Role,
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// `vocab_size`/hidden size disagree with the tensor.
    #[error("{config}: {field} is {config_value} but tensor {tensor:?} has shape {shape:?}")]
    ShapeMismatch {
        /// The config path.
        config: PathBuf,
        /// Config field.
        field: &'static str,
        /// Its value.
        config_value: u64,
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// `tie_word_embeddings` is true but a differing lm_head is stored.
    #[error(
        "{config}: tie_word_embeddings is true but {lm_head:?} differs from {embed:?}; fix the config or pass --lm-head-tensor"
    )]
    TieConflict {
        /// The config path.
        config: PathBuf,
        /// Embedding tensor.
        embed: String,
        /// lm_head tensor.
        lm_head: String,
    },
    /// A tensor that cannot be cast to the requested dtype.
    #[error(
        "tensor {tensor:?} has dtype {from}, which cannot be cast to {to} (only f32/f16/bf16 are cast)"
    )]
    NotCastable {
        /// The tensor.
        tensor: String,
        /// Source dtype.
        from: String,
        /// Requested dtype.
        to: String,
    },
    /// A tensor of a block type asked in another type without
    /// `--allow-requantize`.
    #[error(
        "tensor {tensor:?} is already quantized ({from}): storing it as {to} quantizes it again, adding to its error (pass --allow-requantize to dequantize and quantize it, as llama-quantize does)"
    )]
    Requantize {
        /// The tensor.
        tensor: String,
        /// Its block type in the source.
        from: gkq_format::DType,
        /// The type asked for.
        to: gkq_format::DType,
    },
    /// A narrowing cast that would turn a finite value into an infinity.
    #[error(
        "{0}: value {v} rounds to infinity in {to} (pass --allow-lossy to accept infinities, or choose a wider --dtype)",
        v = .0.value,
        to = .0.to
    )]
    CastOverflow(BadValue),
    /// A tensor whose rows are not whole blocks of a type that has no
    /// fallback (the 32-value types).
    #[error(
        "tensor {tensor:?}: {cols} values per row are not a multiple of {per}, so it cannot be stored in {dtype}, which has no fallback (choose a K type, which falls back, or a float type)"
    )]
    QuantShape {
        /// The tensor.
        tensor: String,
        /// The type.
        dtype: gkq_format::DType,
        /// Values per row.
        cols: u64,
        /// Values per block.
        per: u64,
    },
    /// A tied model given two different role types.
    #[error(
        "tensor {tensor:?} is both the token embedding and the output (tied): --token-embedding-type {embedding} and --output-tensor-type {output} conflict; give one"
    )]
    TiedTypes {
        /// The tensor.
        tensor: String,
        /// `--token-embedding-type`.
        embedding: gkq_format::DType,
        /// `--output-tensor-type`.
        output: gkq_format::DType,
    },
    /// NaN or an infinity in a tensor being quantized.
    #[error(
        "{0}: the value is {v}, which {to} cannot hold (pass --allow-nonfinite to quantize it anyway)",
        v = .0.value,
        to = .0.to
    )]
    NonFinite(BadValue),
    /// The output directory is inside the model directory.
    #[error("--out {out} is inside the model directory {model}; choose a directory outside it")]
    OutInsideModel {
        /// The output directory.
        out: PathBuf,
        /// The model directory.
        model: PathBuf,
    },
    /// A source file changed while it was being packed.
    #[error("{path} changed while it was being packed; run again")]
    Changed {
        /// The file.
        path: PathBuf,
    },
    /// The output directory exists and `--force` was not given.
    #[error("{path} already exists (pass --force to replace its contents)")]
    OutDirExists {
        /// The directory.
        path: PathBuf,
    },
    /// `--spectral` or `--analyze` in a build without the `spectral` feature.
    #[error(
        "this gkq-pack was built without the `spectral` feature (no SVD): `cargo xtask install` or `cargo build -p gkq-pack` builds it with it (`gkq-pack --version` lists a build's features)"
    )]
    NoSpectral,
    /// A `--spectral` argument that does not parse.
    #[error("--spectral {arg}: {reason}")]
    SpectralSpec {
        /// The argument.
        arg: String,
        /// What is wrong.
        reason: String,
    },
    /// A `--spectral` pattern that matches the embedding or the lm_head.
    #[error(
        "--spectral {arg} matches {tensor:?}, the {}: refused; {}",
        role.describe(),
        REFUSAL
    )]
    SpectralRefused {
        /// The argument.
        arg: String,
        /// The tensor.
        tensor: String,
        /// `token embedding` or `lm_head`.
        role: gkq_format::Role,
    },
    /// A `--spectral` pattern that matches no tensor.
    #[error(
        "--spectral {arg} matches no tensor of the model (gkq-pack --analyze lists the 2-D tensors)"
    )]
    SpectralNoMatch {
        /// The argument.
        arg: String,
    },
    /// A tensor that cannot become the spectral block asked for.
    #[error("--spectral: tensor {tensor:?}: {reason}")]
    Spectral {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// The warm set cannot be made (`--warm-set`, `--warm-corpus`,
    /// `--warm-ids`): a bad size, a bad file, an id past the vocabulary, a
    /// corpus without a tokenizer.
    #[error("{0}")]
    Warm(String),
    /// `--dtype` list problem.
    #[error("--dtype: {0}")]
    Dtype(String),
    /// I/O on a named file.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// The knot writer refused its own output.
    #[error("{path}: {error}")]
    Format {
        /// The knot path.
        path: PathBuf,
        /// The error.
        error: Box<gkq_format::Error>,
    },
    /// The model directory (config, safetensors, the Hugging Face cache).
    #[error(transparent)]
    Source(#[from] gkq_source::SourceError),
    /// A file that is not a regular file, or longer than its limit.
    #[error(transparent)]
    File(#[from] gkq_files::FileError),
}

/// A gkq-format error while writing the knot at `path`.
pub(crate) fn format_err(path: &Path, source: gkq_format::Error) -> PackError {
    match source {
        gkq_format::Error::Io(error) => PackError::Io {
            path: path.to_owned(),
            error,
        },
        error => PackError::Format {
            path: path.to_owned(),
            error: Box::new(error),
        },
    }
}

/// A value a cast or a quantization cannot hold: where it is and what.
#[derive(Debug)]
pub struct BadValue {
    /// The tensor.
    pub tensor: String,
    /// Row.
    pub row: u64,
    /// Column.
    pub col: u64,
    /// The value.
    pub value: f32,
    /// The type asked for.
    pub to: gkq_format::DType,
}

impl BadValue {
    /// Value `idx` of `bytes` (rows of `cols` values in `dtype`, the first
    /// of them row `first_row` of `tensor`), headed for `to`.
    pub(crate) fn at(
        tensor: &str,
        (bytes, dtype): (&[u8], gkq_format::DType),
        (first_row, cols): (u64, u64),
        idx: u64,
        to: gkq_format::DType,
    ) -> BadValue {
        let size = dtype.itemsize() as usize;
        let i = idx as usize * size;
        let mut v = Vec::new();
        if let Some(b) = bytes.get(i..i + size) {
            gkq_format::decode_f32(b, dtype, &mut v);
        }
        BadValue {
            tensor: tensor.to_owned(),
            row: first_row + idx / cols.max(1),
            col: idx % cols.max(1),
            value: v.first().copied().unwrap_or(f32::NAN),
            to,
        }
    }
}

impl std::fmt::Display for BadValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (tensor, row, col) = (&self.tensor, self.row, self.col);
        write!(f, "tensor {tensor:?}, row {row}, column {col}")
    }
}

/// Attaches a path to an I/O error.
pub(crate) trait IoContext<T> {
    fn at(self, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|error| PackError::Io {
            path: path.to_path_buf(),
            error,
        })
    }
}
