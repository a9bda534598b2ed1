//! The HTTP(S) backend: strict single-range GETs over HTTP/2 (by ALPN) or
//! HTTP/1.1, with rustls.
//!
//! Every response to a range request must be `206` with exactly the
//! `Content-Range` asked for and a body of exactly that length. A `200`
//! means the server ignored Range: the body is not read (it is the whole
//! object). Transport failures, timeouts, `5xx` and `429` are retried with
//! the store's [`crate::RetryPolicy`] (honouring `Retry-After`); the other
//! failures are not, because asking again would get the same answer. Each
//! attempt has a deadline scaled to the bytes asked for
//! ([`crate::StoreConfig::min_throughput`]), so a stall or a drip ends.
//!
//! Small reads share one client (one multiplexed HTTP/2 connection per
//! origin); bulk parts go round-robin over [`crate::Parallelism::connections`]
//! more clients, each with its own connection.

pub(crate) mod tls;
mod words;

use std::sync::Arc;

use reqwest::header::{HeaderMap, RANGE};

use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::range::{Expect, check_dest};
use crate::read::{BoxFuture, Head, Lane, RangeRead, ReadOptions};
use crate::retry::{parse_retry_after, transient_status};
use crate::stats::Counters;
use words::{Failure, describe, hint_from_body, root_cause};

/// The HTTP(S) backend.
#[derive(Debug)]
pub struct HttpStore {
    small: reqwest::Client,
    bulk: Vec<reqwest::Client>,
    /// Whether each client (the small one first) has had an answer: until
    /// then its requests go one at a time, so that concurrent first
    /// requests do not each open a connection before ALPN has said the
    /// origin speaks HTTP/2 (which then carries them all on one).
    warm: Vec<tokio::sync::Mutex<bool>>,
    config: StoreConfig,
    counters: Arc<Counters>,
}

enum Attempt<T> {
    Done(T),
    Retry(Failure),
    Fail(StoreError),
}

/// Where a body goes: an exact slice, or a buffer that grows with the bytes
/// that arrive (a prefix of unknown length).
enum Dest<'a> {
    Slice(&'a mut [u8]),
    Grow(&'a mut Vec<u8>),
}

impl Dest<'_> {
    /// Prepares for a body of `want` bytes; false if it cannot hold them.
    fn begin(&mut self, want: u64) -> bool {
        match self {
            Dest::Slice(s) => s.len() as u64 == want,
            Dest::Grow(v) => {
                v.clear();
                v.reserve(usize::try_from(want.min(1 << 20)).unwrap_or(0));
                true
            }
        }
    }

    fn put(&mut self, at: u64, bytes: &[u8]) {
        match self {
            Dest::Slice(s) => {
                let at = usize::try_from(at).unwrap_or(usize::MAX);
                if let Some(d) = at
                    .checked_add(bytes.len())
                    .and_then(|end| s.get_mut(at..end))
                {
                    d.copy_from_slice(bytes);
                }
            }
            Dest::Grow(v) => v.extend_from_slice(bytes),
        }
    }
}

/// Bytes of the status line and headers, as HTTP/1.1 would send them.
fn header_bytes(resp: &reqwest::Response) -> u64 {
    let status = 9 + 4 + resp.status().canonical_reason().map_or(0, str::len) + 2;
    let headers: usize = resp
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + 2 + v.len() + 2)
        .sum();
    (status + headers + 2) as u64
}

fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

fn transport(url: &str, f: Failure, attempts: u32) -> StoreError {
    StoreError::Transport {
        url: url.to_owned(),
        message: f.message,
        attempts,
        timeout: f.timeout,
        no_conversation: f.no_conversation,
    }
}

impl HttpStore {
    /// A backend with `config`, counting into `counters`: no redirects
    /// followed, no compression.
    pub(crate) fn new(config: StoreConfig, counters: Arc<Counters>) -> Result<HttpStore> {
        let tls = tls::tls_config(&config)?;
        let build = |bulk: bool| -> Result<reqwest::Client> {
            let mut b = reqwest::Client::builder()
                .use_preconfigured_tls(tls.clone())
                .connect_timeout(config.timeout)
                .read_timeout(config.timeout)
                .redirect(reqwest::redirect::Policy::none())
                .pool_max_idle_per_host(64)
                .tcp_nodelay(true)
                .user_agent(concat!("gkq-store/", env!("CARGO_PKG_VERSION")))
                .connector_layer(tls::CountConnections(counters.clone()));
            if bulk {
                // room for a part in flight per stream at link speed
                b = b
                    .http2_initial_stream_window_size(8 << 20)
                    .http2_initial_connection_window_size(32 << 20);
            }
            if config.http1_only {
                b = b.http1_only();
            }
            b.build().map_err(|e| StoreError::Client(root_cause(&e)))
        };
        let small = build(false)?;
        let bulk: Vec<reqwest::Client> = (0..config.parallel.connections.max(1))
            .map(|_| build(true))
            .collect::<Result<_>>()?;
        let warm = (0..=bulk.len())
            .map(|_| tokio::sync::Mutex::new(false))
            .collect();
        Ok(HttpStore {
            small,
            bulk,
            warm,
            config,
            counters,
        })
    }

    /// The client of `lane`, and its index in `warm`.
    fn client(&self, lane: Lane) -> (&reqwest::Client, usize) {
        match lane {
            Lane::Small => (&self.small, 0),
            Lane::Bulk(n) => {
                let i = n % self.bulk.len().max(1);
                (self.bulk.get(i).unwrap_or(&self.small), i + 1)
            }
        }
    }

    /// Sends `req` on client `i`, one at a time until the client has had
    /// an answer (see `warm`).
    async fn send(
        &self,
        i: usize,
        req: reqwest::RequestBuilder,
    ) -> reqwest::Result<reqwest::Response> {
        let Some(lock) = self.warm.get(i) else {
            return req.send().await;
        };
        let mut first = lock.lock().await;
        if *first {
            drop(first);
            return req.send().await;
        }
        let r = req.send().await;
        *first = r.is_ok();
        r
    }

    fn describe(&self, e: &reqwest::Error, url: &str) -> Failure {
        describe(e, url, !self.config.ca_certs.is_empty(), &env)
    }

    /// Counts the response's status line and headers; a transport error
    /// becomes a failure to retry.
    fn counted(
        &self,
        r: reqwest::Result<reqwest::Response>,
        url: &str,
    ) -> std::result::Result<reqwest::Response, Failure> {
        let resp = r.map_err(|e| self.describe(&e, url))?;
        if resp.version() == reqwest::Version::HTTP_2 {
            self.counters.saw_h2();
        }
        self.counters.headers(header_bytes(&resp));
        Ok(resp)
    }

    /// A status that ends the request: redirects, 4xx, and anything not
    /// expected, with what the URL or the first KiB of the body suggest.
    async fn refused(&self, url: &str, what: String, mut resp: reqwest::Response) -> StoreError {
        let status = resp.status().as_u16();
        if (300..400).contains(&status) {
            return StoreError::Redirect {
                url: url.into(),
                status,
                location: header_str(resp.headers(), "location").unwrap_or_default(),
            };
        }
        let mut body = Vec::new();
        while body.len() < 1024 {
            let next = tokio::time::timeout(self.config.timeout, resp.chunk()).await;
            match next {
                Ok(Ok(Some(b))) => body.extend_from_slice(&b),
                _ => break,
            }
        }
        let path = url.split(['?', '#']).next().unwrap_or(url);
        let hint = hint_from_body(&body).or_else(|| {
            path.ends_with('/')
                .then(|| "the URL ends with '/': it names a directory, not an object".to_owned())
        });
        StoreError::Status {
            url: url.into(),
            status,
            what,
            hint,
        }
    }

    async fn head_once(&self, url: &str) -> Attempt<Head> {
        let resp = match self.counted(self.send(0, self.small.head(url)).await, url) {
            Ok(r) => r,
            Err(e) => return Attempt::Retry(e),
        };
        let status = resp.status().as_u16();
        if transient_status(status) {
            return Attempt::Retry(Failure {
                retry_after: header_str(resp.headers(), "retry-after")
                    .and_then(|v| parse_retry_after(&v)),
                ..Failure::msg(format!("HTTP {status}"))
            });
        }
        if status != 200 {
            return Attempt::Fail(self.refused(url, "HEAD".into(), resp).await);
        }
        let h = resp.headers();
        match header_str(h, "content-length").and_then(|v| v.parse().ok()) {
            Some(len) => Attempt::Done(Head {
                len,
                etag: header_str(h, "etag"),
                sha256: header_str(h, "x-amz-meta-sha256"),
            }),
            None => Attempt::Fail(StoreError::Status {
                url: url.into(),
                status,
                what: "HEAD without Content-Length".into(),
                hint: None,
            }),
        }
    }

    /// One ranged GET; `got` counts the body bytes that arrived.
    async fn ranged_once(
        &self,
        lane: Lane,
        url: &str,
        (start, end): (u64, u64),
        expect: Expect,
        dest: &mut Dest<'_>,
        got: &mut u64,
    ) -> Attempt<u64> {
        let (client, i) = self.client(lane);
        let req = client
            .get(url)
            .header(RANGE, format!("bytes={start}-{end}"));
        let mut resp = match self.counted(self.send(i, req).await, url) {
            Ok(r) => r,
            Err(e) => return Attempt::Retry(e),
        };
        let status = resp.status().as_u16();
        if status == 200 {
            return Attempt::Fail(StoreError::IgnoresRange {
                url: url.into(),
                start,
                end,
            });
        }
        if transient_status(status) {
            return Attempt::Retry(Failure {
                retry_after: header_str(resp.headers(), "retry-after")
                    .and_then(|v| parse_retry_after(&v)),
                ..Failure::msg(format!("HTTP {status} for bytes={start}-{end}"))
            });
        }
        if status != 206 {
            let what = format!("bytes={start}-{end}");
            return Attempt::Fail(self.refused(url, what, resp).await);
        }
        let cr = header_str(resp.headers(), "content-range").unwrap_or_default();
        let (end, object_len) = match expect.check(&cr, start, end) {
            Ok(v) => v,
            Err(expected) => {
                return Attempt::Fail(StoreError::ContentRange {
                    url: url.into(),
                    expected,
                    found: cr,
                });
            }
        };
        let want = end - start + 1;
        if !dest.begin(want) {
            return Attempt::Fail(StoreError::BodyLength {
                url: url.into(),
                start,
                end,
                expected: want,
                found: 0,
            });
        }
        match self.body(&mut resp, url, (start, end), dest, got).await {
            Some(stop) => stop,
            None => Attempt::Done(object_len),
        }
    }

    /// Streams the body of a 206 for bytes `start..=end` into `dest`:
    /// `None` when exactly those bytes arrived, else what to do instead.
    async fn body(
        &self,
        resp: &mut reqwest::Response,
        url: &str,
        (start, end): (u64, u64),
        dest: &mut Dest<'_>,
        got: &mut u64,
    ) -> Option<Attempt<u64>> {
        let want = end - start + 1;
        let length = |found| StoreError::BodyLength {
            url: url.into(),
            start,
            end,
            expected: want,
            found,
        };
        loop {
            match resp.chunk().await {
                Ok(Some(b)) => {
                    let n = b.len() as u64;
                    if *got + n > want {
                        return Some(Attempt::Fail(length(*got + n)));
                    }
                    dest.put(*got, &b);
                    *got += n;
                    self.counters.body(n);
                }
                Ok(None) => break,
                // a reset or a stall mid-body: retry the whole range
                Err(e) => {
                    return Some(Attempt::Retry(Failure {
                        timeout: e.is_timeout(),
                        ..Failure::msg(format!(
                            "reading bytes={start}-{end}: {} after {got} of {want} bytes",
                            root_cause(&e)
                        ))
                    }));
                }
            }
        }
        (*got != want).then(|| Attempt::Retry(Failure::msg(length(*got).to_string())))
    }

    /// The retry loop around [`HttpStore::ranged_once`], each attempt under
    /// the deadline of its bytes; returns the object's length.
    async fn ranged(
        &self,
        lane: Lane,
        url: &str,
        (start, end): (u64, u64),
        expect: Expect,
        mut dest: Dest<'_>,
    ) -> Result<u64> {
        let policy = self.config.retry;
        let bytes = end - start + 1;
        let deadline = self.config.deadline(bytes);
        let mut last = Failure::default();
        for n in 0..policy.attempts() {
            if n > 0 {
                let wait = policy.wait(n, last.retry_after);
                tracing::warn!(url, start, end, attempt = n + 1, wait_ms = wait.as_millis() as u64, reason = %last.message, "retrying a range read");
                tokio::time::sleep(wait).await;
            }
            self.counters.request(n > 0);
            let mut got = 0u64;
            let once = self.ranged_once(lane, url, (start, end), expect, &mut dest, &mut got);
            match tokio::time::timeout(deadline, once).await {
                Err(_) => {
                    last = Failure {
                        timeout: true,
                        ..Failure::msg(format!(
                            "timed out: bytes={start}-{end}: no complete answer within {:.1} s, the deadline for {bytes} bytes (--timeout {} s + {bytes} B at --min-throughput {} B/s); {got} bytes had arrived",
                            deadline.as_secs_f64(),
                            self.config.timeout.as_secs_f64(),
                            self.config.min_throughput
                        ))
                    }
                }
                Ok(Attempt::Done(t)) => return Ok(t),
                Ok(Attempt::Fail(e)) => return Err(e),
                Ok(Attempt::Retry(f)) if f.permanent => return Err(transport(url, f, n + 1)),
                Ok(Attempt::Retry(f)) => last = f,
            }
        }
        Err(transport(url, last, policy.attempts()))
    }

    /// HEAD: a 200 with its Content-Length (and ETag, `x-amz-meta-sha256`).
    pub async fn head(&self, url: &str) -> Result<Head> {
        let policy = self.config.retry;
        let mut last = Failure::default();
        for n in 0..policy.attempts() {
            if n > 0 {
                tokio::time::sleep(policy.wait(n, last.retry_after)).await;
            }
            self.counters.request(n > 0);
            match tokio::time::timeout(self.config.timeout, self.head_once(url)).await {
                Err(_) => {
                    last = Failure {
                        timeout: true,
                        ..Failure::msg(format!(
                            "timed out: no answer to HEAD within {:.1} s",
                            self.config.timeout.as_secs_f64()
                        ))
                    }
                }
                Ok(Attempt::Done(h)) => return Ok(h),
                Ok(Attempt::Fail(e)) => return Err(e),
                Ok(Attempt::Retry(f)) if f.permanent => return Err(transport(url, f, n + 1)),
                Ok(Attempt::Retry(f)) => last = f,
            }
        }
        Err(transport(url, last, policy.attempts()))
    }

    /// Whether a response has come over HTTP/2 (requests are multiplexed
    /// on one connection, so many can be in flight at little cost).
    pub fn multiplexed(&self) -> bool {
        self.counters.multiplexed()
    }
}

impl RangeRead for HttpStore {
    fn head<'a>(&'a self, location: &'a str) -> BoxFuture<'a, Result<Head>> {
        Box::pin(HttpStore::head(self, location))
    }

    fn read_into<'a>(
        &'a self,
        location: &'a str,
        start: u64,
        dest: &'a mut [u8],
        opts: ReadOptions,
    ) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let end = check_dest(
                location,
                start,
                dest.len() as u64,
                self.config.max_read_bytes,
            )?;
            self.ranged(
                opts.lane,
                location,
                (start, end),
                Expect::Exact(opts.total),
                Dest::Slice(dest),
            )
            .await
        })
    }

    fn read_prefix<'a>(
        &'a self,
        location: &'a str,
        max: u64,
    ) -> BoxFuture<'a, Result<(Vec<u8>, u64)>> {
        Box::pin(async move {
            if max == 0 || max > self.config.max_read_bytes {
                return Err(StoreError::TooLarge {
                    url: location.into(),
                    start: 0,
                    end: max.saturating_sub(1),
                    len: max,
                    cap: self.config.max_read_bytes,
                });
            }
            let mut out = Vec::new();
            let total = self
                .ranged(
                    Lane::Small,
                    location,
                    (0, max - 1),
                    Expect::Prefix,
                    Dest::Grow(&mut out),
                )
                .await?;
            Ok((out, total))
        })
    }

    fn max_read_bytes(&self) -> u64 {
        self.config.max_read_bytes
    }
}
