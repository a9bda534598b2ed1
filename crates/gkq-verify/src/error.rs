use std::path::PathBuf;

/// `Result` with [`VerifyError`].
pub type Result<T, E = VerifyError> = std::result::Result<T, E>;

/// Problems that stop verification before any check can run (exit status 2).
/// Everything found *by* a check is a [`crate::Failure`] instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The knot (or the directory holding it) cannot be opened.
    #[error("{path}: cannot open the knot: {error}")]
    OpenKnot {
        /// The path tried.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// `--source` is not a directory.
    #[error(
        "--source {path}: not a directory, nor ORG/NAME of a model in the local Hugging Face cache"
    )]
    SourceNotDir {
        /// The path given.
        path: PathBuf,
    },
    /// The `--url` server could not be reached (connection refused, DNS,
    /// TLS): the remote checks did not run.
    #[error("{url}: cannot reach the server, so the remote checks could not run: {reason}")]
    Unreachable {
        /// The URL tried.
        url: String,
        /// What happened.
        reason: String,
    },
    /// A published package (`gkq-verify URL`) could not be copied for the
    /// checks: its knot unreachable, an object that fails to download, a
    /// full temporary disk.
    #[error("{url}: cannot fetch the package for the checks: {error}")]
    Fetch {
        /// The URL (or temporary file) that failed.
        url: String,
        /// Why.
        error: String,
    },
    /// The HTTP client could not be set up (a bad `--ca-cert` file).
    #[error(transparent)]
    Client(gkq_store::StoreError),
    /// A `--url` that names the knot rather than the directory it is in.
    #[error(
        "--url {url} names the knot; --url takes the base URL the package's objects are under (the knot is BASE/model.knot, the rows BASE/NAME.rows): use --url {base}"
    )]
    KnotUrl {
        /// The URL given.
        url: String,
        /// The base URL it is under.
        base: String,
    },
    /// A `--url` that is not http(s).
    #[error("--url {url}: {reason}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// Why.
        reason: &'static str,
    },
    /// A `--trust-key` that cannot be read or is not a P-256 public key.
    #[error("--trust-key {error}")]
    TrustKey {
        /// Which file, and why.
        error: gkq_files::FileError,
    },
}
