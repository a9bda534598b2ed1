use std::path::PathBuf;

/// A boxed error: the cause of a failure to read the knot.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with [`UploadError`].
pub type Result<T, E = UploadError> = std::result::Result<T, E>;

/// Why an upload did not happen or did not finish. Secrets never appear in
/// these messages.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UploadError {
    /// The output directory has no readable knot, or its checks could not run.
    #[error("{}", path.display())]
    NoKnot {
        /// The knot path.
        path: PathBuf,
        /// Why (an I/O error, the verifier's setup error).
        #[source]
        source: BoxError,
    },
    /// The knot does not parse.
    #[error("{}: not a valid knot", path.display())]
    BadKnot {
        /// The knot path.
        path: PathBuf,
        /// What the parser found.
        #[source]
        source: Box<gkq_format::Error>,
    },
    /// The local package failed the gkq-verify checks: nothing was uploaded.
    #[error("refusing to upload {dir}: the local package fails verification:\n{}", failures.join("\n"))]
    LocalCheck {
        /// The output directory.
        dir: PathBuf,
        /// Each failure, as gkq-verify reports it.
        failures: Vec<String>,
    },
    /// Reading a local file of the package.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The S3 side (credentials, endpoint, every S3 call), in `gkq-store`.
    #[error(transparent)]
    Store(#[from] gkq_store::StoreError),
    /// The `--public-url` verification failed after publishing.
    #[error("published, but the checks against the public URL {url} failed:\n{}", failures.join("\n"))]
    PublicCheck {
        /// The public URL.
        url: String,
        /// Each failure.
        failures: Vec<String>,
    },
}
