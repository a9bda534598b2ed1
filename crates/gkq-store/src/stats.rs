//! Network counters shared by every backend of one store.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;

/// The live counters (cheap to bump from any task).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    payload_bytes: AtomicU64,
    http_bytes: AtomicU64,
    retries: AtomicU64,
    connections: AtomicU64,
    /// Set once a response came over HTTP/2.
    h2: AtomicBool,
}

/// A snapshot of the network counters of a store.
///
/// These are what the client sees: a proxy between the node and the server
/// (see `fixtures::servers::WireProxy`) is where TLS, framing and
/// compressed headers are counted as they cross the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NetStats {
    /// Requests sent (HEAD and GET, retries included; S3 calls too).
    pub requests: u64,
    /// Body bytes received.
    pub payload_bytes: u64,
    /// Body bytes plus response status lines and headers (as decoded: HTTP/2
    /// compresses headers on the wire; count at a proxy for wire bytes).
    pub http_bytes: u64,
    /// Requests that were retries.
    pub retries: u64,
    /// TCP connections opened (TLS included), for every origin.
    pub connections: u64,
}

impl NetStats {
    /// `self - earlier`.
    pub fn since(&self, earlier: &NetStats) -> NetStats {
        NetStats {
            requests: self.requests.saturating_sub(earlier.requests),
            payload_bytes: self.payload_bytes.saturating_sub(earlier.payload_bytes),
            http_bytes: self.http_bytes.saturating_sub(earlier.http_bytes),
            retries: self.retries.saturating_sub(earlier.retries),
            connections: self.connections.saturating_sub(earlier.connections),
        }
    }
}

impl Counters {
    pub(crate) fn snapshot(&self) -> NetStats {
        NetStats {
            requests: self.requests.load(Ordering::Relaxed),
            payload_bytes: self.payload_bytes.load(Ordering::Relaxed),
            http_bytes: self.http_bytes.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            connections: self.connections.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn request(&self, retry: bool) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if retry {
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Body bytes received.
    pub(crate) fn body(&self, n: u64) {
        self.payload_bytes.fetch_add(n, Ordering::Relaxed);
        self.http_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Status line and headers received.
    pub(crate) fn headers(&self, n: u64) {
        self.http_bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn connection(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn saw_h2(&self) {
        self.h2.store(true, Ordering::Relaxed);
    }

    pub(crate) fn multiplexed(&self) -> bool {
        self.h2.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_up_and_differences_never_underflow() {
        let c = Counters::default();
        c.request(false);
        c.request(true);
        c.body(10);
        c.headers(5);
        c.connection();
        let s = c.snapshot();
        assert_eq!(
            s,
            NetStats {
                requests: 2,
                payload_bytes: 10,
                http_bytes: 15,
                retries: 1,
                connections: 1
            }
        );
        assert_eq!(s.since(&s), NetStats::default());
        assert_eq!(NetStats::default().since(&s), NetStats::default());
        assert!(!c.multiplexed());
        c.saw_h2();
        assert!(c.multiplexed());
    }
}
