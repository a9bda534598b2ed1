//! Multi-source reads (`--mirror`): alternative base URLs that serve the
//! same package as the origin (a CDN, a regional mirror made with
//! gkq-mirror, a caching proxy). Every answer is verified by the caller as
//! before, so any source is safe to read from; what this module decides
//! is where each request goes:
//!
//! - requests for objects under the origin's base are spread round-robin
//!   over the origin and the live mirrors (the same object name under each
//!   mirror's base, without the origin's query string);
//! - a mirror that errors (status, timeout, a stall past the deadline, a
//!   wrong Content-Range, a 200 to a Range request), or whose bytes fail
//!   verification ([`Sources::distrust`]), is dropped for the session with
//!   its evidence, and the request goes to the next source; the origin is
//!   never dropped, and an origin failure names every mirror dropped;
//! - **hedging** ([`Hedge`], a field of the store's [`RetryPolicy`]: by
//!   default once 8 requests of a size class, under 1 MiB or bulk, have
//!   completed, a request still running after 3 × the median of the last
//!   256 of their times, at least 50 ms small, 200 ms bulk) is also sent to
//!   another live source; the first answer wins and the other is cancelled.
//!
//! Headers (`read_prefix`, `head`: the knot header, the signature, HEADs of
//! row files) go to the origin, unless the node's trust does not depend on
//! the channel (a pinned knot id, or a signature by a trusted key, which
//! are checked on whatever bytes arrive): then they are spread and fail
//! over like the rest ([`Sources::new`]'s `headers_anywhere`), so a site
//! whose origin is far or unreachable boots from its mirrors.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::blocking::lock;
use crate::error::StoreError;
use crate::retry::{Hedge, RetryPolicy};

/// Requests below this many bytes are timed apart from bulk parts.
const SMALL: usize = 1 << 20;
/// Completed requests kept per class for the percentile.
const WINDOW: usize = 256;
/// Entries kept of which source served which range (for `distrust`).
const SERVED_CAP: usize = 1 << 16;

/// One source and what it did.
#[derive(Debug)]
struct Source {
    base: String,
    dropped: Mutex<Option<String>>,
    requests: AtomicU64,
    bytes: AtomicU64,
    hedges_won: AtomicU64,
}

/// What a source did in this session.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SourceReport {
    /// Its base URL (the origin's: the directory of the knot).
    pub base: String,
    /// Whether it is the origin.
    pub origin: bool,
    /// Requests it answered.
    pub requests: u64,
    /// Bytes it served.
    pub bytes: u64,
    /// Hedged requests it won.
    pub hedges_won: u64,
    /// Why it was dropped, with the evidence (URL, range, what was wrong).
    pub dropped: Option<String>,
}

/// The origin and its mirrors (index 0 is the origin).
#[derive(Debug)]
pub struct Sources {
    sources: Vec<Source>,
    next: AtomicUsize,
    served: Mutex<HashMap<(String, u64), usize>>,
    times: Mutex<[Vec<Duration>; 2]>,
    headers_anywhere: bool,
    hedge: Hedge,
}

impl Sources {
    /// The origin's base (`https://host/pkg/v1/`) and mirror bases; with
    /// `headers_anywhere` (trust that does not depend on the channel),
    /// header reads are spread too; requests hedged as `policy` says.
    pub fn new(
        origin: &str,
        mirrors: &[String],
        headers_anywhere: bool,
        policy: &RetryPolicy,
    ) -> Sources {
        let base = |b: &str| {
            let b = crate::url::without_query(b);
            if b.ends_with('/') {
                b.to_owned()
            } else {
                format!("{b}/")
            }
        };
        let sources = std::iter::once(origin)
            .chain(mirrors.iter().map(String::as_str))
            .map(|b| Source {
                base: base(b),
                dropped: Mutex::new(None),
                requests: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                hedges_won: AtomicU64::new(0),
            })
            .collect();
        Sources {
            sources,
            next: AtomicUsize::new(0),
            served: Mutex::new(HashMap::new()),
            times: Mutex::new([Vec::new(), Vec::new()]),
            headers_anywhere,
            hedge: policy.hedge,
        }
    }

    /// Whether header reads may come from a mirror.
    pub(crate) fn headers_anywhere(&self) -> bool {
        self.headers_anywhere
    }

    /// The base URL of the source that served `location` at `start`.
    pub(crate) fn served_by(&self, location: &str, start: u64) -> Option<String> {
        let i = *lock(&self.served).get(&(location.to_owned(), start))?;
        self.sources.get(i).map(|s| s.base.clone())
    }

    /// The object name of `location` when it is under the origin's base.
    pub(crate) fn name_of<'a>(&self, location: &'a str) -> Option<&'a str> {
        let origin = &self.sources.first()?.base;
        let name = location.strip_prefix(origin.as_str())?;
        let name = name.split('?').next().unwrap_or(name);
        (!name.is_empty() && !name.contains('/')).then_some(name)
    }

    fn alive(&self, i: usize) -> bool {
        self.sources
            .get(i)
            .is_some_and(|s| lock(&s.dropped).is_none())
    }

    /// The next source for a request, round robin over the live ones.
    pub(crate) fn pick(&self) -> usize {
        let n = self.sources.len();
        for _ in 0..n {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % n;
            if self.alive(i) {
                return i;
            }
        }
        0
    }

    /// Another live source than `i`, for a hedge.
    pub(crate) fn other(&self, i: usize) -> Option<usize> {
        let n = self.sources.len();
        (1..n).map(|k| (i + k) % n).find(|&j| self.alive(j))
    }

    /// The URL of `name` at source `i` (`location` itself at the origin).
    pub(crate) fn url(&self, i: usize, name: &str, location: &str) -> String {
        match (i, self.sources.get(i)) {
            (0, _) | (_, None) => location.to_owned(),
            (_, Some(s)) => format!("{}{name}", s.base),
        }
    }

    /// How long a request of `len` bytes runs before it is hedged.
    pub(crate) fn hedge_after(&self, len: usize) -> Option<Duration> {
        let class = usize::from(len >= SMALL);
        let times = lock(&self.times);
        let t = times.get(class)?;
        if t.len() < self.hedge.min_samples.max(1) {
            return None;
        }
        let mut sorted = t.clone();
        sorted.sort_unstable();
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
        let floor = if class == 0 {
            self.hedge.floor.0
        } else {
            self.hedge.floor.1
        };
        Some(median.saturating_mul(self.hedge.median_times).max(floor))
    }

    /// Records a completed request of source `i`.
    pub(crate) fn done(
        &self,
        i: usize,
        (location, start, len): (&str, u64, usize),
        took: Duration,
        hedge: bool,
    ) {
        if let Some(s) = self.sources.get(i) {
            s.requests.fetch_add(1, Ordering::Relaxed);
            s.bytes.fetch_add(len as u64, Ordering::Relaxed);
            if hedge {
                s.hedges_won.fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut times = lock(&self.times);
        // a HEAD (no bytes) says nothing of how long a read takes
        if let Some(t) = times.get_mut(usize::from(len >= SMALL)).filter(|_| len > 0) {
            if t.len() >= WINDOW {
                t.remove(0);
            }
            t.push(took);
        }
        drop(times);
        let mut served = lock(&self.served);
        if served.len() >= SERVED_CAP {
            served.clear();
        }
        served.insert((location.to_owned(), start), i);
    }

    /// Drops source `i` (never the origin) with `evidence`.
    pub(crate) fn drop_source(&self, i: usize, evidence: String) {
        if i == 0 {
            return;
        }
        if let Some(s) = self.sources.get(i) {
            let mut d = lock(&s.dropped);
            if d.is_none() {
                tracing::warn!(mirror = %s.base, %evidence, "mirror dropped for this session");
                *d = Some(evidence);
            }
        }
    }

    /// The bytes `start..=end` of `location` failed verification: every
    /// mirror that served a request starting in that range is dropped,
    /// with `reason` (the expected and received digest). Whether a mirror
    /// served any of them, dropped now or already by another read that
    /// found it bad at the same time: either way the failure is not the
    /// origin's, and the next attempt goes to another source (a dropped
    /// mirror is never asked again, so the origin is reached at last).
    pub fn distrust(&self, location: &str, (start, end): (u64, u64), reason: &str) -> bool {
        let culprits: Vec<usize> = lock(&self.served)
            .iter()
            .filter(|((l, s), i)| l == location && (start..=end).contains(s) && **i != 0)
            .map(|(_, &i)| i)
            .collect();
        for &i in &culprits {
            let url = self
                .sources
                .get(i)
                .map(|s| s.base.clone())
                .unwrap_or_default();
            self.drop_source(
                i,
                format!("{url}: bytes {start}-{end} of {location} failed verification: {reason}"),
            );
        }
        !culprits.is_empty()
    }

    /// An origin failure, with every mirror dropped so far.
    pub(crate) fn failed(&self, e: StoreError) -> StoreError {
        let dropped: Vec<String> = self
            .sources
            .iter()
            .filter_map(|s| lock(&s.dropped).clone())
            .collect();
        if dropped.is_empty() {
            return e;
        }
        StoreError::AllSources {
            origin: Box::new(e),
            dropped,
        }
    }

    /// What each source did.
    pub fn report(&self) -> Vec<SourceReport> {
        self.sources
            .iter()
            .enumerate()
            .map(|(i, s)| SourceReport {
                base: s.base.clone(),
                origin: i == 0,
                requests: s.requests.load(Ordering::Relaxed),
                bytes: s.bytes.load(Ordering::Relaxed),
                hedges_won: s.hedges_won.load(Ordering::Relaxed),
                dropped: lock(&s.dropped).clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 57, J4: two reads find the same bad mirror at once; the one
    /// that comes second still blames the mirror, not the origin, so its
    /// retry is not counted against the origin (it failed "fetched twice"
    /// when a mirror dropped by another read counted as the origin's fault).
    #[test]
    fn a_mirror_dropped_by_another_read_is_still_the_culprit() {
        let s = Sources::new(
            "http://o/m/",
            &["http://a/m/".into(), "http://b/m/".into()],
            false,
            &RetryPolicy::default(),
        );
        let knot = "http://o/m/model.knot";
        s.done(1, (knot, 0, 10), Duration::from_millis(1), false);
        s.done(1, (knot, 100, 10), Duration::from_millis(1), false);
        s.done(0, (knot, 200, 10), Duration::from_millis(1), false);
        assert!(s.distrust(knot, (0, 9), "first read"), "mirror a dropped");
        assert!(
            s.distrust(knot, (100, 109), "second read"),
            "mirror a again: not the origin's failure"
        );
        assert!(!s.distrust(knot, (200, 209), "the origin's bytes"));
        let r = s.report();
        assert!(
            r[1].dropped
                .as_deref()
                .is_some_and(|d| d.contains("first read")),
            "{r:?}"
        );
        assert!(r[0].dropped.is_none() && r[2].dropped.is_none(), "{r:?}");
        assert!(
            (0..8).all(|_| s.pick() != 1),
            "a dropped mirror is never asked again"
        );
    }
}
