use std::path::PathBuf;

/// `Result` with [`ReaderError`].
pub type Result<T, E = ReaderError> = std::result::Result<T, E>;

/// Everything the reader can fail with; each names the URL, file, tensor or
/// token concerned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReaderError {
    /// A local file could not be read.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The knot is not valid.
    #[error("{location}: invalid knot: {error}")]
    Knot {
        /// Path or URL.
        location: String,
        /// What the format crate found.
        error: Box<gkq_format::Error>,
    },
    /// A transport failure (connection refused or reset, timeout) after retries.
    #[error("{url}: {message} (after {attempts} attempts)")]
    Transport {
        /// The URL.
        url: String,
        /// What happened.
        message: String,
        /// Attempts made.
        attempts: u32,
    },
    /// An unexpected HTTP status.
    #[error("{url}: HTTP {status} for {what}")]
    Status {
        /// The URL.
        url: String,
        /// The status.
        status: u16,
        /// The request (`HEAD`, `bytes=a-b`).
        what: String,
    },
    /// A redirect (not followed: published objects have one final URL).
    #[error("{url}: HTTP {status} redirect to {location:?}, not followed{}", if location.ends_with('/') { format!(": the URL names a directory; a knot URL ends with the file name, e.g. {}/model.knot", url.trim_end_matches('/')) } else { ": use the final URL".to_string() })]
    Redirect {
        /// The URL.
        url: String,
        /// The status.
        status: u16,
        /// The Location header.
        location: String,
    },
    /// `require_columnar` is set and the embedding would be read dense.
    #[error(
        "--require-columnar: the embedding would be read from the dense block ({bytes} bytes) instead of the row file: {reason}"
    )]
    ColumnarRequired {
        /// Why the columnar path was not taken.
        reason: String,
        /// What the dense fallback would download.
        bytes: u64,
    },
    /// The server answered a Range request with the whole object.
    #[error(
        "{url}: the server ignored Range bytes={start}-{end} and answered HTTP 200 with the whole object (body not read)"
    )]
    IgnoresRange {
        /// The URL.
        url: String,
        /// Range start.
        start: u64,
        /// Range end (inclusive).
        end: u64,
    },
    /// A 206 whose Content-Range is not the one asked for.
    #[error("{url}: Content-Range is {found:?}, expected {expected:?}")]
    ContentRange {
        /// The URL.
        url: String,
        /// Expected header.
        expected: String,
        /// Header received.
        found: String,
    },
    /// A body shorter or longer than the range.
    #[error("{url}: body for bytes={start}-{end} is {found} bytes, expected {expected}")]
    BodyLength {
        /// The URL.
        url: String,
        /// Range start.
        start: u64,
        /// Range end (inclusive).
        end: u64,
        /// Expected length.
        expected: u64,
        /// Received length.
        found: u64,
    },
    /// A token id past the vocabulary.
    #[error("token id {id} is out of range: the vocabulary has {vocab} rows (ids 0..{vocab})")]
    TokenOutOfRange {
        /// The id.
        id: u64,
        /// The vocabulary size.
        vocab: u64,
    },
    /// A tensor or role the knot does not have.
    #[error("{0}")]
    Missing(String),
    /// A role this node was not configured to serve.
    #[error("this reader does not serve the {0} role (see Roles)")]
    RoleNotServed(&'static str),
    /// Downloaded bytes whose digest is not the one recorded in the knot.
    #[error("{what}: sha256 is {found}, the knot records {expected}")]
    Digest {
        /// What was downloaded.
        what: String,
        /// Recorded digest.
        expected: String,
        /// Computed digest.
        found: String,
    },
    /// Shape or dtype problems in a computation.
    #[error("{0}")]
    Compute(String),
    /// A failure reported by another caller's fetch of the same rows.
    #[error("{0}")]
    Shared(String),
}

impl From<candle_core::Error> for ReaderError {
    fn from(e: candle_core::Error) -> Self {
        ReaderError::Compute(e.to_string())
    }
}
