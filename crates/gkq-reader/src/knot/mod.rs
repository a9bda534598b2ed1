//! A knot opened from a local path or a URL: the header by one range read
//! (or, with a pinned knot id, from the disk cache with no request at all);
//! blocks fetched on demand in parallel verified parts, each checked
//! against its sha256 before it is used, and kept in the disk cache by
//! that digest.

use std::path::Path;

use bytes::Bytes;
use gkq_format::{Block, KnotHeader, KnotId, Prefix, hex, parse_prefix};
use gkq_store::RangeRead;
use sha2::{Digest, Sha256};

use crate::cache::{DiskCache, Kind, Size};
use crate::error::{ReaderError, Result};

mod objects;
mod trust;

pub use trust::Trusted;
pub(crate) use trust::{Policy, asked};

/// The first read of a knot (gkq-format's, for every reader).
pub use gkq_format::layout::FIRST_READ as FIRST_FETCH;

/// An opened knot.
pub struct KnotHandle {
    location: String,
    header: KnotHeader,
    remote: bool,
    /// Whether the header came from the disk cache (a pinned knot id).
    from_cache: bool,
    /// Bytes the opening read fetched past the header (`72 + header_len`).
    beyond_header: u64,
    /// Why the knot is trusted.
    trusted: Trusted,
    /// The base URL of the source that served the header, when mirrors
    /// spread header reads (trust that does not depend on the channel).
    header_from: Option<String>,
}

impl std::fmt::Debug for KnotHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KnotHandle")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

pub(crate) fn knot_err(location: &str, e: gkq_format::Error) -> ReaderError {
    ReaderError::Knot {
        location: location.to_owned(),
        error: Box::new(e),
    }
}

/// Whether `location` is a URL (`http://`, `https://`, `s3://`) rather than a path.
pub fn is_url(location: &str) -> bool {
    gkq_store::is_remote(location)
}

/// The knot a location names: a package directory is read as its
/// `model.knot`, a local one and a URL alike (`…/v1/` or `…/v1`, whose last
/// component has no `.`, as gkq-verify takes it), its query kept.
pub(crate) fn knot_location(location: &str) -> Result<String> {
    if is_url(location) {
        gkq_store::url::refuse_credentials(location)?;
        let path = gkq_store::url::without_query(location);
        let query = &location[path.len()..];
        let last = path.rsplit('/').next().unwrap_or_default();
        let host_only = path.split("://").nth(1).is_some_and(|r| !r.contains('/'));
        if path.ends_with('/') || (!last.contains('.') && !host_only) {
            let dir = path.trim_end_matches('/');
            return Ok(format!("{dir}/{}{query}", gkq_format::KNOT_NAME));
        }
        return Ok(location.to_owned());
    }
    let p = Path::new(location);
    if p.is_dir() {
        return Ok(p.join(gkq_format::KNOT_NAME).display().to_string());
    }
    Ok(location.to_owned())
}

/// Parses a full header, or says which rule it breaks.
fn complete_header(location: &str, bytes: &[u8], total: u64) -> Result<Option<KnotHeader>> {
    match parse_prefix(bytes).map_err(|e| knot_err(location, e))? {
        Prefix::Complete(h) => Ok(Some(*h)),
        Prefix::NeedBytes { total: need } if need > total => Err(knot_err(
            location,
            gkq_format::Error::HeaderTruncated {
                header_end: need,
                available: total,
            },
        )),
        Prefix::NeedBytes { .. } => Ok(None),
    }
}

/// The largest header entry: the preamble and a header of the largest size.
const MAX_HEADER_ENTRY: u64 = 72 + gkq_format::layout::MAX_HEADER_LEN;

/// The cached header of the pinned knot `id`, re-verified.
async fn pinned_header(c: &DiskCache, id: KnotId) -> Option<KnotHeader> {
    let check = move |b: &[u8]| matches!(parse_prefix(b), Ok(Prefix::Complete(h)) if h.id() == id);
    let size = Size::AtMost(MAX_HEADER_ENTRY);
    match parse_prefix(&c.get(Kind::Header, &id.to_string(), size, check).await?) {
        Ok(Prefix::Complete(h)) => Some(*h),
        _ => None,
    }
}

/// The hint entry of a knot URL: the SHA-256 of the URL without its query
/// string, so that presigned URLs of one object share one entry.
fn hint_key(location: &str) -> String {
    let bare = gkq_store::url::without_query(location);
    hex(&Sha256::digest(bare.as_bytes()))
}

/// How many bytes the first read of a knot asks for: the header length
/// last seen at this URL (the cache's hint), else a typical header
/// ([`FIRST_FETCH`]: Qwen2.5-0.5B's is 32,079 B).
async fn first_read(cache: Option<&DiskCache>, hint_key: &str) -> u64 {
    let hinted = match cache {
        Some(c) => c.get(Kind::Hint, hint_key, Size::Exact(8), |_| true).await,
        None => None,
    };
    hinted
        .and_then(|b| <[u8; 8]>::try_from(&b[..]).ok())
        .map(u64::from_le_bytes)
        .map_or(FIRST_FETCH, |len| {
            len.saturating_add(72).clamp(72, 16 << 20)
        })
}

/// Caches a header read from a URL (by knot id) and its length (the next
/// first read's size, by the URL's hash).
async fn remember(c: &DiskCache, hint_key: &str, header: &KnotHeader, mut bytes: Vec<u8>) {
    let len = header.preamble().header_len.to_le_bytes();
    c.put(Kind::Hint, hint_key, Bytes::copy_from_slice(&len))
        .await;
    bytes.truncate(usize::try_from(header.header_end()).unwrap_or(usize::MAX));
    let id = hex(&header.preamble().header_sha256);
    c.put(Kind::Header, &id, Bytes::from(bytes)).await;
}

/// The bytes of the header of the knot at `location` (preamble and header,
/// maybe more), read with a first range of `first` bytes and, when the
/// header is longer, one more; with the knot's id (checked against the
/// header checksum, no header field decoded yet) and the file's length.
async fn read_header(
    location: &str,
    store: &dyn RangeRead,
    first: u64,
) -> Result<(KnotId, Vec<u8>, u64)> {
    let (mut all, total) = store.read_prefix(location, first).await?;
    loop {
        let need = match gkq_format::prefix_id(&all).map_err(|e| knot_err(location, e))? {
            Ok(id) => return Ok((id, all, total)),
            Err(need) => need,
        };
        if need > total || (all.len() as u64) >= need {
            return Err(knot_err(
                location,
                gkq_format::Error::HeaderTruncated {
                    header_end: need,
                    available: total.min(all.len() as u64),
                },
            ));
        }
        let opts = gkq_store::ReadOptions {
            total: Some(total),
            ..Default::default()
        };
        let rest = store
            .read_vec(location, all.len() as u64, need - 1, opts)
            .await?;
        all.extend(rest);
    }
}

/// The header's bytes and the trust in them (see [`read_header`] and
/// [`Policy::check`]), with the source that served them when header reads
/// are spread over mirrors (a pinned id or trusted keys): a mirror whose
/// knot header (another id) or signature fails the policy is dropped for
/// the session and the next source asked; the origin's failure is the
/// error.
async fn trusted_header(
    location: &str,
    store: &dyn RangeRead,
    (cache, first): (Option<&DiskCache>, u64),
    policy: &Policy<'_>,
) -> Result<(KnotId, Vec<u8>, u64, Option<String>, Trusted)> {
    let origin = gkq_store::url::sibling(location, "");
    let origin = gkq_store::url::without_query(&origin).to_owned();
    let sig = sibling(location, gkq_format::sig::SIGNATURE_NAME);
    let (origin, sig) = (&origin, &sig);
    // a header or signature a mirror served that fails the policy drops the
    // mirror, and the next source is asked; the origin's is the error
    // (gkq-store's one loop, with no second try at the origin)
    gkq_store::until_verified(store, gkq_store::refetch::TRUST, (), |(), _| async move {
        let (id, all, total) = read_header(location, store, first).await?;
        let from = store.served_by(location, 0);
        let mirror = from.as_deref().filter(|b| b != origin);
        let e = match policy.check(location, id, store, (cache, mirror)).await {
            Ok(trusted) => return Ok(gkq_store::Attempt::Verified((id, all, total, from, trusted))),
            Err(e) => e,
        };
        // the object that failed
        let culprit = match &e {
            ReaderError::KnotId { .. } => location,
            ReaderError::Signature { .. } | ReaderError::Unsigned { .. } => sig.as_str(),
            _ => return Err(e),
        };
        let why = gkq_format::error_chain(&e);
        if let Some(base) = store.served_by(culprit, 0).filter(|b| b != origin) {
            tracing::warn!(object = %culprit, mirror = %base, reason = %why, "a mirror's knot header or signature fails the trust policy: dropped");
        }
        Ok(gkq_store::Attempt::Failed {
            culprits: vec![(culprit.to_owned(), (0, u64::MAX))],
            reason: why,
            error: e,
            state: (),
        })
    })
    .await
}

/// The header in `bytes`, decoded and validated; the file's length must be
/// its `file_len`.
fn decode_header(location: &str, bytes: &[u8], total: u64) -> Result<KnotHeader> {
    let header = complete_header(location, bytes, total)?.ok_or_else(|| {
        knot_err(
            location,
            gkq_format::Error::HeaderTruncated {
                header_end: total,
                available: bytes.len() as u64,
            },
        )
    })?;
    if header.preamble().file_len != total {
        return Err(knot_err(
            location,
            gkq_format::Error::FileSize {
                file_len: header.preamble().file_len,
                actual: total,
            },
        ));
    }
    Ok(header)
}

impl KnotHandle {
    /// Opens `location` (a path or a URL): the header from the cache when
    /// the policy pins a cached knot id, else by one range read (two when
    /// the header is longer than the first read); the policy is checked
    /// on the knot id before any other header field is decoded.
    pub(crate) async fn open(
        location: &str,
        store: &dyn RangeRead,
        cache: Option<&DiskCache>,
        policy: &Policy<'_>,
    ) -> Result<KnotHandle> {
        let location = knot_location(location)?;
        let remote = is_url(&location);
        if let (true, Some(c), Some(id)) = (remote, cache, policy.pin)
            && let Some(header) = pinned_header(c, id).await
        {
            tracing::info!(knot = %location, %id, "knot header from the disk cache (pinned id): no request");
            return Ok(KnotHandle {
                location,
                header,
                remote,
                from_cache: true,
                beyond_header: 0,
                trusted: Trusted::Pinned,
                header_from: None,
            });
        }
        let hint_key = hint_key(&location);
        let first = first_read(cache.filter(|_| remote), &hint_key).await;
        let (id, all, total, header_from, trusted) =
            trusted_header(&location, store, (cache.filter(|_| remote), first), policy).await?;
        let header = decode_header(&location, &all, total)?;
        let beyond = (all.len() as u64).saturating_sub(header.header_end());
        if let (true, Some(c)) = (remote, cache) {
            remember(c, &hint_key, &header, all).await;
        }
        tracing::info!(knot = %location, %id, blocks = header.header().blocks.len(), beyond_header = beyond, %trusted, "knot opened");
        Ok(KnotHandle {
            location,
            header,
            remote,
            from_cache: false,
            beyond_header: if remote { beyond } else { 0 },
            trusted,
            header_from,
        })
    }

    /// Why the knot is trusted.
    pub fn trusted(&self) -> &Trusted {
        &self.trusted
    }

    /// The base URL of the source that served the header: a mirror's, or
    /// the origin's, when header reads were spread over mirrors (a pinned
    /// id or a trust key: `ReaderConfig::mirrors`); `None` when the header
    /// came from the knot's own URL as always, or from the disk cache.
    pub fn header_from(&self) -> Option<&str> {
        self.header_from.as_deref()
    }

    /// `e`, a failed read of something this knot names (a digest or a
    /// length that is not the knot's), or, when the header came from the
    /// cache for a pinned id and the URL now serves a knot with another id,
    /// that: the URL serves another package.
    pub(crate) async fn another_knot(&self, store: &dyn RangeRead, e: ReaderError) -> ReaderError {
        if !self.from_cache {
            return e;
        }
        match read_header(&self.location, store, FIRST_FETCH).await {
            Ok((id, _, _)) if id != self.id() => ReaderError::KnotId {
                location: self.location.clone(),
                expected: self.id().to_string(),
                found: id.to_string(),
            },
            _ => e,
        }
    }

    /// Bytes the first read fetched beyond the header (`72 + header_len`):
    /// what sizing the read without knowing the header cost. 0 for a local
    /// knot or a header from the cache.
    pub fn beyond_header(&self) -> u64 {
        self.beyond_header
    }

    /// Path or URL.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The validated header.
    pub fn header(&self) -> &KnotHeader {
        &self.header
    }

    /// Whether the knot is remote.
    pub fn is_remote(&self) -> bool {
        self.remote
    }

    /// Whether the header came from the disk cache (no request was made).
    pub fn header_from_cache(&self) -> bool {
        self.from_cache
    }

    /// The knot id: hex of `header_sha256`.
    pub fn id(&self) -> KnotId {
        self.header.id()
    }

    /// The location of a file next to the knot (a row file, a companion file).
    pub fn sibling(&self, name: &str) -> String {
        sibling(&self.location, name)
    }

    /// Index of block `name`.
    pub fn index(&self, name: &str) -> Result<usize> {
        self.header.header().block_index(name).ok_or_else(|| {
            ReaderError::Missing(format!("{}: no block named {name:?}", self.location))
        })
    }

    /// The block holding the data of block `index` (an alias resolved).
    pub fn data_block(&self, index: usize) -> Result<&Block> {
        self.header.header().resolve(index).ok_or_else(|| {
            ReaderError::Missing(format!("{}: block {index} has no data", self.location))
        })
    }
}

pub(crate) use gkq_store::url::sibling;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_and_directory_locations() {
        assert_eq!(
            sibling("https://h/m/v1/model.knot?x=1", "config.json"),
            "https://h/m/v1/config.json?x=1"
        );
        assert_eq!(sibling("out/v1/model.knot", "a.rows"), "out/v1/a.rows");
        // a package's directory URL, with or without its slash (issue 58)
        for dir in ["http://h/pkg/v1/", "http://h/pkg/v1"] {
            assert_eq!(
                knot_location(dir).expect("dir"),
                "http://h/pkg/v1/model.knot"
            );
        }
        assert_eq!(
            knot_location("https://h/v1/?X-Amz-Signature=1").expect("query kept"),
            "https://h/v1/model.knot?X-Amz-Signature=1"
        );
        assert_eq!(
            knot_location("http://h/a/m.knot").expect("knot"),
            "http://h/a/m.knot"
        );
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().display().to_string();
        assert_eq!(
            knot_location(&dir).expect("dir"),
            tmp.path().join("model.knot").display().to_string()
        );
    }

    /// Issue 35, item 5: presigned URLs of one knot share one hint entry.
    #[test]
    fn hints_are_keyed_without_the_query_string() {
        let a = hint_key("https://h/m/v1/model.knot?X-Amz-Signature=1");
        assert_eq!(a, hint_key("https://h/m/v1/model.knot?X-Amz-Signature=2"));
        assert_eq!(a, hint_key("https://h/m/v1/model.knot"));
        assert_ne!(a, hint_key("https://h/m/v2/model.knot"));
        assert!(crate::cache::valid_key(&a));
    }
}
