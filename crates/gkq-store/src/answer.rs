//! What every backend checks of an answer to a range request, in one
//! place: the `Content-Range` it must carry (exactly the range asked for,
//! of an object of the length the caller knows), a body of exactly that
//! length, streamed into the caller's buffer as it arrives, and the
//! object's validator: the strong ETag first seen, which every later
//! answer must carry (HTTP sends it as `If-Range`, S3 as `If-Match`).

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::error::StoreError;
use crate::range::{Expect, parse_content_range};
use crate::retry::{Attempt, Transient};
use crate::stats::Counters;

/// The strong ETag first seen for each object (by URL without its query):
/// an answer with another one comes from another version of the object,
/// replaced at its URL meanwhile, and is [`StoreError::Changed`], never
/// mixed with the first version's bytes. Weak ETags (`W/`) say nothing of
/// the bytes and are ignored.
#[derive(Debug, Default)]
pub(crate) struct Validators(Mutex<std::collections::HashMap<String, String>>);

impl Validators {
    /// The validator recorded for `url`.
    pub(crate) fn get(&self, url: &str) -> Option<String> {
        let key = crate::url::without_query(url);
        crate::blocking::lock(&self.0).get(key).cloned()
    }

    /// Records `etag` for `url` the first time, else checks it is the one
    /// first seen.
    pub(crate) fn check(&self, url: &str, etag: Option<&str>) -> Result<(), StoreError> {
        let Some(now) = etag.filter(|e| !e.starts_with("W/")) else {
            return Ok(());
        };
        let key = crate::url::without_query(url).to_owned();
        let mut v = crate::blocking::lock(&self.0);
        match v.get(&key) {
            Some(was) if was != now => Err(StoreError::Changed {
                url: url.to_owned(),
                was: was.clone(),
                now: now.to_owned(),
            }),
            Some(_) => Ok(()),
            None => {
                v.insert(key, now.to_owned());
                Ok(())
            }
        }
    }
}

/// A `206` accepted the one way for every backend: its validator (the
/// ETag first seen), its `Content-Range` (see [`content_range`]), then its
/// body into `dest` (see [`fill`]); the end the body covers and the
/// object's length.
pub(crate) async fn accept(
    body: &mut impl Body,
    (url, (start, end), expect): (&str, (u64, u64), Expect),
    (validators, etag, cr): (&Validators, Option<&str>, &str),
    dest: &Mutex<&mut [u8]>,
    counted: (&Counters, &AtomicU64),
) -> Attempt<(u64, u64), StoreError> {
    if let Err(e) = validators.check(url, etag) {
        return Attempt::Fail(e);
    }
    let (end, total) = match content_range(url, cr, (start, end), expect) {
        Ok(v) => v,
        Err(e) => return Attempt::Fail(e),
    };
    match fill(body, url, (start, end), dest, counted).await {
        Attempt::Done(()) => Attempt::Done((end, total)),
        Attempt::Retry(f) => Attempt::Retry(f),
        Attempt::Fail(e) => Attempt::Fail(e),
    }
}

/// A body that arrives in chunks (a reqwest response, an S3 byte stream).
pub(crate) trait Body: Send {
    /// The next chunk; `Err` with the cause in words and whether it was a
    /// timeout.
    fn chunk(&mut self) -> impl Future<Output = Result<Option<Bytes>, (String, bool)>> + Send;
}

/// The end the body of a `206` covers and the object's length, from its
/// `Content-Range`, or why it is not the answer to `bytes=start-end`.
fn content_range(
    url: &str,
    cr: &str,
    (start, end): (u64, u64),
    expect: Expect,
) -> Result<(u64, u64), StoreError> {
    expect.check(cr, start, end).map_err(|expected| {
        match (expect, parse_content_range(cr)) {
            // the right range of an object of another length
            (Expect::Exact(Some(t)), Some((a, b, found))) if (a, b) == (start, end) => {
                StoreError::ObjectLength {
                    url: url.into(),
                    expected: t,
                    found,
                }
            }
            _ => StoreError::ContentRange {
                url: url.into(),
                expected,
                found: cr.to_owned(),
            },
        }
    })
}

/// Streams `body` (the answer for bytes `start..=end`) into the start of
/// `dest`, counting into `counters` and `got`: done when exactly those
/// bytes arrived; a longer body is final, a cut or short one is retried.
async fn fill(
    body: &mut impl Body,
    url: &str,
    (start, end): (u64, u64),
    dest: &Mutex<&mut [u8]>,
    (counters, got): (&Counters, &AtomicU64),
) -> Attempt<(), StoreError> {
    let want = end - start + 1;
    let length = |found| StoreError::BodyLength {
        url: url.into(),
        start,
        end,
        expected: want,
        found,
    };
    if (crate::blocking::lock(dest).len() as u64) < want {
        return Attempt::Fail(length(0));
    }
    let mut have = 0u64;
    loop {
        match body.chunk().await {
            Ok(Some(b)) => {
                let n = b.len() as u64;
                if have + n > want {
                    return Attempt::Fail(length(have + n));
                }
                let at = usize::try_from(have).unwrap_or(usize::MAX);
                if let Some(d) = crate::blocking::lock(dest).get_mut(at..at + b.len()) {
                    d.copy_from_slice(&b);
                }
                have += n;
                got.store(have, Ordering::Relaxed);
                counters.body(n);
            }
            Ok(None) if have == want => return Attempt::Done(()),
            Ok(None) => return Attempt::Retry(Transient::msg(length(have).to_string())),
            // a reset or a stall mid-body: retry the whole range
            Err((why, timeout)) => {
                return Attempt::Retry(Transient {
                    timeout,
                    ..Transient::msg(format!(
                        "reading bytes={start}-{end}: {why} after {have} of {want} bytes"
                    ))
                });
            }
        }
    }
}

/// A prefix read, HTTP and S3 alike: the first `max` bytes (at most `cap`)
/// asked for with `get` (a ranged read of `(0, end)` into the buffer,
/// answered as [`Expect::Prefix`], that returns the last byte sent and the
/// object's length), the buffer cut to what the object holds.
pub(crate) async fn read_prefix(
    location: &str,
    max: u64,
    cap: u64,
    get: impl AsyncFnOnce((u64, u64), &mut [u8]) -> crate::Result<(u64, u64)>,
) -> crate::Result<(Vec<u8>, u64)> {
    let end = crate::range::check_dest(location, 0, max, cap)?;
    let mut out = vec![0u8; usize::try_from(max).unwrap_or(usize::MAX)];
    let (got_end, total) = get((0, end), &mut out).await?;
    out.truncate(usize::try_from(got_end + 1).unwrap_or(usize::MAX));
    Ok((out, total))
}
