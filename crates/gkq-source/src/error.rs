use std::path::PathBuf;

/// `Result` with [`SourceError`].
pub type Result<T, E = SourceError> = std::result::Result<T, E>;

/// Everything wrong with a model directory. Each names the file and, where
/// there is one, the tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// `config.json` missing or unreadable.
    #[error("{path}: {reason}")]
    Config {
        /// The config path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file of the model directory is not a regular file, is longer than
    /// its limit, or cannot be read.
    #[error(transparent)]
    File(#[from] gkq_files::FileError),
    /// `config.json` is not JSON.
    #[error("{path}: invalid JSON")]
    ConfigJson {
        /// The config path.
        path: PathBuf,
        /// What the JSON parser found.
        #[source]
        source: serde_json::Error,
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
    /// The shard index is not JSON.
    #[error("{path}: invalid JSON")]
    IndexJson {
        /// The index path.
        path: PathBuf,
        /// What the JSON parser found.
        #[source]
        source: serde_json::Error,
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
    /// A GGUF file (or set of shards) that cannot be packed.
    #[error("{path}: {reason}")]
    Gguf {
        /// The file, or the directory.
        path: PathBuf,
        /// What is wrong (the key or tensor named).
        reason: String,
    },
    /// Not a valid safetensors file.
    #[error("{path}: corrupt safetensors file: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What safetensors reported, with the tensor where known.
        reason: String,
    },
    /// A safetensors header the `safetensors` crate refuses.
    #[error("{path}: corrupt safetensors file")]
    SafetensorsHeader {
        /// The file.
        path: PathBuf,
        /// What safetensors reported.
        #[source]
        source: safetensors::SafeTensorError,
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
    /// MODEL_DIR is a file.
    #[error(
        "{path} is a file, not a model directory (give the directory that holds config.json and the safetensors files, or a .gguf file)"
    )]
    NotADirectory {
        /// The path given.
        path: PathBuf,
    },
    /// A `.gguf` path that does not exist.
    #[error("{path}: no such GGUF file ({nearby})")]
    NoGgufFile {
        /// The path given.
        path: PathBuf,
        /// What its directory holds.
        nearby: String,
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
    /// I/O on a named file.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}

/// Attaches a path to an I/O error.
pub(crate) trait IoContext<T> {
    fn at(self, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|error| SourceError::Io {
            path: path.to_path_buf(),
            error,
        })
    }
}
