use std::path::PathBuf;

/// `Result` with [`PackError`].
pub type Result<T, E = PackError> = std::result::Result<T, E>;

/// Everything that stops a pack. Each names the file and, where there is
/// one, the tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PackError {
    /// `config.json` missing or unreadable.
    #[error("{path}: {reason}")]
    Config {
        /// The config path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// No `model.safetensors` and no index.
    #[error("{dir}: no model.safetensors and no model.safetensors.index.json{hint}")]
    NoWeights {
        /// The model directory.
        dir: PathBuf,
        /// What to do, when another weight format is there.
        hint: String,
    },
    /// The shard index is unreadable.
    #[error("{path}: {reason}")]
    Index {
        /// The index path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A shard listed in the index is missing.
    #[error("{index}: shard {shard} is listed but {path} does not exist")]
    MissingShard {
        /// The index path.
        index: PathBuf,
        /// The shard file name.
        shard: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The index maps a tensor to a shard that lacks it.
    #[error("{index}: tensor {tensor:?} is mapped to {shard}, which does not contain it")]
    IndexTensorMissing {
        /// The index path.
        index: PathBuf,
        /// The tensor.
        tensor: String,
        /// The shard.
        shard: String,
    },
    /// Not a valid safetensors file.
    #[error("{path}: corrupt safetensors file: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What safetensors reported, with the tensor where known.
        reason: String,
    },
    /// A dtype GKQ v2 does not carry.
    #[error("{path}: tensor {tensor:?} has dtype {dtype}, which GKQ v2 does not carry")]
    UnsupportedDtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its safetensors dtype.
        dtype: String,
    },
    /// The same tensor in two shards.
    #[error("tensor {tensor:?} appears in both {first} and {second}")]
    DuplicateTensor {
        /// The tensor.
        tensor: String,
        /// First file.
        first: PathBuf,
        /// Second file.
        second: PathBuf,
    },
    /// Role detection failed.
    #[error("cannot decide which tensor is the {role}: {reason}; candidates (2-D, first dim = vocab_size {vocab}): {}; pass --{flag} NAME", if candidates.is_empty() { "none".to_string() } else { candidates.join(", ") })]
    RoleUndecided {
        /// `token embedding` or `lm_head`.
        role: &'static str,
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
    #[error("{path}: {role} tensor {tensor:?} has shape {shape:?}, expected 2-D [vocab, hidden]")]
    NotTwoD {
        /// The file.
        path: PathBuf,
        /// Role.
        role: &'static str,
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
    /// A narrowing cast that would turn a finite value into an infinity.
    #[error(
        "tensor {tensor:?}, row {row}, column {col}: value {value} rounds to infinity in {to} (pass --allow-lossy to accept infinities, or choose a wider --dtype)"
    )]
    CastOverflow {
        /// The tensor.
        tensor: String,
        /// Row.
        row: u64,
        /// Column.
        col: u64,
        /// The value.
        value: f32,
        /// Target dtype.
        to: String,
    },
    /// MODEL_DIR is a file.
    #[error(
        "{path} is a file, not a model directory (give the directory that holds config.json and the safetensors files)"
    )]
    NotADirectory {
        /// The path given.
        path: PathBuf,
    },
    /// MODEL_DIR does not exist and is not a hub id.
    #[error(
        "{path}: no such directory (MODEL_DIR is a directory with config.json and safetensors files, or ORG/NAME of a model in the local Hugging Face cache)"
    )]
    NoModelDir {
        /// The path given.
        path: PathBuf,
    },
    /// `ORG/NAME` is not in the local Hugging Face cache.
    #[error(
        "{id} is not in the Hugging Face cache {cache}: {reason}; gkq-pack does not download, so fetch it first (`huggingface-cli download {id}`) or give its directory"
    )]
    NotInHubCache {
        /// The model id.
        id: String,
        /// The cache looked in.
        cache: PathBuf,
        /// What was missing.
        reason: String,
    },
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
