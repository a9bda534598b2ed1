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
    /// The cache directory asked for (`--cache-dir`) cannot be used.
    #[error("cache directory {}: cannot be used ({error}); give --cache-dir a writable directory, or run without a cache with --no-cache", path.display())]
    CacheDir {
        /// The directory.
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
    /// A network read failed (transport, status, Range, Content-Range, body
    /// length, redirect): see [`gkq_store::StoreError`].
    #[error(transparent)]
    Store(#[from] gkq_store::StoreError),
    /// `require_columnar` is set and the embedding would be read dense.
    #[error(
        "--require-columnar: the dense block ({bytes} bytes) would be read instead of the row file: {reason}"
    )]
    ColumnarRequired {
        /// Why the columnar path was not taken.
        reason: String,
        /// What the dense fallback would download.
        bytes: u64,
    },
    /// The knot is not the one this node pinned.
    #[error(
        "{location}: knot id is {found}, but this node pins {expected}: refusing to use it (the URL now serves another model, or --knot-id is stale)"
    )]
    KnotId {
        /// Path or URL.
        location: String,
        /// The pinned id.
        expected: String,
        /// The knot's id.
        found: String,
    },
    /// A trust policy is set and the package has no signature object.
    #[error(
        "{url}: no signature object, and this node trusts only packages signed by {keys} (--trust-key): refusing the package (sign it with gkq-sign, or pin its --knot-id)"
    )]
    Unsigned {
        /// The signature object's URL or path.
        url: String,
        /// The trusted keys' fingerprints.
        keys: String,
    },
    /// A signature object that does not sign this knot with a trusted key.
    #[error("{url}: {error}: refusing the package")]
    Signature {
        /// The signature object's URL or path.
        url: String,
        /// The rule it breaks.
        error: Box<gkq_format::Error>,
    },
    /// A token id past the vocabulary.
    #[error("token id {} is out of range: the vocabulary has {} rows (ids 0 to {})", thousands(*id), thousands(*vocab), thousands(vocab.saturating_sub(1)))]
    TokenOutOfRange {
        /// The id.
        id: u64,
        /// The vocabulary size.
        vocab: u64,
    },
    /// A row source that cannot be what was meant (`--columnar-embed`
    /// naming a knot, `--warm` with `--dense`).
    #[error("{0}")]
    RowSource(String),
    /// A tensor or role the knot does not have.
    #[error("{0}")]
    Missing(String),
    /// A companion file the knot does not list.
    #[error("{location}: the knot lists no package file {name:?} (package.files: {listed})")]
    NoPackageFile {
        /// The knot.
        location: String,
        /// The file asked for.
        name: String,
        /// The files it lists.
        listed: String,
    },
    /// A companion file the knot lists but the server or directory lacks.
    #[error(
        "{location}: the package's {name} is missing (the knot lists it in package.files, so it was packed but not published or copied: upload the whole package directory)"
    )]
    PackageFileAbsent {
        /// The file.
        name: String,
        /// Where it was looked for.
        location: String,
    },
    /// The model has no output projection.
    #[error(
        "{location}: the model has no LM head (no role.lm_head in the knot): it is an encoder-only model, so it cannot serve the output role or generate tokens"
    )]
    NoLmHead {
        /// The knot.
        location: String,
    },
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
    /// Rows fetched by range failed their Merkle proof (FORMAT.md 7a), on
    /// the first fetch and on the retry: the server or a cache in between
    /// serves bytes the knot does not authenticate. No such row is returned.
    #[error("{url}: rows fail verification against the knot after a retry{via}")]
    Unverified {
        /// The row file URL.
        url: String,
        /// Where the failing bytes came from, as words: `" (rows and
        /// records from the runs object …)"`, `" (records from …)"`, or
        /// empty (the chunk table).
        via: String,
        /// The last failure: the Merkle check that refused the bytes, or
        /// the proof object's read.
        #[source]
        source: gkq_store::BoxError,
    },
    /// Shape or dtype problems in a computation.
    #[error("{0}")]
    Compute(String),
    /// A task of the reader's own (a spectral reconstruction, a block of a
    /// pull) panicked or was cancelled.
    #[error("{what}")]
    Task {
        /// The task.
        what: String,
        /// What tokio reported.
        #[source]
        source: tokio::task::JoinError,
    },
    /// A candle operation failed (the lm_head logits, `to_tensor`).
    #[cfg(feature = "candle")]
    #[error("candle")]
    Candle(#[from] candle_core::Error),
    /// A failure of a fetch of the same rows that another caller started:
    /// every caller waiting on it sees the same typed error.
    #[error(transparent)]
    Shared(std::sync::Arc<ReaderError>),
}

/// `50256` → `50,256`.
pub(crate) fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_ids_read_like_prose() {
        let e = ReaderError::TokenOutOfRange {
            id: 50257,
            vocab: 50257,
        };
        assert_eq!(
            e.to_string(),
            "token id 50,257 is out of range: the vocabulary has 50,257 rows (ids 0 to 50,256)"
        );
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(151936), "151,936");
    }
}
