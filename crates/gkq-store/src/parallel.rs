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
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use crate::config::Parallelism;
use crate::error::{BoxError, Result, StoreError};
use crate::range::{check_read, split_parts};
use crate::read::{Connection, RangeRead, ReadOptions};
use crate::stats::InFlight;
use gkq_format::hex;

/// A check of one part: `(offset in the range, bytes)`.
pub type PartFn = dyn Fn(u64, &[u8]) -> std::result::Result<(), BoxError> + Send + Sync;

/// How the bytes of a parallel read are verified before they are returned.
#[derive(Clone)]
pub enum ReadCheck {
    /// Not verified here (the caller checks the whole).
    None,
    /// The SHA-256 of the whole range must be this.
    Sha256([u8; 32]),
    /// Each part must pass `check`; parts are cut at multiples of `align`
    /// bytes of the range (the unit the check works on).
    Parts {
        /// The unit: part sizes are multiples of it.
        align: u64,
        /// The check.
        check: Arc<PartFn>,
    },
}

impl std::fmt::Debug for ReadCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadCheck::None => f.write_str("None"),
            ReadCheck::Sha256(d) => write!(f, "Sha256({})", hex(d)),
            ReadCheck::Parts { align, .. } => write!(f, "Parts {{ align: {align} }}"),
        }
    }
}

/// The parts in flight of every bulk read of one store, and the round robin
/// of their connections.
#[derive(Debug)]
pub struct Gate {
    permits: Semaphore,
    next: AtomicUsize,
    config: Parallelism,
    /// Parts reading now, and the most there have been at once.
    reading: InFlight,
}

impl Gate {
    /// A gate for `config.max_parallel` parts in flight.
    pub fn new(config: Parallelism) -> Gate {
        Gate {
            permits: Semaphore::new(config.max_parallel.max(1)),
            next: AtomicUsize::new(0),
            config,
            reading: InFlight::default(),
        }
    }

    /// The most parts that have been reading at once through this gate.
    pub fn peak_in_flight(&self) -> usize {
        self.reading.peak()
    }

    /// The settings.
    pub fn config(&self) -> Parallelism {
        self.config
    }

    fn next_connection(&self) -> Connection {
        Connection::Bulk(self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// The part size for a range under `check`: the configured size, rounded
/// down to a multiple of the check's unit (at least one unit).
fn part_size(config: Parallelism, check: &ReadCheck) -> u64 {
    let p = config.part_size.max(1);
    match check {
        ReadCheck::Parts { align, .. } if *align > 0 => (p / align).max(1) * align,
        _ => p,
    }
}

/// How many times bytes that fail their check are fetched again: once
/// when the origin (or a store without mirrors) served them; and each
/// time a mirror served them, that mirror is dropped and the bytes asked
/// of the next source, the origin last, up to this many mirrors.
pub const MAX_REFETCHES: usize = 64;

/// The attempt after a failed check: `true` to fetch again. A failure a
/// mirror served drops it (`dropped`) and is always worth another source;
/// one the origin served is retried once.
pub fn refetch(dropped: bool, origin_failures: &mut u32) -> bool {
    if dropped {
        return true;
    }
    *origin_failures += 1;
    *origin_failures < 2
}

/// One part: read (holding a permit of the gate), then checked on the
/// blocking pool (without the permit); a part that fails its check is
/// read and checked again ([`refetch`]).
async fn part<R: RangeRead + ?Sized>(
    backend: &R,
    gate: &Gate,
    url: &str,
    at: u64,
    (off, mut buf): (u64, BytesMut),
    total: Option<u64>,
    check: &ReadCheck,
) -> Result<(u64, BytesMut)> {
    let mut origin_failures = 0;
    for _ in 0..=MAX_REFETCHES {
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
            backend.read_into(url, at + off, &mut buf, opts).await?;
        }
        let ReadCheck::Parts { check, .. } = check else {
            return Ok((off, buf));
        };
        let c = check.clone();
        let (b, r) = tokio::task::spawn_blocking(move || {
            let r = c(off, &buf);
            (buf, r)
        })
        .await
        .map_err(|e| StoreError::Client(format!("part check task: {e}")))?;
        buf = b;
        let start = at + off;
        let end = start + buf.len() as u64 - 1;
        let source = match r {
            Ok(()) => return Ok((off, buf)),
            Err(source) => source,
        };
        let dropped = backend.distrust(url, (start, end), &source.to_string());
        if !refetch(dropped, &mut origin_failures) {
            return Err(StoreError::PartCheck {
                url: url.to_owned(),
                start,
                end,
                source,
            });
        }
        tracing::warn!(url, start, end, reason = %source, "a part failed verification: fetching it again");
    }
    Err(StoreError::Client(format!(
        "{url}: a part failed verification more than {MAX_REFETCHES} times"
    )))
}

/// Cuts `whole`, bytes `start..` of an object, into parts of `size` bytes
/// whose boundaries fall on multiples of `size` in the object (so that
/// every node asks a slice cache for the same ranges), as `(offset in the
/// range, part)`; the first part is shorter when `start` is not on a
/// boundary and the shorter part is still a multiple of `align` (the
/// check's unit), else every part is cut from `start`.
fn cut(mut whole: BytesMut, size: u64, start: u64, align: u64) -> Vec<(u64, BytesMut)> {
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
fn join(parts: impl IntoIterator<Item = BytesMut>) -> BytesMut {
    let mut it = parts.into_iter();
    let mut acc = it.next().unwrap_or_default();
    for p in it {
        acc.unsplit(p);
    }
    acc
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

/// Collects finished parts, feeding the in-order prefix to a hasher on the
/// blocking pool as it grows: the digest is ready when the last part is.
async fn hashed<S>(mut pending: S) -> Result<(BytesMut, [u8; 32])>
where
    S: futures_util::Stream<Item = Result<(u64, BytesMut)>> + Unpin,
{
    let (tx, rx) = std::sync::mpsc::channel::<BytesMut>();
    let hasher = tokio::task::spawn_blocking(move || {
        let mut h = Sha256::new();
        let mut acc: Vec<BytesMut> = Vec::new();
        for p in rx {
            h.update(&p);
            acc.push(p);
        }
        (join(acc), <[u8; 32]>::from(h.finalize()))
    });
    let mut waiting = BTreeMap::new();
    let mut next = 0u64;
    while let Some(done) = pending.next().await {
        let (off, buf) = done?;
        waiting.insert(off, buf);
        while let Some(buf) = waiting.remove(&next) {
            next += buf.len() as u64;
            // the hasher ends only when tx is dropped
            let _ = tx.send(buf);
        }
    }
    drop(tx);
    hasher
        .await
        .map_err(|e| StoreError::Client(format!("hasher task: {e}")))
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
/// parts under `gate`, and returns them once `check` passes.
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
    let size = part_size(gate.config, &check);
    let mut whole = BytesMut::zeroed(usize::try_from(len).unwrap_or(usize::MAX));
    let mut found = String::new();
    let mut origin_failures = 0;
    for round in 0..=MAX_REFETCHES {
        let align = match &check {
            ReadCheck::Parts { align, .. } => *align,
            _ => 1,
        };
        let pending: FuturesUnordered<_> = cut(whole, size, start, align)
            .into_iter()
            .map(|p| part(backend, gate, url, start, p, total, &check))
            .collect();
        let joined = match &check {
            ReadCheck::Sha256(want) => match hashed(pending).await? {
                (joined, d) if d != *want => {
                    found = hex(&d);
                    let why = format!("sha256 {found}, expected {}", hex(want));
                    let dropped = backend.distrust(url, (start, end), &why);
                    if !(backend.refetches() || dropped) || !refetch(dropped, &mut origin_failures)
                    {
                        break;
                    }
                    tracing::warn!(url, start, len, round, found = %found, "a range failed its sha256: fetching it again");
                    whole = joined;
                    continue;
                }
                (joined, _) => joined,
            },
            _ => collected(pending).await?,
        };
        let ms = t.elapsed().as_millis() as u64;
        tracing::debug!(url, start, len, ms, "parallel read verified");
        return Ok(joined.freeze());
    }
    let expected = match check {
        ReadCheck::Sha256(d) => hex(&d),
        _ => String::new(),
    };
    Err(StoreError::Digest {
        url: url.to_owned(),
        start,
        end,
        expected,
        found,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;
    use crate::local::LocalStore;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    }

    fn file(len: usize) -> (tempfile::TempDir, String, Vec<u8>) {
        let tmp = tempfile::tempdir().expect("tmp");
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let p = tmp.path().join("object");
        std::fs::write(&p, &data).expect("write");
        let loc = p.display().to_string();
        (tmp, loc, data)
    }

    fn local(max_read_bytes: u64) -> LocalStore {
        LocalStore::new(&crate::StoreConfig {
            max_read_bytes,
            ..Default::default()
        })
    }

    fn gate(part_size: u64) -> Gate {
        Gate::new(Parallelism {
            part_size,
            max_parallel: 3,
            connections: 2,
        })
    }

    /// Parts are cut from one allocation and joined again without a copy:
    /// the joined buffer is the very memory the parts were read into.
    #[test]
    fn parts_are_cut_from_one_buffer_and_joined_without_a_copy() {
        let whole = BytesMut::zeroed(100_003);
        let at = whole.as_ptr();
        let parts = cut(whole, 4096, 0, 1);
        assert_eq!(parts.len(), 25);
        assert!(parts.windows(2).all(|w| w[0].0 + 4096 == w[1].0));
        let joined = join(parts.into_iter().map(|p| p.1));
        assert_eq!((joined.as_ptr(), joined.len()), (at, 100_003));
    }

    /// Issue 32: part boundaries fall on multiples of the part size in the
    /// object, whatever the range's start, so that a slice cache sees the
    /// same ranges from every node; unless the check's unit forbids it.
    #[test]
    fn parts_are_aligned_to_the_object() {
        let offsets = |start: u64, align: u64| -> Vec<u64> {
            cut(BytesMut::zeroed(20_000), 4096, start, align)
                .iter()
                .map(|(o, _)| start + o)
                .collect()
        };
        assert_eq!(offsets(1000, 1), [1000, 4096, 8192, 12288, 16384, 20480]);
        assert_eq!(offsets(8192, 1), [8192, 12288, 16384, 20480, 24576]);
        // a unit of 1,000 bytes: 3,096 is not a multiple, cut from the start
        assert_eq!(offsets(1000, 1000)[1], 5096);
    }

    #[test]
    fn parts_are_read_and_the_digest_follows_them() {
        let (_t, loc, data) = file(100_003);
        let store = local(1 << 30);
        let want: [u8; 32] = Sha256::digest(&data[7..90_007]).into();
        let got = rt()
            .block_on(read_parts(
                &store,
                &gate(4096),
                &loc,
                (7, 90_000),
                None,
                ReadCheck::Sha256(want),
            ))
            .expect("verified");
        assert!(got[..] == data[7..90_007]);
        assert_eq!(part_size(gate(4096).config, &ReadCheck::None), 4096);
    }

    #[test]
    fn a_wrong_digest_returns_nothing_and_names_both() {
        let (_t, loc, _) = file(50_000);
        let store = local(1 << 30);
        let e = rt()
            .block_on(read_parts(
                &store,
                &gate(8192),
                &loc,
                (0, 50_000),
                None,
                ReadCheck::Sha256([7; 32]),
            ))
            .expect_err("mismatch");
        match &e {
            StoreError::Digest {
                start: 0,
                end: 49_999,
                expected,
                found,
                ..
            } => {
                assert_eq!(expected, &"07".repeat(32));
                assert_eq!(found.len(), 64);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parts_are_aligned_checked_and_a_failing_one_fetched_twice() {
        let (_t, loc, data) = file(10_000);
        let store = local(1 << 30);
        let seen = Arc::new(AtomicU64::new(0));
        let s = seen.clone();
        let check = ReadCheck::Parts {
            align: 1000,
            check: Arc::new(move |off, bytes: &[u8]| {
                assert!(off.is_multiple_of(1000) && bytes.len().is_multiple_of(1000));
                if off == 2000 {
                    s.fetch_add(1, Ordering::Relaxed);
                    return Err("chunk 2 does not hash to its root".into());
                }
                Ok(())
            }),
        };
        // part size 2500 rounds down to 2000: parts at 0, 2000, … 8000
        assert_eq!(part_size(gate(2500).config, &check), 2000);
        let e = rt()
            .block_on(read_parts(
                &store,
                &gate(2500),
                &loc,
                (0, 10_000),
                None,
                check,
            ))
            .expect_err("a bad part");
        assert!(
            matches!(
                e,
                StoreError::PartCheck {
                    start: 2000,
                    end: 3999,
                    ..
                }
            ),
            "{e:?}"
        );
        let ok = ReadCheck::Parts {
            align: 1000,
            check: Arc::new(|_, _: &[u8]| Ok(())),
        };
        let got = rt()
            .block_on(read_parts(&store, &gate(2500), &loc, (0, 10_000), None, ok))
            .expect("read");
        assert!(got[..] == data[..]);
        // the bad part was fetched and checked twice, then the read failed
        assert_eq!(seen.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn empty_and_oversized_ranges() {
        let (_t, loc, _) = file(10);
        let store = local(1 << 20);
        let empty: [u8; 32] = Sha256::digest([]).into();
        let rt = rt();
        let g = gate(4);
        let got = rt.block_on(read_parts(
            &store,
            &g,
            &loc,
            (3, 0),
            None,
            ReadCheck::Sha256(empty),
        ));
        assert_eq!(got.expect("empty").len(), 0);
        let e = rt.block_on(read_parts(
            &store,
            &g,
            &loc,
            (0, 2 << 20),
            None,
            ReadCheck::None,
        ));
        assert!(matches!(e, Err(StoreError::TooLarge { .. })), "{e:?}");
        let e = rt.block_on(read_parts(&store, &g, &loc, (5, 10), None, ReadCheck::None));
        assert!(
            matches!(e, Err(StoreError::PastEnd { len: 10, .. })),
            "short file: {e:?}"
        );
    }
}
