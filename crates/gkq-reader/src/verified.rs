//! Verified fetch, in one place: an entry of the disk cache if it is there
//! and passes its check, else a fetch (which verifies what it returns),
//! then stored for the next time. Every cached object of the reader (block
//! payloads, row files pulled whole, companions, chunk tables) goes
//! through [`cached`].

use std::future::Future;

use bytes::Bytes;

use crate::cache::{DiskCache, Kind, Size};
use crate::error::Result;

/// Where an object lives in the disk cache.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry<'a> {
    /// What it is.
    pub(crate) kind: Kind,
    /// Its key (a digest).
    pub(crate) key: &'a str,
    /// The length it must have.
    pub(crate) size: Size,
}

/// The object at `entry` from `disk` when it is there and passes `check`;
/// else what `fetch` returns (already verified), which is then stored.
/// Without a disk cache, `fetch` alone.
pub(crate) async fn cached<F, Fut>(
    disk: Option<&DiskCache>,
    entry: Entry<'_>,
    check: impl FnOnce(&[u8]) -> bool + Send + 'static,
    fetch: F,
) -> Result<Bytes>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Bytes>>,
{
    if let Some(d) = disk
        && let Some(b) = d.get(entry.kind, entry.key, entry.size, check).await
    {
        return Ok(b);
    }
    let bytes = fetch().await?;
    if let Some(d) = disk {
        d.put(entry.kind, entry.key, bytes.clone()).await;
    }
    Ok(bytes)
}

/// A check that `bytes` hash to `want` (SHA-256).
pub(crate) fn sha256_is(want: [u8; 32]) -> impl FnOnce(&[u8]) -> bool + Send + 'static {
    use sha2::{Digest, Sha256};
    move |b: &[u8]| <[u8; 32]>::from(Sha256::digest(b)) == want
}
