//! The retry policy: which failures are worth another attempt, and how long
//! to wait before it (exponential backoff, or the server's `Retry-After`
//! when it sends one, within a cap). Pure, so it is tested on its own.

use std::time::Duration;

/// The longest wait before a retry, whatever `Retry-After` asks for: a node
/// that cannot start for minutes is better off failing with the reason.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// Attempts and backoff of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per request for transient failures (1 = no retry).
    pub attempts: u32,
    /// Wait before the second attempt; doubled after each failed attempt.
    pub backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 3,
            backoff: Duration::from_millis(50),
        }
    }
}

impl RetryPolicy {
    /// Attempts, at least one.
    pub fn attempts(&self) -> u32 {
        self.attempts.max(1)
    }

    /// The wait before attempt `n` (`n >= 1` is the first retry):
    /// `backoff × 2^(n-1)`, or what `Retry-After` asked for when that is
    /// longer, capped at [`MAX_WAIT`].
    pub fn wait(&self, n: u32, retry_after: Option<Duration>) -> Duration {
        let shift = n.saturating_sub(1).min(20);
        let backoff = self.backoff.saturating_mul(1u32 << shift);
        backoff.max(retry_after.unwrap_or_default()).min(MAX_WAIT)
    }
}

/// Whether an HTTP status is worth another attempt (`5xx`, `429`).
pub(crate) fn transient_status(status: u16) -> bool {
    status >= 500 || status == 429
}

/// A `Retry-After` header in delta-seconds (`Retry-After: 3`). An
/// HTTP-date is not used (clocks differ; the backoff applies instead).
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let p = RetryPolicy {
            attempts: 5,
            backoff: Duration::from_millis(50),
        };
        assert_eq!(p.wait(1, None), Duration::from_millis(50));
        assert_eq!(p.wait(2, None), Duration::from_millis(100));
        assert_eq!(p.wait(3, None), Duration::from_millis(200));
        assert_eq!(p.wait(40, None), MAX_WAIT);
    }

    #[test]
    fn retry_after_is_honoured_within_the_cap() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.wait(1, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        // never shorter than the backoff
        assert_eq!(
            p.wait(1, Some(Duration::from_millis(1))),
            Duration::from_millis(50)
        );
        assert_eq!(p.wait(1, Some(Duration::from_secs(3600))), MAX_WAIT);
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after(" 0 "), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn which_statuses_are_retried() {
        for s in [500, 502, 503, 504, 429] {
            assert!(transient_status(s), "{s}");
        }
        for s in [200, 206, 301, 400, 403, 404, 416] {
            assert!(!transient_status(s), "{s}");
        }
        assert_eq!(
            RetryPolicy {
                attempts: 0,
                ..RetryPolicy::default()
            }
            .attempts(),
            1
        );
    }
}
