//! [`RangeRead`]: the one trait every backend implements (HTTP(S), S3, a
//! local file), after object_store's `ObjectStore`: a HEAD, a read of an
//! exact byte range into the caller's buffer, and a prefix read of unknown
//! length. Behaviour is added around it (parallel parts, verification) by
//! functions that take any `RangeRead`, never by `#[cfg]` branches.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

use crate::error::Result;
use crate::gate::{Connection, Gate};
use crate::range::check_read;

/// A boxed future: `RangeRead` is used as `dyn RangeRead`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a HEAD says about an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// Content-Length.
    pub len: u64,
    /// ETag, when sent.
    pub etag: Option<String>,
    /// `x-amz-meta-sha256`, when sent (objects published by r2-upload).
    pub sha256: Option<String>,
}

/// How one read goes out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// The object's length when known: the answer must agree.
    pub total: Option<u64>,
    /// The connection to use.
    pub connection: Connection,
}

/// A backend of byte-range reads.
///
/// Every read is strict: exactly the bytes asked for, or an error naming the
/// location and the range. Transient failures are retried inside, with the
/// store's policy; what comes out is final.
pub trait RangeRead: Send + Sync + Debug {
    /// The object's length (and ETag, `x-amz-meta-sha256` where there are).
    fn head<'a>(&'a self, location: &'a str) -> BoxFuture<'a, Result<Head>>;

    /// Fills `dest` with the bytes `start..start + dest.len()` of the object
    /// and returns the object's length. `dest` must not be empty.
    fn read_into<'a>(
        &'a self,
        location: &'a str,
        start: u64,
        dest: &'a mut [u8],
        opts: ReadOptions,
    ) -> BoxFuture<'a, Result<u64>>;

    /// The first `max` bytes of an object (all of it when it is shorter)
    /// and its length, in one request where the backend can.
    fn read_prefix<'a>(
        &'a self,
        location: &'a str,
        max: u64,
    ) -> BoxFuture<'a, Result<(Vec<u8>, u64)>>;

    /// The largest read into memory this backend accepts.
    fn max_read_bytes(&self) -> u64;

    /// Bytes `start..=end` of `location` failed the caller's verification
    /// (`reason`: the expected and received digest): a store with mirrors
    /// drops the ones that served them, and says whether it dropped any
    /// (then the bytes are worth fetching again from another source; the
    /// origin, never dropped, is the source of last resort). Nothing to
    /// do otherwise (`false`).
    fn distrust(&self, _location: &str, _range: (u64, u64), _reason: &str) -> bool {
        false
    }

    /// Whether bytes the origin served that fail their check are fetched
    /// once more ([`until_verified`](crate::until_verified)): yes, unless the store's
    /// [`RetryPolicy`](crate::RetryPolicy) makes one attempt only (a gate
    /// such as `gkq-verify --url` reports what it saw).
    fn refetches(&self) -> bool {
        true
    }

    /// The base URL of the source that served the read of `location` at
    /// `start`, when a store with mirrors spread it; `None` otherwise.
    fn served_by(&self, _location: &str, _start: u64) -> Option<String> {
        None
    }

    /// The gate of parts in flight that this backend's parallel reads share.
    fn gate(&self) -> &Gate;

    /// Whether requests are multiplexed on one connection (HTTP/2 seen), so
    /// that many can be in flight at little cost.
    fn multiplexed(&self) -> bool {
        false
    }

    /// Bytes `start..=end` in a new buffer, refused before anything is sent
    /// when the range is reversed or over [`RangeRead::max_read_bytes`].
    fn read_vec<'a>(
        &'a self,
        location: &'a str,
        start: u64,
        end: u64,
        opts: ReadOptions,
    ) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(async move {
            let len = check_read(location, start, end, self.max_read_bytes())?;
            let mut out = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
            self.read_into(location, start, &mut out, opts).await?;
            Ok(out)
        })
    }
}

/// The signature object next to the knot at `location` (FORMAT.md 7c,
/// `model.sig`), read in one request of at most `MAX_SIGNATURE_LEN`
/// bytes: its bytes and the object's whole length (longer than them when
/// it passes the limit, for the caller to refuse); `None` when the package
/// has none. The one read of a signature, for every reader.
pub async fn read_signature<R: RangeRead + ?Sized>(
    store: &R,
    location: &str,
) -> Result<Option<(Vec<u8>, u64)>> {
    use gkq_format::sig::{MAX_SIGNATURE_LEN, SIGNATURE_NAME};
    let url = crate::url::sibling(location, SIGNATURE_NAME);
    match store.read_prefix(&url, MAX_SIGNATURE_LEN).await {
        Ok(got) => Ok(Some(got)),
        Err(crate::StoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}
