//! A knot opened from a local path or a URL: the header by one range read
//! (or, with a pinned knot id, from the disk cache with no request at all);
//! blocks fetched on demand in parallel verified parts, each checked
//! against its sha256 before it is used, and kept in the disk cache by
//! that digest.

use std::path::Path;

use bytes::Bytes;
use gkq_format::{Block, Encoding, KnotHeader, KnotId, Prefix, hex, parse_prefix};
use gkq_store::{Check, RangeRead, Store, StoreError};
use sha2::{Digest, Sha256};

use crate::cache::{DiskCache, Kind, Size};
use crate::error::{ReaderError, Result};

/// The largest companion file the disk cache gives back (a tokenizer is a
/// few MB; the bound only keeps a stray file from being read whole).
const MAX_COMPANION: u64 = 1 << 30;

/// First range fetched from a remote knot when no earlier open of the URL
/// says how long its header is: 32 KiB, which most headers fit
/// (Qwen2.5-0.5B's is 32,079 B).
pub const FIRST_FETCH: u64 = 32 * 1024;

/// An opened knot.
pub struct KnotHandle {
    location: String,
    header: KnotHeader,
    remote: bool,
    /// Whether the header came from the disk cache (a pinned knot id).
    from_cache: bool,
    /// Bytes the opening read fetched past the header (`72 + header_len`).
    beyond_header: u64,
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
/// `model.knot`; a URL ending in `/` (a directory) is refused before any
/// request, with the URL to use.
pub(crate) fn knot_location(location: &str) -> Result<String> {
    if is_url(location) {
        gkq_store::url::refuse_credentials(location)?;
        let path = gkq_store::url::without_query(location);
        if path.ends_with('/') {
            return Err(ReaderError::DirectoryUrl {
                url: location.to_owned(),
                knot: format!("{path}{}", gkq_format::KNOT_NAME),
            });
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

/// The header of the knot at `location`, read with a first range of
/// `first` bytes and, when the header is longer, one more; with the bytes
/// read. The file's length must be the header's `file_len`.
async fn read_header(location: &str, store: &Store, first: u64) -> Result<(KnotHeader, Vec<u8>)> {
    let (mut all, total) = store.read_prefix(location, first).await?;
    let header = match complete_header(location, &all, total)? {
        Some(h) => h,
        None => {
            let need = match parse_prefix(&all) {
                Ok(Prefix::NeedBytes { total }) => total,
                _ => all.len() as u64,
            };
            let opts = gkq_store::ReadOptions {
                total: Some(total),
                ..Default::default()
            };
            let rest = store
                .read_vec(location, all.len() as u64, need - 1, opts)
                .await?;
            all.extend(rest);
            complete_header(location, &all, total)?.ok_or_else(|| {
                knot_err(
                    location,
                    gkq_format::Error::HeaderTruncated {
                        header_end: need,
                        available: all.len() as u64,
                    },
                )
            })?
        }
    };
    if header.preamble().file_len != total {
        return Err(knot_err(
            location,
            gkq_format::Error::FileSize {
                file_len: header.preamble().file_len,
                actual: total,
            },
        ));
    }
    Ok((header, all))
}

impl KnotHandle {
    /// Opens `location` (a path or a URL): the header from the cache when
    /// `pin` names a cached knot id, else by one range read (two when the
    /// header is longer than the first read).
    pub(crate) async fn open(
        location: &str,
        store: &Store,
        cache: Option<&DiskCache>,
        pin: Option<KnotId>,
    ) -> Result<KnotHandle> {
        let location = knot_location(location)?;
        let remote = is_url(&location);
        if let (true, Some(c), Some(id)) = (remote, cache, pin)
            && let Some(header) = pinned_header(c, id).await
        {
            tracing::info!(knot = %location, %id, "knot header from the disk cache (pinned id): no request");
            return Ok(KnotHandle {
                location,
                header,
                remote,
                from_cache: true,
                beyond_header: 0,
            });
        }
        let hint_key = hint_key(&location);
        let first = first_read(cache.filter(|_| remote), &hint_key).await;
        let (header, all) = read_header(&location, store, first).await?;
        let beyond = (all.len() as u64).saturating_sub(header.header_end());
        if let (true, Some(c)) = (remote, cache) {
            remember(c, &hint_key, &header, all).await;
        }
        tracing::info!(knot = %location, id = %hex(&header.preamble().header_sha256), blocks = header.header().blocks.len(), beyond_header = beyond, "knot opened");
        Ok(KnotHandle {
            location,
            header,
            remote,
            from_cache: false,
            beyond_header: if remote { beyond } else { 0 },
        })
    }

    /// `e`, a failed read of something this knot names (a digest or a
    /// length that is not the knot's), or, when the header came from the
    /// cache for a pinned id and the URL now serves a knot with another id,
    /// that: the URL serves another package.
    pub(crate) async fn another_knot(&self, store: &Store, e: ReaderError) -> ReaderError {
        if !self.from_cache {
            return e;
        }
        match read_header(&self.location, store, FIRST_FETCH).await {
            Ok((h, _)) if h.id() != self.id() => ReaderError::KnotId {
                location: self.location.clone(),
                expected: self.id().to_string(),
                found: h.id().to_string(),
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

    /// The payload of block `index` (following an alias): from the disk
    /// cache, or read in parallel parts; checked against its sha256 either way.
    pub(crate) async fn payload(
        &self,
        index: usize,
        store: &Store,
        cache: Option<&DiskCache>,
    ) -> Result<Bytes> {
        Ok(self.payload_net(index, store, cache).await?.0)
    }

    /// [`KnotHandle::payload`], and the bytes it moved over the network
    /// (0 from the disk cache or a local file).
    pub(crate) async fn payload_net(
        &self,
        index: usize,
        store: &Store,
        cache: Option<&DiskCache>,
    ) -> Result<(Bytes, u64)> {
        let name = self.data_block(index)?.name.clone();
        let p = self.header.payload_of(index).ok_or_else(|| {
            ReaderError::Missing(format!("{}: block {name:?} has no payload", self.location))
        })?;
        let cache = cache.filter(|_| self.remote);
        let key = hex(&p.sha256);
        if let Some(c) = cache {
            let want = p.sha256;
            let verify = move |b: &[u8]| <[u8; 32]>::from(Sha256::digest(b)) == want;
            if let Some(b) = c.get(Kind::Blob, &key, Size::Exact(p.len), verify).await {
                return Ok((b, 0));
            }
        }
        let t = std::time::Instant::now();
        let total = Some(self.header.preamble().file_len);
        let check = Check::Sha256(p.sha256);
        let bytes = store
            .read_checked(&self.location, p.offset, p.len, total, check)
            .await
            .map_err(|e| match e {
                StoreError::Digest {
                    start,
                    end,
                    expected,
                    found,
                    ..
                } => ReaderError::Digest {
                    what: format!(
                        "{}: block {name:?} (bytes {start}-{end}, fetched twice)",
                        self.location
                    ),
                    expected,
                    found,
                },
                e => e.into(),
            });
        let bytes = match bytes {
            Err(e) => return Err(self.another_knot(store, e).await),
            Ok(b) => b,
        };
        tracing::debug!(block = %name, bytes = p.len, ms = t.elapsed().as_millis() as u64, "block pulled and verified");
        if let Some(c) = cache {
            c.put(Kind::Blob, &key, bytes.clone()).await;
        }
        let net = if self.remote { p.len } else { 0 };
        Ok((bytes, net))
    }

    /// A companion file of the package (`package.files`, docs/FORMAT.md
    /// 3.1: `config.json`, `tokenizer.json`, …), next to the knot, read whole
    /// and checked against the digest the knot records before it is returned.
    pub(crate) async fn package_file(
        &self,
        name: &str,
        store: &Store,
        cache: Option<&DiskCache>,
    ) -> Result<Bytes> {
        let files = self.header.header().package_files();
        let Some(&(_, want)) = files.iter().find(|(f, _)| *f == name) else {
            let names: Vec<&str> = files.iter().map(|(f, _)| *f).collect();
            return Err(ReaderError::NoPackageFile {
                location: self.location.clone(),
                name: name.to_owned(),
                listed: names.join(", "),
            });
        };
        let mut digest = [0u8; 32];
        for (d, pair) in digest.iter_mut().zip(want.as_bytes().chunks(2)) {
            *d = std::str::from_utf8(pair)
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .unwrap_or(0);
        }
        let cache = cache.filter(|_| self.remote);
        if let Some(c) = cache {
            let verify = move |b: &[u8]| <[u8; 32]>::from(Sha256::digest(b)) == digest;
            if let Some(b) = c
                .get(Kind::Blob, want, Size::AtMost(MAX_COMPANION), verify)
                .await
            {
                return Ok(b);
            }
        }
        let at = self.sibling(name);
        let len = match store.head(&at).await {
            Ok(h) => h.len,
            Err(StoreError::Status { status: 404, .. }) => {
                return Err(ReaderError::PackageFileAbsent {
                    name: name.to_owned(),
                    location: at,
                });
            }
            Err(StoreError::Io { error, .. }) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(ReaderError::PackageFileAbsent {
                    name: name.to_owned(),
                    location: at,
                });
            }
            Err(e) => return Err(e.into()),
        };
        let bytes = store
            .read_checked(&at, 0, len, Some(len), Check::Sha256(digest))
            .await
            .map_err(|e| match e {
                StoreError::Digest {
                    expected, found, ..
                } => ReaderError::Digest {
                    what: at.clone(),
                    expected,
                    found,
                },
                e => e.into(),
            });
        let bytes = match bytes {
            Err(e) => return Err(self.another_knot(store, e).await),
            Ok(b) => b,
        };
        if let Some(c) = cache {
            c.put(Kind::Blob, want, bytes.clone()).await;
        }
        Ok(bytes)
    }

    /// The values of block `index` (following an alias) as dense bytes in
    /// the block's dtype: the payload of a dense block, or the
    /// reconstruction of a spectral block (docs/FORMAT.md section 5), never
    /// the raw factors read as rows.
    pub(crate) async fn dense_values(
        &self,
        index: usize,
        store: &Store,
        cache: Option<&DiskCache>,
    ) -> Result<Bytes> {
        Ok(self.dense_values_net(index, store, cache).await?.0)
    }

    /// [`KnotHandle::dense_values`], and the bytes moved over the network.
    pub(crate) async fn dense_values_net(
        &self,
        index: usize,
        store: &Store,
        cache: Option<&DiskCache>,
    ) -> Result<(Bytes, u64)> {
        let block = self.data_block(index)?.clone();
        let (bytes, net) = self.payload_net(index, store, cache).await?;
        let values = match block.encoding {
            Encoding::Spectral { .. } => {
                let location = self.location.clone();
                tokio::task::spawn_blocking(move || {
                    gkq_format::reconstruct_spectral(&block, &bytes)
                        .map(Bytes::from)
                        .map_err(|e| knot_err(&location, e))
                })
                .await
                .map_err(|source| ReaderError::Task {
                    what: "spectral reconstruction".into(),
                    source,
                })??
            }
            _ => bytes,
        };
        Ok((values, net))
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
        let e = knot_location("http://h/pkg/v1/").expect_err("directory URL");
        assert!(e.to_string().contains("http://h/pkg/v1/model.knot"), "{e}");
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
