use std::path::PathBuf;

/// `Result` with [`StoreError`].
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A boxed error, the cause carried by a failed check.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a read did not return the bytes asked for. Each names the URL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No usable answer after the retries (connection refused, DNS, TLS,
    /// timeouts, resets, 5xx, 429).
    #[error("{url}: {message} (after {attempts} attempts)")]
    Transport {
        /// The URL.
        url: String,
        /// The last failure, in words a user can act on.
        message: String,
        /// Attempts made.
        attempts: u32,
        /// Whether the last failure was a timeout.
        timeout: bool,
        /// Whether no HTTP conversation happened at all (no server, DNS, TLS).
        no_conversation: bool,
    },
    /// A read URL with credentials in it (`https://KEY:SECRET@host/…`),
    /// refused before anything is sent; `url` shows them as `***`.
    #[error(
        "{url}: credentials in a URL are refused (they would be printed in errors, warnings and reports): publish to a public bucket URL, use a presigned URL (its query string is kept), or read s3:// URLs with R2_ACCESS_KEY_ID/R2_SECRET_ACCESS_KEY set"
    )]
    CredentialsInUrl {
        /// The URL, credentials replaced by `***`.
        url: String,
    },
    /// The origin failed after every mirror had been dropped.
    #[error("{origin} (after dropping every mirror: {})", dropped.join("; "))]
    AllSources {
        /// The origin's failure.
        origin: Box<StoreError>,
        /// Each mirror dropped, with its evidence.
        dropped: Vec<String>,
    },
    /// The object does not exist (HTTP 404, S3 `NoSuchKey`, no such file).
    #[error("{url}: not found ({how})")]
    NotFound {
        /// The URL or path.
        url: String,
        /// How the backend said it (`HTTP 404 for bytes=0-9`, `no such file`).
        how: String,
    },
    /// An answer without the object's length (a HEAD without
    /// Content-Length).
    #[error("{url}: {what} without Content-Length: the object's length is unknown")]
    NoLength {
        /// The URL.
        url: String,
        /// The request.
        what: &'static str,
    },
    /// An HTTP status other than the one the request needs.
    #[error("{url}: HTTP {status} for {what}{}", hint.as_deref().map(|h| format!(" ({h})")).unwrap_or_default())]
    Status {
        /// The URL.
        url: String,
        /// The status.
        status: u16,
        /// The request (`HEAD`, `bytes=a-b`).
        what: String,
        /// What the answer suggests, when the body or URL says it (the
        /// plain-HTTP-to-an-HTTPS-port page of nginx, a directory URL).
        hint: Option<String>,
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
    /// The server answered a Range request with the whole object.
    #[error(
        "{url}: the server ignored Range bytes={start}-{end} and answered HTTP 200 with the whole object (body not read); serve packages from a server that answers range requests with 206 (nginx, Caddy, an S3-compatible store; python3 -m http.server does not)"
    )]
    IgnoresRange {
        /// The URL.
        url: String,
        /// Range start.
        start: u64,
        /// Range end (inclusive).
        end: u64,
    },
    /// The object was replaced at its URL during the session: its ETag is
    /// not the one first seen (the `If-Range` answer was the whole new
    /// object, or a server that ignores If-Range sent a part of it).
    #[error(
        "{url}: the object changed at this URL during the session (ETag {was}, now {now}): a new version was published in place; refusing to mix the two"
    )]
    Changed {
        /// The URL.
        url: String,
        /// The ETag first seen.
        was: String,
        /// The ETag now.
        now: String,
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
    /// A range too large to hold in memory, refused before anything is
    /// allocated or fetched.
    #[error(
        "{url}: bytes={start}-{end} is {len} bytes, over the {cap}-byte limit for one read into memory"
    )]
    TooLarge {
        /// The URL.
        url: String,
        /// Range start.
        start: u64,
        /// Range end (inclusive).
        end: u64,
        /// Its length.
        len: u64,
        /// The limit.
        cap: u64,
    },
    /// An object whose length is not the one the caller knows it has (a
    /// local file that is short or long).
    #[error("{url}: the object is {found} bytes, expected {expected}")]
    ObjectLength {
        /// The URL or path.
        url: String,
        /// The length expected.
        expected: u64,
        /// Its length.
        found: u64,
    },
    /// A range that ends past the end of the object (a short file).
    #[error("{url}: bytes={start}-{end} end past the end of the object, which is {len} bytes")]
    PastEnd {
        /// The URL or path.
        url: String,
        /// Range start.
        start: u64,
        /// Range end (inclusive).
        end: u64,
        /// The object's length.
        len: u64,
    },
    /// An empty or reversed range (a zero-width row, a wrapped end).
    #[error("{url}: bytes={start}-{end} is not a range (end before start)")]
    EmptyRange {
        /// The URL.
        url: String,
        /// Range start.
        start: u64,
        /// Range end (inclusive).
        end: u64,
    },
    /// A CA file given with `--ca-cert` cannot be used.
    #[error("--ca-cert {}", path.display())]
    CaCert {
        /// The file.
        path: PathBuf,
        /// Why (the PEM reader's or rustls's error).
        #[source]
        source: BoxError,
    },
    /// No credentials found.
    #[error("no credentials: set R2_ACCESS_KEY_ID and R2_SECRET_ACCESS_KEY (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with a credentials file){}", detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Credentials {
        /// What the credential chain said, if anything.
        detail: Option<String>,
    },
    /// No endpoint given.
    #[error(
        "no endpoint: set R2_ACCOUNT_ID (endpoint https://<account>.r2.cloudflarestorage.com) or pass --endpoint URL"
    )]
    NoEndpoint,
    /// Bad option values (an `--endpoint` that is not a URL).
    #[error("{0}")]
    Options(String),
    /// Reading a local file.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The client could not be built (TLS configuration).
    #[error("HTTP client: {0}")]
    Client(String),
    /// A range read whole whose SHA-256 is not the one expected, on the
    /// first fetch and on the re-fetch: nothing of it is returned.
    #[error(
        "{url}: bytes {start}-{end} have sha256 {found}, expected {expected} (fetched twice; nothing of it is used)"
    )]
    Digest {
        /// The URL or path.
        url: String,
        /// Range start.
        start: u64,
        /// Range end (inclusive).
        end: u64,
        /// The digest expected.
        expected: String,
        /// The digest of the bytes received.
        found: String,
    },
    /// A part of a parallel read that failed its check (a Merkle chunk),
    /// on the first fetch and on the re-fetch: nothing of the read is returned.
    #[error("{url}: bytes {start}-{end} fail verification (fetched twice; nothing of it is used)")]
    PartCheck {
        /// The URL or path.
        url: String,
        /// Part start.
        start: u64,
        /// Part end (inclusive).
        end: u64,
        /// What the check found.
        #[source]
        source: BoxError,
    },
    /// A blocking call made from inside an async runtime, where it would
    /// block a worker thread (or panic, dropping a runtime there).
    #[error(
        "{call} was called from inside an async (tokio) runtime, where a blocking call would stall its worker: use {instead} there"
    )]
    InsideRuntime {
        /// The blocking call.
        call: &'static str,
        /// The async call to use instead.
        instead: &'static str,
    },
    /// The runtime of the blocking API could not be started.
    #[error("starting the I/O runtime")]
    Runtime(#[source] std::io::Error),
    /// An `s3://` URL in a build without the `s3` feature.
    #[error(
        "{url}: this program was built without the `s3` feature, so it cannot read s3:// URLs: `cargo xtask install` builds the tools with it (`--version` lists a build's features); or read the bucket's public https:// URL"
    )]
    NoS3 {
        /// The URL.
        url: String,
    },
}
