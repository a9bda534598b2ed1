//! The one loop of "fetch, check, distrust the source, fetch again": every
//! read whose bytes a caller checks (a part, a range's digest, a small
//! object, the reader's chunk tables, rows and warm objects, a knot header
//! under a trust policy) runs its attempts through [`until_verified`].
//!
//! Bytes that fail their check make the store distrust the sources that
//! served them ([`RangeRead::distrust`]: a mirror is dropped for the
//! session, with the evidence); then they are fetched again, from the next
//! source when a mirror served them (always worth it: a dropped mirror is
//! never asked again, so the origin is reached at last), and
//! [`Again::origin`] more times when the origin did. A store whose
//! [`RetryPolicy`](crate::RetryPolicy) makes one attempt (a gate that
//! reports what it saw) fetches again only away from a dropped mirror.

use crate::read::RangeRead;

/// How many times bytes are fetched again at most, whatever served them:
/// each time a mirror served them, that mirror is dropped and the next
/// source asked, the origin last.
pub const MAX_REFETCHES: usize = 64;

/// What an attempt of [`until_verified`] gave.
#[derive(Debug)]
pub enum Attempt<T, E, S = ()> {
    /// The bytes passed their check.
    Verified(T),
    /// Bytes failed their check: where they were read (each location with
    /// its inclusive byte range), why, the error to give when no more
    /// attempts are made, and what the next attempt starts from.
    Failed {
        /// The reads whose bytes failed.
        culprits: Vec<(String, (u64, u64))>,
        /// What was wrong (the expected and received digest).
        reason: String,
        /// The caller's error for these bytes.
        error: E,
        /// The state the next attempt is given (a buffer to read into again,
        /// the rows still to fetch).
        state: S,
    },
}

/// Which failures are fetched again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Again {
    /// Times bytes that the origin served are fetched again after failing
    /// (1 for bytes, which a transient fault may have damaged; 0 for a
    /// knot header or signature that a trust policy refused, which the
    /// origin serves as it is).
    pub origin: u32,
}

/// Bytes: one more fetch from the origin.
pub const BYTES: Again = Again { origin: 1 };
/// A header or signature the trust policy refused: none from the origin.
pub const TRUST: Again = Again { origin: 0 };

/// Runs `attempt` (given the state and the attempt's number, from 0)
/// until its bytes pass their check, fetching again as the module docs
/// say; an `Err` of `attempt` ends the loop at once (a failure of the
/// fetch itself, which the store's runner already retried). The state goes
/// from one attempt to the next by value (a buffer, the rows still to
/// fetch).
pub async fn until_verified<S, T, E, F, Fut>(
    store: &(impl RangeRead + ?Sized),
    again: Again,
    mut state: S,
    mut attempt: F,
) -> Result<T, E>
where
    F: FnMut(S, usize) -> Fut,
    Fut: Future<Output = Result<Attempt<T, E, S>, E>>,
{
    let mut origin_failures = 0u32;
    let mut n = 0;
    loop {
        let (culprits, reason, error) = match attempt(state, n).await? {
            Attempt::Verified(v) => return Ok(v),
            Attempt::Failed {
                culprits,
                reason,
                error,
                state: next,
            } => {
                state = next;
                (culprits, reason, error)
            }
        };
        // every culprit is distrusted, whatever the others were
        let dropped = culprits
            .iter()
            .fold(false, |d, (l, r)| store.distrust(l, *r, &reason) | d);
        let more = if dropped {
            true
        } else {
            origin_failures += 1;
            store.refetches() && origin_failures <= again.origin
        };
        if !more || n >= MAX_REFETCHES {
            return Err(error);
        }
        tracing::warn!(attempt = n, %reason, "bytes failed verification: fetching them again");
        n += 1;
    }
}
