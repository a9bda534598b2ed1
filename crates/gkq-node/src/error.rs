//! The one error type of the node tools' library.

use std::path::PathBuf;

/// Why an export or a mirror failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Reading the knot failed.
    #[error(transparent)]
    Reader(#[from] gkq_reader::ReaderError),
    /// The GGUF cannot be laid out (or the package's metadata.gguf is bad).
    #[error(transparent)]
    Format(#[from] gkq_format::Error),
    /// Writing the file.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// A file refused before it is read.
    #[error(transparent)]
    File(#[from] gkq_files::FileError),
    /// A text, a tokenizer or a list of ids (`gkq-report`).
    #[error(transparent)]
    Text(#[from] gkq_text::TextError),
    /// A knot this export cannot turn into a GGUF.
    #[error("{0}")]
    Unsupported(String),
    /// A read of the package failed.
    #[error(transparent)]
    Store(#[from] gkq_store::StoreError),
    /// An object that is not the one the knot names.
    #[error("{url}: {reason}")]
    Object {
        /// The object's URL.
        url: String,
        /// What is wrong (the expected and received digest).
        reason: String,
    },
    /// The copy fails the release gate's checks.
    #[error("{}: the mirrored package fails verification:\n{}", dir.display(), failures.join("\n"))]
    Verify {
        /// The mirror directory.
        dir: PathBuf,
        /// One line per failure.
        failures: Vec<String>,
    },
}
