//! Parallel verified reads of large ranges: one range is cut into parts
//! (8 MiB by default), up to `max_parallel` of them in flight at once under
//! a [`Gate`] shared by every read of a store, spread over several
//! connections. Each part is written straight into its place in the one
//! buffer of the range (split off a single allocation and joined again
//! without a copy), and retried alone by its backend on transient failures.
//!
//! Nothing is returned before it is verified ([`Check`]):
//! - `Sha256`: a thread hashes the parts in order as they complete, so the
//!   digest follows the download on another core; a mismatch re-fetches
//!   the whole range once (a digest cannot say which part was wrong), then
//!   fails naming the range and both digests;
//! - `Parts`: each part (aligned to the check's unit, e.g. a Merkle chunk of
//!   rows) is checked on the blocking pool as soon as it arrives; a part
//!   that fails is re-fetched once, then the read fails naming the part.

use std::collections::BTreeMap;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::future::{Either, select};
use futures_util::stream::FuturesUnordered;
use sha2::{Digest, Sha256};

use crate::error::{Result, StoreError};
use crate::gate::{Gate, Parallelism, ReadCheck};
use crate::range::{check_read, split_parts};
use crate::read::{BoxFuture, RangeRead, ReadOptions};
use crate::refetch::{Attempt, BYTES, until_verified};
use gkq_format::hex;

/// The part size for a range under `check`: the configured size, rounded
/// down to a multiple of the check's unit (at least one unit).
pub(crate) fn part_size(config: Parallelism, check: &ReadCheck) -> u64 {
    let p = config.part_size.max(1);
    match check {
        ReadCheck::Parts { align, .. } if *align > 0 => (p / align).max(1) * align,
        _ => p,
    }
}

/// One part: read (holding a permit of the gate), then checked on the
/// blocking pool (without the permit); a part that fails its check is
/// read and checked again ([`until_verified`]).
async fn part<R: RangeRead + ?Sized>(
    backend: &R,
    gate: &Gate,
    url: &str,
    at: u64,
    (off, buf): (u64, BytesMut),
    total: Option<u64>,
    check: &ReadCheck,
) -> Result<(u64, BytesMut)> {
    until_verified(backend, BYTES, buf, |mut b, _| async move {
        {
            let _permit = gate
                .permits
                .acquire()
                .await
                .map_err(|e| StoreError::Client(format!("part gate closed: {e}")))?;
            let opts = ReadOptions {
                total,
                connection: gate.next_connection(),
            };
            let _reading = gate.reading.enter();
            backend.read_into(url, at + off, &mut b, opts).await?;
        }
        let ReadCheck::Parts { check, .. } = check else {
            return Ok(Attempt::Verified((off, b)));
        };
        let c = check.clone();
        let (b, r) = tokio::task::spawn_blocking(move || {
            let r = c(off, &b);
            (b, r)
        })
        .await
        .map_err(|e| StoreError::Client(format!("part check task: {e}")))?;
        let (start, end) = (at + off, at + off + b.len() as u64 - 1);
        Ok(match r {
            Ok(()) => Attempt::Verified((off, b)),
            Err(source) => Attempt::Failed {
                culprits: vec![(url.to_owned(), (start, end))],
                reason: source.to_string(),
                error: StoreError::PartCheck {
                    url: url.to_owned(),
                    start,
                    end,
                    source,
                },
                state: b,
            },
        })
    })
    .await
}

/// Cuts `whole`, bytes `start..` of an object, into parts of `size` bytes
/// whose boundaries fall on multiples of `size` in the object (so that
/// every node asks a slice cache for the same ranges), as `(offset in the
/// range, part)`; the first part is shorter when `start` is not on a
/// boundary and the shorter part is still a multiple of `align` (the
/// check's unit), else every part is cut from `start`.
pub(crate) fn cut(mut whole: BytesMut, size: u64, start: u64, align: u64) -> Vec<(u64, BytesMut)> {
    let len = whole.len() as u64;
    let size = size.max(1);
    let head = (size - start % size) % size;
    let head = if head > 0 && head < len && (align <= 1 || head.is_multiple_of(align)) {
        head
    } else {
        0
    };
    let mut parts = if head > 0 {
        vec![(0, head)]
    } else {
        Vec::new()
    };
    parts.extend(
        split_parts(len - head, size)
            .into_iter()
            .map(|(o, n)| (o + head, n)),
    );
    parts
        .into_iter()
        .map(|(off, n)| {
            (
                off,
                whole.split_to(usize::try_from(n).unwrap_or(usize::MAX)),
            )
        })
        .collect()
}

/// Joins parts cut from one buffer back together, in order (no copy).
pub(crate) fn join(parts: impl IntoIterator<Item = BytesMut>) -> BytesMut {
    let mut it = parts.into_iter();
    let mut acc = it.next().unwrap_or_default();
    for p in it {
        acc.unsplit(p);
    }
    acc
}

/// Bytes `start..=end` of `url` whose SHA-256 is `found`, not `want`: the
/// failed attempt of [`until_verified`] (the range its culprit, both
/// digests in the reason and the error), and `state` for the next.
pub fn digest_mismatch<T, S>(
    url: &str,
    (start, end): (u64, u64),
    (want, found): (&[u8; 32], &[u8; 32]),
    state: S,
) -> Attempt<T, StoreError, S> {
    let (expected, found) = (hex(want), hex(found));
    Attempt::Failed {
        culprits: vec![(url.to_owned(), (start, end))],
        reason: format!("sha256 {found}, expected {expected}"),
        error: StoreError::Digest {
            url: url.to_owned(),
            start,
            end,
            expected,
            found,
        },
        state,
    }
}

/// A read of no bytes: nothing to fetch, but a digest is still checked.
fn empty_read(url: &str, start: u64, check: &ReadCheck) -> Result<Bytes> {
    let empty = <[u8; 32]>::from(Sha256::digest([]));
    match check {
        ReadCheck::Sha256(want) if *want != empty => Err(StoreError::Digest {
            url: url.to_owned(),
            start,
            end: start,
            expected: hex(want),
            found: hex(&empty),
        }),
        _ => Ok(Bytes::new()),
    }
}

/// A hash step on the blocking pool: the state and the parts it hashed.
type HashJob = tokio::task::JoinHandle<(Sha256, Vec<BytesMut>)>;

/// Hashes `batch` after what `h` holds, on the blocking pool: a short task
/// per batch, never a thread held while parts are still downloading (the
/// pool is bounded, and the parts' own reads need it).
fn hash_step(mut h: Sha256, batch: Vec<BytesMut>) -> HashJob {
    tokio::task::spawn_blocking(move || {
        for p in &batch {
            h.update(p);
        }
        (h, batch)
    })
}

/// Collects finished parts, hashing the in-order prefix on the blocking
/// pool as it grows, in steps: the digest is ready soon after the last
/// part is.
async fn hashed<S>(mut pending: S) -> Result<(BytesMut, [u8; 32])>
where
    S: futures_util::Stream<Item = Result<(u64, BytesMut)>> + Unpin,
{
    let task_err = |e: tokio::task::JoinError| StoreError::Client(format!("hasher task: {e}"));
    let (mut state, mut job): (Option<Sha256>, Option<HashJob>) = (Some(Sha256::new()), None);
    let (mut hashed, mut ready) = (Vec::new(), Vec::new());
    let (mut waiting, mut next, mut downloading) = (BTreeMap::new(), 0u64, true);
    loop {
        if job.is_none()
            && !ready.is_empty()
            && let Some(h) = state.take()
        {
            job = Some(hash_step(h, std::mem::take(&mut ready)));
        }
        // the next part, or the hash step's end, whichever comes first
        let event = match (downloading, job.as_mut()) {
            (false, None) => break,
            (false, Some(j)) => Either::Right(j.await),
            (true, None) => Either::Left(pending.next().await),
            (true, Some(j)) => match select(pending.next(), j).await {
                Either::Left((part, _)) => Either::Left(part),
                Either::Right((done, _)) => Either::Right(done),
            },
        };
        let finished = match event {
            Either::Left(part) => {
                place(
                    part,
                    &mut waiting,
                    (&mut next, &mut ready, &mut downloading),
                )?;
                None
            }
            Either::Right(done) => Some(done.map_err(task_err)?),
        };
        if let Some((h, batch)) = finished {
            state = Some(h);
            hashed.extend(batch);
            job = None;
        }
    }
    let h = state.expect("the hash state is back once no step runs");
    Ok((join(hashed), <[u8; 32]>::from(h.finalize())))
}

/// A finished part (or the end of them) into `waiting`, and the in-order
/// prefix that it completes into `ready`.
fn place(
    part: Option<Result<(u64, BytesMut)>>,
    waiting: &mut BTreeMap<u64, BytesMut>,
    (next, ready, downloading): (&mut u64, &mut Vec<BytesMut>, &mut bool),
) -> Result<()> {
    let Some(done) = part else {
        *downloading = false;
        return Ok(());
    };
    let (off, buf) = done?;
    waiting.insert(off, buf);
    while let Some(buf) = waiting.remove(next) {
        *next += buf.len() as u64;
        ready.push(buf);
    }
    Ok(())
}

/// Collects finished parts, in place.
async fn collected<S>(mut pending: S) -> Result<BytesMut>
where
    S: futures_util::Stream<Item = Result<(u64, BytesMut)>> + Unpin,
{
    let mut parts = BTreeMap::new();
    while let Some(done) = pending.next().await {
        let (off, buf) = done?;
        parts.insert(off, buf);
    }
    Ok(join(parts.into_values()))
}

/// Reads bytes `start..start + len` of `url` from `backend` in parallel
/// parts under `gate`, and returns them once `check` passes (a range whose
/// digest fails is read again whole: [`until_verified`]).
pub async fn read_parts<R: RangeRead + ?Sized>(
    backend: &R,
    gate: &Gate,
    url: &str,
    (start, len): (u64, u64),
    total: Option<u64>,
    check: ReadCheck,
) -> Result<Bytes> {
    if len == 0 {
        return empty_read(url, start, &check);
    }
    let end = start.saturating_add(len) - 1;
    check_read(url, start, end, backend.max_read_bytes())?;
    let t = Instant::now();
    let size = part_size(gate.config(), &check);
    let align = match &check {
        ReadCheck::Parts { align, .. } => *align,
        _ => 1,
    };
    let whole = BytesMut::zeroed(usize::try_from(len).unwrap_or(usize::MAX));
    let check = &check;
    let joined = until_verified(backend, BYTES, whole, |buf, _| async move {
        let pending: FuturesUnordered<_> = cut(buf, size, start, align)
            .into_iter()
            .map(|p| part(backend, gate, url, start, p, total, check))
            .collect();
        let ReadCheck::Sha256(want) = check else {
            return Ok(Attempt::Verified(collected(pending).await?));
        };
        let (joined, d) = hashed(pending).await?;
        if d == *want {
            return Ok(Attempt::Verified(joined));
        }
        Ok(digest_mismatch(url, (start, end), (want, &d), joined))
    })
    .await?;
    let ms = t.elapsed().as_millis() as u64;
    tracing::debug!(url, start, len, ms, "parallel read verified");
    Ok(joined.freeze())
}

/// [`read_parts`] as a method of every backend, under its own
/// [`RangeRead::gate`].
pub trait ReadChecked: RangeRead {
    /// Bytes `start..start + len` in parallel parts under
    /// [`RangeRead::gate`] (see [`read_parts`]), returned only once `check`
    /// passes.
    fn read_checked<'a>(
        &'a self,
        location: &'a str,
        (start, len): (u64, u64),
        total: Option<u64>,
        check: ReadCheck,
    ) -> BoxFuture<'a, Result<Bytes>> {
        Box::pin(read_parts(
            self,
            self.gate(),
            location,
            (start, len),
            total,
            check,
        ))
    }

    /// A small object whole, checked against its SHA-256: one GET of at
    /// most `probe` bytes (no HEAD first, on the connection small reads
    /// share), which is the whole object when it is no longer. A longer
    /// object is then read with [`ReadChecked::read_checked`], its length
    /// known. Bytes that fail the check are fetched again
    /// ([`until_verified`]); then the check's error.
    fn read_small_checked<'a>(
        &'a self,
        location: &'a str,
        probe: u64,
        sha256: [u8; 32],
    ) -> BoxFuture<'a, Result<Bytes>> {
        Box::pin(until_verified(self, BYTES, (), move |(), _| async move {
            let (head, total) = self.read_prefix(location, probe.max(1)).await?;
            if head.len() as u64 != total {
                let check = ReadCheck::Sha256(sha256);
                let whole = self.read_checked(location, (0, total), Some(total), check);
                return Ok(Attempt::Verified(whole.await?));
            }
            let found = <[u8; 32]>::from(Sha256::digest(&head));
            if found == sha256 {
                return Ok(Attempt::Verified(Bytes::from(head)));
            }
            let end = total.saturating_sub(1);
            Ok(digest_mismatch(location, (0, end), (&sha256, &found), ()))
        }))
    }
}

impl<R: RangeRead + ?Sized> ReadChecked for R {}
