//! The one retry and deadline runner of every request (HTTP ranges and
//! HEADs, S3 reads, the uploader's parts): the retry policy, which failures
//! are worth another attempt, how long to wait before it (exponential
//! backoff, or the server's `Retry-After` when it sends one, within a
//! cap), and a deadline on each attempt. The policy is pure, so it is
//! tested on its own.

use std::future::Future;
use std::time::Duration;

use crate::stats::Counters;

/// The longest wait before a retry, whatever `Retry-After` asks for: a node
/// that cannot start for minutes is better off failing with the reason.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// Attempts and backoff of one request, and when it is hedged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per request for transient failures (1 = no retry).
    pub attempts: u32,
    /// Wait before the second attempt; doubled after each failed attempt.
    pub backoff: Duration,
    /// When a request is also sent to another source (with `--mirror`).
    pub hedge: Hedge,
}

/// Hedged requests ("The Tail at Scale"): with mirrors, a request still
/// running after `median_times` × the median time of the last requests of
/// its size class (under 1 MiB, or bulk), once `min_samples` of them have
/// completed, is also sent to another live source; the first answer wins.
/// The median, not a high percentile: with one slow source of three, a
/// third of the samples are slow, and a percentile above them would never
/// fire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hedge {
    /// Completed requests of a class before hedging starts.
    pub min_samples: usize,
    /// The wait, in medians of the class.
    pub median_times: u32,
    /// The least wait: for a small request, and for a bulk one.
    pub floor: (Duration, Duration),
}

/// Hedging as the nodes do it: after 8 requests, at 3 × the median, at
/// least 50 ms (small) or 200 ms (bulk).
pub const HEDGE: Hedge = Hedge {
    min_samples: 8,
    median_times: 3,
    floor: (Duration::from_millis(50), Duration::from_millis(200)),
};

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 3,
            backoff: Duration::from_millis(50),
            hedge: HEDGE,
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

/// A failed attempt worth another (or, `permanent`, not), in words a user
/// can act on; the last one becomes the final error.
#[derive(Clone, Debug, Default)]
pub struct Transient {
    /// What happened.
    pub message: String,
    /// Whether it was a timeout.
    pub timeout: bool,
    /// No HTTP conversation at all (nothing listening, DNS, TLS).
    pub no_conversation: bool,
    /// Asking again would get the same answer (TLS trust, a plain port).
    pub permanent: bool,
    /// The server's `Retry-After`.
    pub retry_after: Option<Duration>,
}

impl Transient {
    /// A failure described by `message`, with nothing else known.
    pub fn msg(message: String) -> Transient {
        Transient {
            message,
            ..Transient::default()
        }
    }
}

/// What one attempt came to.
#[derive(Debug)]
pub enum Attempt<T, E> {
    /// The answer.
    Done(T),
    /// A failure worth another attempt (unless it is permanent).
    Retry(Transient),
    /// A failure that another attempt would repeat.
    Fail(E),
}

/// How a run of attempts ended without an answer.
#[derive(Debug)]
pub enum Outcome<E> {
    /// An attempt failed for good.
    Failed(E),
    /// Every attempt failed (or one for good, `permanent`): the last failure.
    Exhausted {
        /// The last failure.
        last: Transient,
        /// Attempts made.
        attempts: u32,
    },
}

/// One request: its policy, the deadline of each attempt, and where its
/// attempts are counted.
#[derive(Clone, Copy, Debug)]
pub struct Runner<'a> {
    /// Attempts and backoff.
    pub policy: RetryPolicy,
    /// How long one attempt may take, from send to its last byte.
    pub deadline: Duration,
    /// The request, for the retry warnings (`url`, `what`).
    pub what: (&'a str, &'a str),
    pub(crate) counters: Option<&'a Counters>,
}

impl<'a> Runner<'a> {
    /// A runner for a request on `url` (`what`: `bytes=a-b`, `HEAD`,
    /// `part 3`…) under `policy`, each attempt within `deadline`.
    pub fn new(policy: RetryPolicy, deadline: Duration, url: &'a str, what: &'a str) -> Runner<'a> {
        Runner {
            policy,
            deadline,
            what: (url, what),
            counters: None,
        }
    }

    pub(crate) fn counted(self, counters: &'a Counters) -> Runner<'a> {
        Runner {
            counters: Some(counters),
            ..self
        }
    }

    /// Runs `attempt` until it gives an answer or a final failure, or the
    /// attempts run out. An attempt that passes the deadline is dropped
    /// (its request cancelled) and counts as the failure `on_timeout`
    /// describes.
    pub async fn run<T, E, F, Fut>(
        &self,
        mut attempt: F,
        on_timeout: impl Fn() -> Transient,
    ) -> Result<T, Outcome<E>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Attempt<T, E>>,
    {
        let mut last = Transient::default();
        let (url, what) = self.what;
        for n in 0..self.policy.attempts() {
            if n > 0 {
                let wait = self.policy.wait(n, last.retry_after);
                if first_retry_of(url) {
                    tracing::warn!(url, what, attempt = n + 1, wait_ms = wait.as_millis() as u64, reason = %last.message, "retrying a request (further retries of this source are logged at debug)");
                } else {
                    tracing::debug!(url, what, attempt = n + 1, wait_ms = wait.as_millis() as u64, reason = %last.message, "retrying a request");
                }
                tokio::time::sleep(wait).await;
            }
            let in_flight = self.counters.map(|c| c.begin(n > 0));
            let answer = tokio::time::timeout(self.deadline, attempt()).await;
            drop(in_flight);
            match answer {
                Err(_) => {
                    last = Transient {
                        timeout: true,
                        ..on_timeout()
                    }
                }
                Ok(Attempt::Done(t)) => return Ok(t),
                Ok(Attempt::Fail(e)) => return Err(Outcome::Failed(e)),
                Ok(Attempt::Retry(f)) if f.permanent => {
                    return Err(Outcome::Exhausted {
                        last: f,
                        attempts: n + 1,
                    });
                }
                Ok(Attempt::Retry(f)) => last = f,
            }
        }
        Err(Outcome::Exhausted {
            last,
            attempts: self.policy.attempts(),
        })
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

/// Whether this is the first retry of `url`'s source (scheme and host) in
/// this process: one WARN line a source, not one an attempt (a server that
/// stopped mid-pull gave 50).
fn first_retry_of(url: &str) -> bool {
    static WARNED: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> =
        std::sync::OnceLock::new();
    let source = match url.split_once("://") {
        Some((scheme, rest)) => {
            format!("{scheme}://{}", rest.split('/').next().unwrap_or_default())
        }
        None => url.to_owned(),
    };
    crate::blocking::lock(WARNED.get_or_init(Default::default)).insert(source)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 58: one WARN line a source, whatever its retries.
    #[test]
    fn a_source_is_warned_of_once() {
        assert!(first_retry_of("http://warn-once.test:81/m/v1/model.knot"));
        assert!(!first_retry_of(
            "http://warn-once.test:81/m/v1/token_embd.f32.rows"
        ));
        assert!(first_retry_of(
            "http://warn-once-other.test/m/v1/model.knot"
        ));
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let p = RetryPolicy {
            attempts: 5,
            backoff: Duration::from_millis(50),
            hedge: HEDGE,
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

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn the_runner_retries_transient_failures_and_stops_at_a_final_one() {
        let policy = RetryPolicy {
            attempts: 3,
            backoff: Duration::from_millis(1),
            hedge: HEDGE,
        };
        let c = Counters::default();
        let r = Runner::new(policy, Duration::from_secs(5), "u", "bytes=0-9").counted(&c);
        let mut n = 0;
        let got: Result<u32, Outcome<&str>> = rt().block_on(r.run(
            || {
                n += 1;
                let a = if n < 3 {
                    Attempt::Retry(Transient::msg(format!("HTTP 503 ({n})")))
                } else {
                    Attempt::Done(7)
                };
                async move { a }
            },
            Transient::default,
        ));
        assert_eq!(got.ok(), Some(7));
        assert_eq!((c.snapshot().requests, c.snapshot().retries), (3, 2));
        let got: Result<u32, Outcome<&str>> =
            rt().block_on(r.run(|| async { Attempt::Fail("404") }, Transient::default));
        assert!(matches!(got, Err(Outcome::Failed("404"))));
        let permanent = Transient {
            permanent: true,
            ..Transient::msg("TLS".into())
        };
        let got: Result<u32, Outcome<&str>> = rt().block_on(r.run(
            || {
                let f = permanent.clone();
                async move { Attempt::Retry(f) }
            },
            Transient::default,
        ));
        assert!(matches!(got, Err(Outcome::Exhausted { attempts: 1, .. })));
    }

    #[test]
    fn an_attempt_past_its_deadline_is_a_timeout() {
        let policy = RetryPolicy {
            attempts: 2,
            backoff: Duration::from_millis(1),
            hedge: HEDGE,
        };
        let r = Runner::new(policy, Duration::from_millis(20), "u", "HEAD");
        let got: Result<u32, Outcome<&str>> = rt().block_on(r.run(
            || async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Attempt::Done(1)
            },
            || Transient::msg("no answer".into()),
        ));
        match got {
            Err(Outcome::Exhausted { last, attempts: 2 }) => {
                assert!(last.timeout && last.message == "no answer", "{last:?}");
            }
            other => panic!("{other:?}"),
        }
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
