//! Single-range HTTP GETs with strict checking, retries and counters.
//!
//! Every response to a range request must be `206` with exactly the
//! `Content-Range` asked for and a body of exactly that length. A `200`
//! means the server ignored Range: the body is not read (it is the whole
//! object) and the connection is dropped. Transport failures, timeouts,
//! `5xx` and `429` are retried with exponential backoff; the other failures
//! are not, because asking again would get the same answer.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::error::{ReaderError, Result};

/// Network counters a node can export.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    payload_bytes: AtomicU64,
    http_bytes: AtomicU64,
    retries: AtomicU64,
}

/// A snapshot of the network counters of a reader.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NetStats {
    /// HTTP requests sent (HEAD and GET, retries included).
    pub requests: u64,
    /// Body bytes received.
    pub payload_bytes: u64,
    /// Body bytes plus response status lines and headers as received.
    pub http_bytes: u64,
    /// Requests that were retries.
    pub retries: u64,
}

impl NetStats {
    /// `self - earlier`.
    pub fn since(&self, earlier: &NetStats) -> NetStats {
        NetStats {
            requests: self.requests - earlier.requests,
            payload_bytes: self.payload_bytes - earlier.payload_bytes,
            http_bytes: self.http_bytes - earlier.http_bytes,
            retries: self.retries - earlier.retries,
        }
    }
}

impl Counters {
    /// Current values.
    pub(crate) fn snapshot(&self) -> NetStats {
        NetStats {
            requests: self.requests.load(Ordering::Relaxed),
            payload_bytes: self.payload_bytes.load(Ordering::Relaxed),
            http_bytes: self.http_bytes.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
        }
    }
}

/// HTTP settings.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Timeout of each request, from connect to last body byte.
    pub timeout: Duration,
    /// Attempts per request for transient failures (1 = no retry).
    pub attempts: u32,
    /// First backoff; doubled after each failed attempt.
    pub backoff: Duration,
    /// Idle connections kept for reuse (match the fetch concurrency).
    pub max_connections: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            timeout: Duration::from_secs(10),
            attempts: 3,
            backoff: Duration::from_millis(50),
            max_connections: 64,
        }
    }
}

/// A blocking HTTP client shared by every fetch of one reader.
#[derive(Debug)]
pub struct Http {
    agent: ureq::Agent,
    config: HttpConfig,
    counters: Counters,
}

enum Attempt<T> {
    Done(T),
    Retry(String),
    Fail(ReaderError),
}

fn header_bytes(resp: &ureq::http::Response<ureq::Body>) -> u64 {
    // "HTTP/1.1 206 Partial Content\r\n" + "name: value\r\n"... + "\r\n"
    let status = 9 + 4 + resp.status().canonical_reason().map_or(0, str::len) + 2;
    let headers: usize = resp
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + 2 + v.len() + 2)
        .sum();
    (status + headers + 2) as u64
}

impl Http {
    /// A client with `config`: no redirects followed, no compression.
    pub fn new(config: HttpConfig) -> Http {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(config.timeout))
            .http_status_as_error(false)
            .max_redirects(0)
            // keep as many connections alive as requests may be in flight
            .max_idle_connections_per_host(config.max_connections)
            .max_idle_connections(config.max_connections)
            .user_agent(concat!("gkq-reader/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Http {
            agent,
            config,
            counters: Counters::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> NetStats {
        self.counters.snapshot()
    }

    fn with_retries<T>(&self, url: &str, mut f: impl FnMut() -> Attempt<T>) -> Result<T> {
        let mut delay = self.config.backoff;
        let attempts = self.config.attempts.max(1);
        let mut last = String::new();
        for n in 0..attempts {
            if n > 0 {
                self.counters.retries.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(delay);
                delay *= 2;
            }
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            match f() {
                Attempt::Done(t) => return Ok(t),
                Attempt::Fail(e) => return Err(e),
                Attempt::Retry(m) => last = m,
            }
        }
        Err(ReaderError::Transport {
            url: url.to_owned(),
            message: last,
            attempts,
        })
    }

    /// Counts the response's status line and headers; a transport error
    /// becomes its message (the caller retries).
    fn counted(
        &self,
        r: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> std::result::Result<ureq::http::Response<ureq::Body>, String> {
        let resp = r.map_err(|e| describe(&e))?;
        self.counters
            .http_bytes
            .fetch_add(header_bytes(&resp), Ordering::Relaxed);
        Ok(resp)
    }

    fn redirect(url: &str, status: u16, resp: &ureq::http::Response<ureq::Body>) -> ReaderError {
        let location = resp
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        ReaderError::Redirect {
            url: url.into(),
            status,
            location,
        }
    }

    fn transient(status: u16) -> bool {
        status >= 500 || status == 429
    }

    /// HEAD: the Content-Length of a 200.
    pub fn content_length(&self, url: &str) -> Result<u64> {
        self.with_retries(url, || {
            let resp = match self.counted(self.agent.head(url).call()) {
                Ok(r) => r,
                Err(e) => return Attempt::Retry(e),
            };
            let status = resp.status().as_u16();
            if Self::transient(status) {
                return Attempt::Retry(format!("HTTP {status}"));
            }
            if (300..400).contains(&status) {
                return Attempt::Fail(Self::redirect(url, status, &resp));
            }
            if status != 200 {
                return Attempt::Fail(ReaderError::Status {
                    url: url.into(),
                    status,
                    what: "HEAD".into(),
                });
            }
            match resp
                .headers()
                .get("content-length")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
            {
                Some(n) => Attempt::Done(n),
                None => Attempt::Fail(ReaderError::Status {
                    url: url.into(),
                    status,
                    what: "HEAD without Content-Length".into(),
                }),
            }
        })
    }

    /// GET `bytes=start-end` (inclusive) of an object of `total` bytes (when
    /// known), feeding the body to `sink` as it arrives. `sink` may be
    /// called again from the start after a retry, so it must reset itself
    /// when called with `offset == 0`.
    pub fn get_range(
        &self,
        url: &str,
        start: u64,
        end: u64,
        total: Option<u64>,
        sink: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<()> {
        let want = end - start + 1;
        self.with_retries(url, || {
            let range = self
                .agent
                .get(url)
                .header("Range", format!("bytes={start}-{end}"))
                .call();
            let mut resp = match self.counted(range) {
                Ok(r) => r,
                Err(e) => return Attempt::Retry(e),
            };
            let status = resp.status().as_u16();
            if status == 200 {
                return Attempt::Fail(ReaderError::IgnoresRange {
                    url: url.into(),
                    start,
                    end,
                });
            }
            if Self::transient(status) {
                return Attempt::Retry(format!("HTTP {status} for bytes={start}-{end}"));
            }
            if status != 206 {
                return Attempt::Fail(ReaderError::Status {
                    url: url.into(),
                    status,
                    what: format!("bytes={start}-{end}"),
                });
            }
            let cr = resp
                .headers()
                .get("content-range")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let ok = match total {
                Some(t) => cr == format!("bytes {start}-{end}/{t}"),
                None => cr.starts_with(&format!("bytes {start}-{end}/")),
            };
            if !ok {
                let expected = format!(
                    "bytes {start}-{end}/{}",
                    total.map_or("*".to_string(), |t| t.to_string())
                );
                return Attempt::Fail(ReaderError::ContentRange {
                    url: url.into(),
                    expected,
                    found: cr,
                });
            }
            let mut reader = resp.body_mut().as_reader();
            let mut buf = vec![0u8; (want.min(1 << 20)) as usize];
            let mut got = 0u64;
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if got + n as u64 > want {
                            return Attempt::Fail(ReaderError::BodyLength {
                                url: url.into(),
                                start,
                                end,
                                expected: want,
                                found: got + n as u64,
                            });
                        }
                        sink(got, &buf[..n]);
                        got += n as u64;
                        self.counters
                            .payload_bytes
                            .fetch_add(n as u64, Ordering::Relaxed);
                        self.counters
                            .http_bytes
                            .fetch_add(n as u64, Ordering::Relaxed);
                    }
                    // A reset or a stall mid-body: retry the whole range.
                    Err(e) => {
                        return Attempt::Retry(format!(
                            "reading bytes={start}-{end}: {e} after {got} of {want} bytes"
                        ));
                    }
                }
            }
            if got != want {
                return Attempt::Retry(
                    ReaderError::BodyLength {
                        url: url.into(),
                        start,
                        end,
                        expected: want,
                        found: got,
                    }
                    .to_string(),
                );
            }
            Attempt::Done(())
        })
    }

    /// GET `bytes=start-end` into memory.
    pub fn get_range_vec(
        &self,
        url: &str,
        start: u64,
        end: u64,
        total: Option<u64>,
    ) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity((end - start + 1) as usize);
        self.get_range(url, start, end, total, &mut |off, b| {
            if off == 0 {
                out.clear();
            }
            out.extend_from_slice(b);
        })?;
        Ok(out)
    }
}

/// A transport error in the words a user can act on.
fn describe(e: &ureq::Error) -> String {
    let text = e.to_string();
    match e {
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused: is the server running, and is the port right?".into()
        }
        _ if text.contains("corrupt message") || text.contains("InvalidContentType") => format!(
            "the server does not speak TLS (an https:// URL sent to a plain http port? try http://): {text}"
        ),
        _ if text.contains("certificate") || text.contains("UnknownIssuer") => {
            format!("TLS certificate problem: {text}")
        }
        _ => text,
    }
}
