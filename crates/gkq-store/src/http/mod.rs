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

mod diagnose;
pub(crate) mod tls;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use gkq_format::root_cause;
use reqwest::header::{HeaderMap, RANGE};

use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::gate::{Connection, Gate};
use crate::range::{Expect, check_dest};
use crate::read::{BoxFuture, Head, RangeRead, ReadOptions};
use crate::retry::{Attempt, Outcome, Runner, Transient, parse_retry_after, transient_status};
use crate::stats::{Counters, NetStats};
use diagnose::{describe, hint_from_body};

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
    gate: Gate,
    /// The strong ETag first seen for each object (by URL without its
    /// query): later ranges are sent with `If-Range`, so that an object
    /// replaced at the same URL mid-session is noticed, never mixed.
    validators: crate::answer::Validators,
}

type Try<T> = Attempt<T, StoreError>;

impl crate::answer::Body for reqwest::Response {
    async fn chunk(&mut self) -> std::result::Result<Option<bytes::Bytes>, (String, bool)> {
        reqwest::Response::chunk(self)
            .await
            .map_err(|e| (root_cause(&e), e.is_timeout()))
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

/// The final error of a run of attempts.
pub(crate) fn finished(url: &str, o: Outcome<StoreError>) -> StoreError {
    match o {
        Outcome::Failed(e) => e,
        Outcome::Exhausted { last, attempts } => StoreError::Transport {
            url: url.to_owned(),
            message: last.message,
            attempts,
            timeout: last.timeout,
            no_conversation: last.no_conversation,
        },
    }
}

impl HttpStore {
    /// A backend with `config`: no redirects followed, no compression.
    pub fn new(config: StoreConfig) -> Result<HttpStore> {
        let counters = Arc::new(Counters::default());
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
            gate: Gate::new(config.parallel),
            config,
            counters,
            validators: crate::answer::Validators::default(),
        })
    }

    /// The counters of every request this backend sent.
    pub fn stats(&self) -> NetStats {
        self.counters.snapshot()
    }

    /// The client of `connection`, and its index in `warm`.
    fn client(&self, connection: Connection) -> (&reqwest::Client, usize) {
        match connection {
            Connection::Shared => (&self.small, 0),
            Connection::Bulk(n) => {
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

    fn describe(&self, e: &reqwest::Error, url: &str) -> Transient {
        describe(e, url, !self.config.ca_certs.is_empty(), &env)
    }

    /// Counts the response's status line and headers; a transport error
    /// becomes a failure to retry.
    fn counted(
        &self,
        r: reqwest::Result<reqwest::Response>,
        url: &str,
    ) -> std::result::Result<reqwest::Response, Transient> {
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
        if status == 404 {
            return StoreError::NotFound {
                url: url.into(),
                how: format!("HTTP 404 for {what}"),
            };
        }
        let path = crate::url::without_query(url);
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

    async fn head_once(&self, url: &str) -> Try<Head> {
        let resp = match self.counted(self.send(0, self.small.head(url)).await, url) {
            Ok(r) => r,
            Err(e) => return Attempt::Retry(e),
        };
        let status = resp.status().as_u16();
        if transient_status(status) {
            return Attempt::Retry(Transient {
                retry_after: header_str(resp.headers(), "retry-after")
                    .and_then(|v| parse_retry_after(&v)),
                ..Transient::msg(format!("HTTP {status}"))
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
            None => Attempt::Fail(StoreError::NoLength {
                url: url.into(),
                what: "HEAD",
            }),
        }
    }

    /// One ranged GET; `got` counts the body bytes that arrived.
    async fn ranged_once(
        &self,
        connection: Connection,
        url: &str,
        (start, end): (u64, u64),
        expect: Expect,
        dest: &Mutex<&mut [u8]>,
        got: &AtomicU64,
    ) -> Try<(u64, u64)> {
        let (client, i) = self.client(connection);
        let mut req = client
            .get(url)
            .header(RANGE, format!("bytes={start}-{end}"));
        let validator = self.validators.get(url);
        if let Some(v) = &validator {
            req = req.header(reqwest::header::IF_RANGE, v.as_str());
        }
        let mut resp = match self.counted(self.send(i, req).await, url) {
            Ok(r) => r,
            Err(e) => return Attempt::Retry(e),
        };
        let status = resp.status().as_u16();
        if status == 200 {
            let now = header_str(resp.headers(), "etag");
            return Attempt::Fail(match (validator, now) {
                (Some(was), Some(now)) if was != now => StoreError::Changed {
                    url: url.into(),
                    was,
                    now,
                },
                _ => StoreError::IgnoresRange {
                    url: url.into(),
                    start,
                    end,
                },
            });
        }
        if transient_status(status) {
            return Attempt::Retry(Transient {
                retry_after: header_str(resp.headers(), "retry-after")
                    .and_then(|v| parse_retry_after(&v)),
                ..Transient::msg(format!("HTTP {status} for bytes={start}-{end}"))
            });
        }
        if status == 416 {
            // `Content-Range: bytes */N` says how long the object is
            let len = header_str(resp.headers(), "content-range")
                .and_then(|cr| cr.strip_prefix("bytes */").and_then(|n| n.parse().ok()));
            if let Some(len) = len {
                return Attempt::Fail(StoreError::PastEnd {
                    url: url.into(),
                    start,
                    end,
                    len,
                });
            }
        }
        if status != 206 {
            let what = format!("bytes={start}-{end}");
            return Attempt::Fail(self.refused(url, what, resp).await);
        }
        let etag = header_str(resp.headers(), "etag");
        let cr = header_str(resp.headers(), "content-range").unwrap_or_default();
        let checks = (&self.validators, etag.as_deref(), cr.as_str());
        let at = (url, (start, end), expect);
        crate::answer::accept(&mut resp, at, checks, dest, (&self.counters, got)).await
    }

    /// [`HttpStore::ranged_once`] under the store's retry runner, each
    /// attempt within the deadline of its bytes; returns the end the body
    /// covered (a prefix may be shorter) and the object's length.
    async fn ranged(
        &self,
        connection: Connection,
        url: &str,
        (start, end): (u64, u64),
        expect: Expect,
        dest: &mut [u8],
    ) -> Result<(u64, u64)> {
        let bytes = end - start + 1;
        let deadline = self.config.deadline(bytes);
        let what = format!("bytes={start}-{end}");
        let runner = Runner::new(self.config.retry, deadline, url, &what).counted(&self.counters);
        let got = AtomicU64::new(0);
        // the runner awaits one attempt at a time; each writes from the start
        let dest = Mutex::new(dest);
        let attempt = || {
            got.store(0, Ordering::Relaxed);
            self.ranged_once(connection, url, (start, end), expect, &dest, &got)
        };
        let on_timeout = || {
            Transient::msg(format!(
                "timed out: bytes={start}-{end}: no complete answer within {:.1} s, the deadline for {bytes} bytes (--timeout {} s + {bytes} B at --min-throughput {} B/s); {} bytes had arrived",
                deadline.as_secs_f64(),
                self.config.timeout.as_secs_f64(),
                self.config.min_throughput,
                got.load(Ordering::Relaxed)
            ))
        };
        runner
            .run(attempt, on_timeout)
            .await
            .map_err(|o| finished(url, o))
    }

    /// HEAD: a 200 with its Content-Length (and ETag, `x-amz-meta-sha256`).
    pub async fn head(&self, url: &str) -> Result<Head> {
        let timeout = self.config.timeout;
        let runner = Runner::new(self.config.retry, timeout, url, "HEAD").counted(&self.counters);
        let on_timeout = || {
            Transient::msg(format!(
                "timed out: no answer to HEAD within {:.1} s",
                timeout.as_secs_f64()
            ))
        };
        runner
            .run(|| self.head_once(url), on_timeout)
            .await
            .map_err(|o| finished(url, o))
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
            let r = self
                .ranged(
                    opts.connection,
                    location,
                    (start, end),
                    Expect::Exact(opts.total),
                    dest,
                )
                .await
                .map(|(_, total)| total);
            match r {
                // a 416 without `Content-Range: bytes */N`: a HEAD says N
                Err(StoreError::Status { status: 416, .. }) => Err(StoreError::PastEnd {
                    url: location.into(),
                    start,
                    end,
                    len: self.head(location).await?.len,
                }),
                r => r,
            }
        })
    }

    fn read_prefix<'a>(
        &'a self,
        location: &'a str,
        max: u64,
    ) -> BoxFuture<'a, Result<(Vec<u8>, u64)>> {
        let cap = self.config.max_read_bytes;
        Box::pin(crate::answer::read_prefix(
            location,
            max,
            cap,
            async |range, out| {
                let shared = Connection::Shared;
                (self.ranged(shared, location, range, Expect::Prefix, out)).await
            },
        ))
    }

    fn max_read_bytes(&self) -> u64 {
        self.config.max_read_bytes
    }

    fn gate(&self) -> &Gate {
        &self.gate
    }

    fn multiplexed(&self) -> bool {
        self.counters.multiplexed()
    }
}
