//! Counters: the one definition of a set of `u64` counters ([`stats!`]),
//! the network counters of a store ([`NetStats`]), and [`Counted`], the
//! wrapper that counts what one user of a store moves (a role of a reader,
//! a check of the gate) around any [`RangeRead`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::Result;
use crate::gate::{Entered, Gate, InFlight};
use crate::read::{BoxFuture, Head, RangeRead, ReadOptions};

/// Declares a set of `u64` counters once: the snapshot struct (public
/// fields, `Serialize`, with `since` and `plus`), and with `live NAME` the
/// struct of atomics that tasks bump and that [`snapshot`] reads.
///
/// ```
/// gkq_store::stats! {
///     /// Counters of something.
///     pub struct Things live LiveThings {
///         /// Things seen.
///         pub seen,
///     }
/// }
/// let live = LiveThings::default();
/// gkq_store::bump(&live.seen, 2);
/// assert_eq!(live.snapshot().since(&Things::default()).seen, 2);
/// ```
///
/// [`snapshot`]: NetStats
#[macro_export]
macro_rules! stats {
    (
        $(#[$m:meta])*
        pub struct $snap:ident live $live:ident {
            $( $(#[$fm:meta])* pub $f:ident, )*
        }
    ) => {
        $crate::stats! {
            $(#[$m])*
            pub struct $snap {
                $( $(#[$fm])* pub $f, )*
            }
        }

        /// The live counters of
        #[doc = concat!("[`", stringify!($snap), "`]")]
        /// (cheap to bump from any task).
        #[derive(Debug, Default)]
        pub(crate) struct $live {
            $( pub(crate) $f: ::std::sync::atomic::AtomicU64, )*
        }

        #[allow(dead_code)]
        impl $live {
            /// What they hold now.
            pub(crate) fn snapshot(&self) -> $snap {
                $snap { $( $f: self.$f.load(::std::sync::atomic::Ordering::Relaxed), )* }
            }
        }
    };
    (
        $(#[$m:meta])*
        pub struct $snap:ident {
            $( $(#[$fm:meta])* pub $f:ident, )*
        }
    ) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ::serde::Serialize)]
        pub struct $snap {
            $( $(#[$fm])* pub $f: u64, )*
        }

        impl $snap {
            /// `self - earlier`, field by field (never below 0).
            pub fn since(&self, earlier: &$snap) -> $snap {
                $snap { $( $f: self.$f.saturating_sub(earlier.$f), )* }
            }

            /// `self + other`, field by field.
            pub fn plus(&self, other: &$snap) -> $snap {
                $snap { $( $f: self.$f.saturating_add(other.$f), )* }
            }
        }
    };
}

/// Adds `n` to a live counter.
pub fn bump(c: &std::sync::atomic::AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

stats! {
    /// A snapshot of the network counters of a store.
    ///
    /// These are what the client sees: a proxy between the node and the
    /// server (see `fixtures::servers::WireProxy`) is where TLS, framing and
    /// compressed headers are counted as they cross the wire.
    pub struct NetStats live NetCounters {
        /// Requests sent (HEAD and GET, retries included; S3 calls too).
        pub requests,
        /// Body bytes received.
        pub payload_bytes,
        /// Body bytes plus response status lines and headers (as decoded:
        /// HTTP/2 compresses headers on the wire; count at a proxy for wire bytes).
        pub http_bytes,
        /// Requests that were retries.
        pub retries,
        /// TCP connections opened (TLS included), for every origin.
        pub connections,
        /// Round trips of requests: each time a request was sent while none
        /// was in flight (requests sent together are one; each answer
        /// waited for before the next request is one more). Connection
        /// handshakes are counted apart (`connections`).
        pub round_trips,
    }
}

/// The live network counters of a backend, and whether HTTP/2 was seen.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) net: NetCounters,
    h2: AtomicBool,
    in_flight: InFlight,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> NetStats {
        self.net.snapshot()
    }

    /// One attempt of a request (`retry`: not the first), in flight until
    /// the guard is dropped; the first while none is in flight starts a
    /// round trip.
    pub(crate) fn begin(&self, retry: bool) -> Entered<'_> {
        bump(&self.net.requests, 1);
        if retry {
            bump(&self.net.retries, 1);
        }
        let (entered, first) = self.in_flight.enter();
        if first {
            bump(&self.net.round_trips, 1);
        }
        entered
    }

    /// Body bytes received.
    pub(crate) fn body(&self, n: u64) {
        bump(&self.net.payload_bytes, n);
        bump(&self.net.http_bytes, n);
    }

    /// Status line and headers received.
    pub(crate) fn headers(&self, n: u64) {
        bump(&self.net.http_bytes, n);
    }

    pub(crate) fn connection(&self) {
        bump(&self.net.connections, 1);
    }

    pub(crate) fn saw_h2(&self) {
        self.h2.store(true, Ordering::Relaxed);
    }

    pub(crate) fn multiplexed(&self) -> bool {
        self.h2.load(Ordering::Relaxed)
    }
}

stats! {
    /// What the reads through one [`Counted`] moved over the network.
    pub struct Moved live MovedCounters {
        /// Reads (a HEAD, a range, a part of a parallel read).
        pub reads,
        /// Bytes those reads returned.
        pub bytes,
    }
}

/// Counts the reads of remote objects (URLs, not local paths) made through
/// it and the bytes they returned, around any [`RangeRead`]: how a reader
/// tells what each role pulled without passing byte counts around.
#[derive(Debug)]
pub struct Counted<'a, R: RangeRead + ?Sized> {
    inner: &'a R,
    moved: Arc<MovedCounters>,
}

/// Where a [`Counted`] counts, shared by every `Counted` made from it.
#[derive(Clone, Debug, Default)]
pub struct Meter(Arc<MovedCounters>);

impl Meter {
    /// What was moved so far.
    pub fn moved(&self) -> Moved {
        self.0.snapshot()
    }

    /// `inner`, counting into this meter.
    pub fn around<'a, R: RangeRead + ?Sized>(&self, inner: &'a R) -> Counted<'a, R> {
        Counted {
            inner,
            moved: self.0.clone(),
        }
    }
}

impl<R: RangeRead + ?Sized> Counted<'_, R> {
    fn count(&self, location: &str, bytes: u64) {
        if crate::url::is_remote(location) {
            bump(&self.moved.reads, 1);
            bump(&self.moved.bytes, bytes);
        }
    }
}

impl<R: RangeRead + ?Sized> RangeRead for Counted<'_, R> {
    fn distrust(&self, location: &str, range: (u64, u64), reason: &str) -> bool {
        self.inner.distrust(location, range, reason)
    }

    fn served_by(&self, location: &str, start: u64) -> Option<String> {
        self.inner.served_by(location, start)
    }

    fn head<'a>(&'a self, location: &'a str) -> BoxFuture<'a, Result<Head>> {
        Box::pin(async move {
            let h = self.inner.head(location).await?;
            self.count(location, 0);
            Ok(h)
        })
    }

    fn read_into<'a>(
        &'a self,
        location: &'a str,
        start: u64,
        dest: &'a mut [u8],
        opts: ReadOptions,
    ) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let n = dest.len() as u64;
            let total = self.inner.read_into(location, start, dest, opts).await?;
            self.count(location, n);
            Ok(total)
        })
    }

    fn read_prefix<'a>(
        &'a self,
        location: &'a str,
        max: u64,
    ) -> BoxFuture<'a, Result<(Vec<u8>, u64)>> {
        Box::pin(async move {
            let got = self.inner.read_prefix(location, max).await?;
            self.count(location, got.0.len() as u64);
            Ok(got)
        })
    }

    fn max_read_bytes(&self) -> u64 {
        self.inner.max_read_bytes()
    }

    fn gate(&self) -> &Gate {
        self.inner.gate()
    }

    fn multiplexed(&self) -> bool {
        self.inner.multiplexed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_up_and_differences_never_underflow() {
        let c = Counters::default();
        // two requests in flight together, then a third after both: two
        // round trips
        let (a, b) = (c.begin(false), c.begin(true));
        drop((a, b));
        drop(c.begin(false));
        c.body(10);
        c.headers(5);
        c.connection();
        let s = c.snapshot();
        assert_eq!(
            s,
            NetStats {
                requests: 3,
                payload_bytes: 10,
                http_bytes: 15,
                retries: 1,
                connections: 1,
                round_trips: 2,
            }
        );
        assert_eq!(s.since(&s), NetStats::default());
        assert_eq!(NetStats::default().since(&s), NetStats::default());
        assert_eq!(s.plus(&s).requests, 6);
        assert!(!c.multiplexed());
        c.saw_h2();
        assert!(c.multiplexed());
    }
}
