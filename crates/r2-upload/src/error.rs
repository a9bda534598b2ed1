use std::path::PathBuf;

/// `Result` with [`UploadError`].
pub type Result<T, E = UploadError> = std::result::Result<T, E>;

/// Why an upload did not happen or did not finish. Secrets never appear in
/// these messages.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UploadError {
    /// The output directory has no readable, valid knot.
    #[error("{path}: {reason}")]
    NoKnot {
        /// The knot path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The local package failed the gkq-verify checks: nothing was uploaded.
    #[error("refusing to upload {dir}: the local package fails verification:\n{}", failures.join("\n"))]
    LocalCheck {
        /// The output directory.
        dir: PathBuf,
        /// Each failure, as gkq-verify reports it.
        failures: Vec<String>,
    },
    /// The S3 client side (credentials, endpoint) and reads.
    #[error(transparent)]
    Store(#[from] gkq_store::StoreError),
    /// Bad option values.
    #[error("{0}")]
    Options(String),
    /// The bucket does not exist.
    #[error("bucket {bucket:?} does not exist at {endpoint}")]
    NoBucket {
        /// The bucket.
        bucket: String,
        /// The endpoint.
        endpoint: String,
    },
    /// The server refused the credentials or the token's permissions (HTTP 403).
    #[error(
        "access denied ({op} on bucket {bucket:?} at {endpoint}): check R2_ACCESS_KEY_ID/R2_SECRET_ACCESS_KEY and the token's bucket permissions"
    )]
    AccessDenied {
        /// The operation.
        op: &'static str,
        /// The endpoint.
        endpoint: String,
        /// The bucket.
        bucket: String,
    },
    /// No HTTP conversation with the endpoint (connection refused, DNS, TLS).
    #[error(
        "cannot reach {endpoint}: {reason} (check --endpoint or R2_ACCOUNT_ID, and the network)"
    )]
    Unreachable {
        /// The endpoint.
        endpoint: String,
        /// The innermost cause.
        reason: String,
    },
    /// Any other failed S3 call (server error, bad request...).
    #[error("{op} s3://{bucket}/{key} at {endpoint}: {message}")]
    S3 {
        /// The operation.
        op: &'static str,
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
        /// The endpoint.
        endpoint: String,
        /// The SDK error with its context (`DisplayErrorContext`).
        message: String,
    },
    /// The object the server holds after the upload is not the file sent.
    #[error("s3://{bucket}/{key}: after upload the server reports {found}, expected {expected}")]
    Mismatch {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
        /// Expected length/digest.
        expected: String,
        /// Reported length/digest.
        found: String,
    },
    /// Reading a local file.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The `--public-url` verification failed after publishing.
    #[error("published, but the checks against the public URL {url} failed:\n{}", failures.join("\n"))]
    PublicCheck {
        /// The public URL.
        url: String,
        /// Each failure.
        failures: Vec<String>,
    },
}
