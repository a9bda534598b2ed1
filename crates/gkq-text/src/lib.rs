//! Texts as a node sees them, for the tools that reason about which rows
//! sessions need (`gkq-report`, `gkq-pack --warm-corpus`):
//!
//! - [`Workload::load`]: a text file is one workload named by its stem; a
//!   `.txt` or `.md` file is one session, a `.jsonl` file one session per
//!   line, `{"text": …}` or `{"messages": [{"role", "content"}…]}`
//!   (joined as `role: content` lines); any other type is refused, naming
//!   these. A session is at most [`MAX_SESSION_BYTES`], and
//!   [`for_each_session`] streams a corpus one session at a time;
//! - [`Tokenizer`]: a package's tokenizer, from its `tokenizer.json` or
//!   from the GGUF metadata it was packed from, as a node tokenizes (ids
//!   equal llama.cpp's), with its chat template and what decodes ids back
//!   to text; one with more ids than the embedding has rows is refused;
//! - [`warm_set`]: the ids the most sessions need;
//! - [`parse_ids`]: a list of ids as people and tools write them.

use std::path::PathBuf;

mod ids;
#[cfg(feature = "tokenizer")]
mod tokenizer;
mod workload;

pub use ids::{WarmCounter, parse_ids, warm_set};
#[cfg(feature = "tokenizer")]
pub use tokenizer::{
    ChatMessage, MAX_RENDERED_BYTES, TEMPLATE_FUEL, TextStream, Tokenizer, gguf_tokenizer_keys,
};
pub use workload::{
    MAX_SESSION_BYTES, MAX_TOKENIZER_BYTES, MAX_WORKLOAD_BYTES, WORKLOAD_TYPES, Workload,
    for_each_session,
};

/// What went wrong with a text, a tokenizer or a list of ids.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TextError {
    /// A file could not be read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// A text file is not UTF-8.
    #[error("{}: not UTF-8 text ({error})", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Where it stops being UTF-8.
        #[source]
        error: std::string::FromUtf8Error,
    },
    /// A line of a `.jsonl` workload is not a session.
    #[error("{}:{line}: {reason}", path.display())]
    BadLine {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// Why.
        reason: String,
    },
    /// A workload without text.
    #[error("{}: an empty workload (no text)", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// No workload files at all.
    #[error("no texts were given")]
    NoTexts,
    /// A file of the package the tokenizer needs could not be read: the
    /// network, or a damaged package; not the tokenizer itself.
    #[error("{0}")]
    PackageRead(String),
    /// The tokenizer cannot be loaded or fails on a text.
    #[error("the tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template cannot be rendered (or the package has none).
    #[error("the chat template: {0}")]
    Template(String),
    /// The tokenizer has more ids than the embedding has rows.
    #[error(
        "the tokenizer has {ids} ids but the package's embedding has {rows} rows: not this package's tokenizer"
    )]
    TokenizerVocab {
        /// Ids of the tokenizer (added tokens included).
        ids: u64,
        /// Rows of the embedding.
        rows: u64,
    },
    /// A list of ids that does not parse.
    #[error("{0}")]
    BadIds(String),
    /// A file refused before it is read (not a regular file).
    #[error(transparent)]
    File(#[from] gkq_files::FileError),
    /// A file type that is not a workload.
    #[error("{}: {found} is not a workload: give {WORKLOAD_TYPES}", path.display())]
    FileType {
        /// The file.
        path: PathBuf,
        /// What it is.
        found: String,
    },
    /// A session longer than [`MAX_SESSION_BYTES`].
    #[error("{}{}: a session of {len} bytes, over the limit of {MAX_SESSION_BYTES} bytes (1 MiB) for one session: split the text into sessions, one per line of a .jsonl file", path.display(), line.map_or_else(String::new, |l| format!(":{l}")))]
    SessionTooLong {
        /// The file.
        path: PathBuf,
        /// The line of a `.jsonl` file.
        line: Option<usize>,
        /// The session's (or the line's) bytes.
        len: u64,
    },
    /// Workloads that together hold more than [`MAX_WORKLOAD_BYTES`].
    #[error("{}: the texts reach {len} bytes here, over the limit of {MAX_WORKLOAD_BYTES} bytes (256 MiB) that a report holds in memory: give fewer or shorter texts", path.display())]
    WorkloadTooLong {
        /// The file where the total passed the limit.
        path: PathBuf,
        /// The total so far.
        len: u64,
    },
}

/// `Result` with [`TextError`].
pub type Result<T, E = TextError> = std::result::Result<T, E>;
