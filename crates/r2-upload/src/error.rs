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
    /// A package file refused before it is read (not a regular file, a
    /// link, or longer than what is held in memory for it).
    #[error(transparent)]
    File(#[from] gkq_files::FileError),
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
    /// `model.sig` signs another knot (or none): nothing was uploaded.
    #[error("refusing to upload: {} signs {signed}, but the knot is {knot}: re-sign the package (gkq-sign) after packing it", path.display())]
    StaleSignature {
        /// The signature object.
        path: PathBuf,
        /// The knot's id.
        knot: String,
        /// What the signature names.
        signed: String,
    },
    /// `model.sig` names a package that is not the prefix:
    /// nodes would refuse it.
    #[error("refusing to upload: {}: the package is signed as {name:?}, but the prefix is {prefix:?}, so nodes asked for it by its URL would refuse the signature (a name is the whole path it is published under): upload under --prefix {name}, or sign again with gkq-sign --name {prefix}", path.display())]
    PackageName {
        /// The signature object.
        path: PathBuf,
        /// The name signed.
        name: String,
        /// The prefix asked for.
        prefix: String,
    },
    /// `model.sig` is not a signature object: nothing was uploaded.
    #[error("refusing to upload: {}: {source}", path.display())]
    BadSignature {
        /// The signature object.
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
    /// The S3 client's setup (credentials, endpoint), in `gkq-store`.
    #[error(transparent)]
    Store(#[from] gkq_store::StoreError),
    /// A package given by URL could not be copied (verified) for upload.
    #[error("cannot copy {url} for upload")]
    Mirror {
        /// The package's knot URL (credentials hidden).
        url: String,
        /// What the mirror found.
        #[source]
        source: Box<gkq_mirror::MirrorError>,
    },
    /// Bad option values (a part size over the limits).
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
    /// Published objects would be replaced by different content.
    #[error("refusing to replace {} published object(s) with different content at {endpoint} (a published prefix is immutable: caches keep serving the old bytes):\n  {}\npublish under a new prefix (e.g. .../v2), or pass --replace if you mean to replace them", conflicts.len(), conflicts.join("\n  "))]
    WouldReplace {
        /// The endpoint.
        endpoint: String,
        /// One line per object: key, published digest, local digest.
        conflicts: Vec<String>,
    },
    /// A file changed between the package check and the upload: the bytes
    /// read for sending are not the bytes the knot records. Nothing of it
    /// was published.
    #[error(
        "{path}: changed on disk since it was checked (now {found_bytes} bytes, sha256 {found}; the knot records {expected}): {object} was not published, nor the knot; repack or restore the file, then upload again"
    )]
    ChangedOnDisk {
        /// The local file.
        path: PathBuf,
        /// The object, `s3://bucket/key`.
        object: String,
        /// The digest the knot records.
        expected: String,
        /// The digest of the bytes read for sending.
        found: String,
        /// Their length.
        found_bytes: u64,
    },
    /// A conditional write (`If-None-Match: *`) found the key published by
    /// someone else during this upload, with other content.
    #[error(
        "s3://{bucket}/{key}: another upload published it while this one ran ({found}; this package has sha256 {expected}): this upload stops here and its knot is not published; publish under a new prefix"
    )]
    Raced {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
        /// This package's digest.
        expected: String,
        /// What the bucket holds now.
        found: String,
    },
    /// After the last object, the prefix does not hold exactly this
    /// package: another upload ran at the same time, or wrote in between.
    #[error(
        "s3://{bucket}/{prefix}: after publishing, the prefix does not hold this package alone (another upload to the same prefix ran at the same time?):\n  {}\nreaders of this prefix may see a mix of two packages: publish again under a new prefix", problems.join("\n  ")
    )]
    Mixed {
        /// The bucket.
        bucket: String,
        /// The prefix.
        prefix: String,
        /// One line per object that differs or should not be there.
        problems: Vec<String>,
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
