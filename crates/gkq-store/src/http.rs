//! Single-range HTTP GETs with strict checking, retries and counters.
//!
//! Every response to a range request must be `206` with exactly the
//! `Content-Range` asked for and a body of exactly that length. A `200`
//! means the server ignored Range: the body is not read (it is the whole
//! object) and the stream is dropped. Transport failures, timeouts, `5xx`
//! and `429` are retried with exponential backoff; the other failures are
//! not, because asking again would get the same answer. Nothing is
//! allocated from a length the server or a knot declares: buffers grow with
//! the bytes that actually arrive, up to a cap.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::error::{Result, StoreError};

/// Network counters.
#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    payload_bytes: AtomicU64,
    http_bytes: AtomicU64,
    retries: AtomicU64,
    connections: AtomicU64,
    /// Set once a response came over HTTP/2.
    h2: std::sync::atomic::AtomicBool,
}

/// A snapshot of the network counters of a client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NetStats {
    /// HTTP requests sent (HEAD and GET, retries included).
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
            requests: self.requests - earlier.requests,
            payload_bytes: self.payload_bytes - earlier.payload_bytes,
            http_bytes: self.http_bytes - earlier.http_bytes,
            retries: self.retries - earlier.retries,
            connections: self.connections - earlier.connections,
        }
    }
}

impl Counters {
    fn snapshot(&self) -> NetStats {
        NetStats {
            requests: self.requests.load(Ordering::Relaxed),
            payload_bytes: self.payload_bytes.load(Ordering::Relaxed),
            http_bytes: self.http_bytes.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            connections: self.connections.load(Ordering::Relaxed),
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
    /// Idle HTTP/1.1 connections kept per origin (HTTP/2 needs one).
    pub max_connections: usize,
    /// Extra PEM files of CA certificates to trust besides the system store
    /// (`--ca-cert`). `SSL_CERT_FILE` replaces the system store, as in OpenSSL.
    pub ca_certs: Vec<PathBuf>,
    /// Offer only HTTP/1.1 (no h2 in ALPN).
    pub http1_only: bool,
    /// Largest single read into memory (`get_range_vec`).
    pub max_read_bytes: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            timeout: Duration::from_secs(10),
            attempts: 3,
            backoff: Duration::from_millis(50),
            max_connections: 64,
            ca_certs: Vec::new(),
            http1_only: false,
            max_read_bytes: 8 << 30,
        }
    }
}

/// What a HEAD says about an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// Content-Length.
    pub len: u64,
    /// ETag, when sent.
    pub etag: Option<String>,
    /// `x-amz-meta-sha256`, when sent (objects published by r2-upload).
    pub sha256: Option<String>,
}

/// A blocking HTTP client shared by every read of one reader or verifier.
#[derive(Debug)]
pub struct Http {
    client: reqwest::blocking::Client,
    config: HttpConfig,
    counters: Arc<Counters>,
}

/// A sink that gathers a body into `out`, starting over when a retry sends
/// the range again from offset 0.
pub(crate) fn collect_into(out: &mut Vec<u8>) -> impl FnMut(u64, &[u8]) + '_ {
    move |off, b| {
        if off == 0 {
            out.clear();
        }
        out.extend_from_slice(b);
    }
}

/// Refuses a reversed range, or one longer than `cap`, before anything is
/// asked for or allocated.
pub(crate) fn check_read(url: &str, start: u64, end: u64, cap: u64) -> Result<()> {
    let Some(len) = end.checked_sub(start).map(|d| d.saturating_add(1)) else {
        return Err(StoreError::EmptyRange {
            url: url.into(),
            start,
            end,
        });
    };
    if len > cap {
        return Err(StoreError::TooLarge {
            url: url.into(),
            start,
            end,
            len,
            cap,
        });
    }
    Ok(())
}

/// What the Content-Range of a 206 must say.
#[derive(Clone, Copy)]
enum Expect {
    /// Exactly the range asked for, of an object of this length when known.
    Exact(Option<u64>),
    /// `bytes 0-E/T` with `E = min(end, T - 1)`: a prefix of any object.
    Prefix,
}

/// `(start, end, total)` of `bytes a-b/t`.
pub(crate) fn parse_content_range(cr: &str) -> Option<(u64, u64, u64)> {
    let (range, total) = cr.strip_prefix("bytes ")?.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?, total.parse().ok()?))
}

impl Expect {
    /// The end of the range the body covers and the object's length, or
    /// the header that was expected.
    fn check(self, cr: &str, start: u64, end: u64) -> std::result::Result<(u64, u64), String> {
        let parsed = parse_content_range(cr);
        match self {
            Expect::Exact(total) => match parsed {
                Some((a, b, t)) if a == start && b == end && total.is_none_or(|x| x == t) => {
                    Ok((end, t))
                }
                _ => Err(format!(
                    "bytes {start}-{end}/{}",
                    total.map_or("*".to_string(), |t| t.to_string())
                )),
            },
            Expect::Prefix => match parsed {
                Some((0, b, t)) if t > 0 && b == end.min(t - 1) => Ok((b, t)),
                _ => Err(format!(
                    "bytes 0-{end}/T, or bytes 0-(T-1)/T for a shorter object"
                )),
            },
        }
    }
}

enum Attempt<T> {
    Done(T),
    Retry(Failure),
    Fail(StoreError),
}

/// A failed attempt, kept for the final error.
struct Failure {
    message: String,
    timeout: bool,
    no_conversation: bool,
}

impl Failure {
    fn of(e: &reqwest::Error) -> Failure {
        Failure {
            message: describe(e),
            timeout: e.is_timeout(),
            no_conversation: e.is_connect() && !e.is_timeout(),
        }
    }
    fn msg(message: String) -> Failure {
        Failure {
            message,
            timeout: false,
            no_conversation: false,
        }
    }
}

/// The innermost cause of an error: the part that says what happened.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// A transport error in the words a user can act on.
fn describe(e: &reqwest::Error) -> String {
    let root = root_cause(e);
    if root.contains("corrupt message") || root.contains("InvalidContentType") {
        return format!(
            "the server does not speak TLS (an https:// URL sent to a plain http port? try http://): {root}"
        );
    }
    if root.contains("certificate") || root.contains("UnknownIssuer") {
        return format!(
            "TLS certificate problem: {root} (a private CA? pass --ca-cert FILE or set SSL_CERT_FILE)"
        );
    }
    if root.contains("Connection refused") {
        return format!(
            "connection refused: is the server running, and is the port right? ({root})"
        );
    }
    if e.is_timeout() {
        return format!("timed out: {root}");
    }
    root
}

/// Whether asking again could help.
fn permanent(f: &Failure) -> bool {
    f.message.starts_with("TLS certificate problem")
        || f.message.starts_with("the server does not speak TLS")
}

fn header_bytes(resp: &reqwest::blocking::Response) -> u64 {
    // "HTTP/1.1 206 Partial Content\r\n" + "name: value\r\n"... + "\r\n"
    let status = 9 + 4 + resp.status().canonical_reason().map_or(0, str::len) + 2;
    let headers: usize = resp
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + 2 + v.len() + 2)
        .sum();
    (status + headers + 2) as u64
}

fn header_str(resp: &reqwest::blocking::Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Counts every connection the client opens (a tower layer around its connector).
#[derive(Clone)]
struct CountConnections(Arc<Counters>);

impl<S> tower_layer::Layer<S> for CountConnections {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            counters: self.0.clone(),
        }
    }
}

#[derive(Clone)]
struct Counted<S> {
    inner: S,
    counters: Arc<Counters>,
}

impl<S: tower_service::Service<R>, R> tower_service::Service<R> for Counted<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }
    fn call(&mut self, req: R) -> S::Future {
        self.counters.connections.fetch_add(1, Ordering::Relaxed);
        self.inner.call(req)
    }
}

/// The TLS configuration: the system store (`SSL_CERT_FILE` when set), plus
/// the CA files given, with ALPN offering h2 then HTTP/1.1.
fn tls_config(config: &HttpConfig) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    for path in &config.ca_certs {
        let bad = |reason: String| StoreError::CaCert {
            path: path.clone(),
            reason,
        };
        let certs: Vec<_> = rustls::pki_types::pem::PemObject::pem_file_iter(path)
            .map_err(|e| bad(e.to_string()))?
            .collect::<std::result::Result<_, _>>()
            .map_err(|e: rustls::pki_types::pem::Error| bad(e.to_string()))?;
        if certs.is_empty() {
            return Err(bad("no PEM certificate in the file".into()));
        }
        for c in certs {
            roots.add(c).map_err(|e| bad(e.to_string()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Client(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = if config.http1_only {
        vec![b"http/1.1".to_vec()]
    } else {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    };
    Ok(tls)
}

impl Http {
    /// A client with `config`: no redirects followed, no compression.
    pub fn new(config: HttpConfig) -> Result<Http> {
        let counters = Arc::new(Counters::default());
        let mut b = reqwest::blocking::Client::builder()
            .use_preconfigured_tls(tls_config(&config)?)
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(config.max_connections)
            .user_agent(concat!("gkq-store/", env!("CARGO_PKG_VERSION")))
            .connector_layer(CountConnections(counters.clone()));
        if config.http1_only {
            b = b.http1_only();
        }
        let client = b.build().map_err(|e| StoreError::Client(root_cause(&e)))?;
        Ok(Http {
            client,
            config,
            counters,
        })
    }

    /// Counters so far.
    pub fn stats(&self) -> NetStats {
        self.counters.snapshot()
    }

    /// Counts reads made by another transport (S3) in the same counters.
    #[cfg_attr(not(feature = "s3"), allow(dead_code))]
    pub(crate) fn count_external(&self, requests: u64, payload: u64) {
        self.counters
            .requests
            .fetch_add(requests, Ordering::Relaxed);
        self.counters
            .payload_bytes
            .fetch_add(payload, Ordering::Relaxed);
        self.counters
            .http_bytes
            .fetch_add(payload, Ordering::Relaxed);
    }

    /// Whether a response has come over HTTP/2 (requests are multiplexed
    /// on one connection, so many can be in flight at little cost).
    pub fn multiplexed(&self) -> bool {
        self.counters.h2.load(Ordering::Relaxed)
    }

    /// The settings.
    pub fn config(&self) -> &HttpConfig {
        &self.config
    }

    fn with_retries<T>(&self, url: &str, mut f: impl FnMut() -> Attempt<T>) -> Result<T> {
        let mut delay = self.config.backoff;
        let attempts = self.config.attempts.max(1);
        let mut last = Failure::msg(String::new());
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
                Attempt::Retry(m) => {
                    let stop = permanent(&m);
                    last = m;
                    if stop {
                        return Err(StoreError::Transport {
                            url: url.to_owned(),
                            message: last.message,
                            attempts: n + 1,
                            timeout: last.timeout,
                            no_conversation: last.no_conversation,
                        });
                    }
                }
            }
        }
        Err(StoreError::Transport {
            url: url.to_owned(),
            message: last.message,
            attempts,
            timeout: last.timeout,
            no_conversation: last.no_conversation,
        })
    }

    /// Counts the response's status line and headers; a transport error
    /// becomes a failure to retry.
    fn counted(
        &self,
        r: reqwest::Result<reqwest::blocking::Response>,
    ) -> std::result::Result<reqwest::blocking::Response, Failure> {
        let resp = r.map_err(|e| Failure::of(&e))?;
        if resp.version() == reqwest::Version::HTTP_2 {
            self.counters.h2.store(true, Ordering::Relaxed);
        }
        self.counters
            .http_bytes
            .fetch_add(header_bytes(&resp), Ordering::Relaxed);
        Ok(resp)
    }

    fn transient(status: u16) -> bool {
        status >= 500 || status == 429
    }

    fn redirect(url: &str, status: u16, resp: &reqwest::blocking::Response) -> StoreError {
        StoreError::Redirect {
            url: url.into(),
            status,
            location: header_str(resp, "location").unwrap_or_default(),
        }
    }

    /// HEAD: a 200 with its Content-Length (and ETag, `x-amz-meta-sha256`).
    pub fn head(&self, url: &str) -> Result<Head> {
        self.with_retries(url, || {
            let resp = match self.counted(self.client.head(url).send()) {
                Ok(r) => r,
                Err(e) => return Attempt::Retry(e),
            };
            let status = resp.status().as_u16();
            if Self::transient(status) {
                return Attempt::Retry(Failure::msg(format!("HTTP {status}")));
            }
            if (300..400).contains(&status) {
                return Attempt::Fail(Self::redirect(url, status, &resp));
            }
            if status != 200 {
                return Attempt::Fail(StoreError::Status {
                    url: url.into(),
                    status,
                    what: "HEAD".into(),
                });
            }
            match header_str(&resp, "content-length").and_then(|v| v.parse().ok()) {
                Some(len) => Attempt::Done(Head {
                    len,
                    etag: header_str(&resp, "etag"),
                    sha256: header_str(&resp, "x-amz-meta-sha256"),
                }),
                None => Attempt::Fail(StoreError::Status {
                    url: url.into(),
                    status,
                    what: "HEAD without Content-Length".into(),
                }),
            }
        })
    }

    /// HEAD: the Content-Length of a 200.
    pub fn content_length(&self, url: &str) -> Result<u64> {
        self.head(url).map(|h| h.len)
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
        if end < start {
            return Err(StoreError::EmptyRange {
                url: url.into(),
                start,
                end,
            });
        }
        self.ranged(url, start, end, Expect::Exact(total), sink)
            .map(drop)
    }

    /// The first `max` bytes of an object (all of it when it is shorter)
    /// and its total length, read from the `Content-Range` of one ranged
    /// GET: one round trip where a HEAD and a GET would take two. The
    /// answer must be a `206` for `bytes 0-E/T` with `E = min(max, T) - 1`
    /// and a body of exactly `E + 1` bytes.
    pub fn get_prefix(&self, url: &str, max: u64) -> Result<(Vec<u8>, u64)> {
        if max == 0 || max > self.config.max_read_bytes {
            return Err(StoreError::TooLarge {
                url: url.into(),
                start: 0,
                end: max.saturating_sub(1),
                len: max,
                cap: self.config.max_read_bytes,
            });
        }
        let mut out = Vec::new();
        let total = self.ranged(url, 0, max - 1, Expect::Prefix, &mut collect_into(&mut out))?;
        Ok((out, total))
    }

    /// One ranged GET with retries; returns the object's total length as
    /// the Content-Range states it.
    fn ranged(
        &self,
        url: &str,
        start: u64,
        end: u64,
        expect: Expect,
        sink: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<u64> {
        self.with_retries(url, || {
            let range = self
                .client
                .get(url)
                .header("Range", format!("bytes={start}-{end}"))
                .send();
            let mut resp = match self.counted(range) {
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
            if Self::transient(status) {
                return Attempt::Retry(Failure::msg(format!(
                    "HTTP {status} for bytes={start}-{end}"
                )));
            }
            if (300..400).contains(&status) {
                return Attempt::Fail(Self::redirect(url, status, &resp));
            }
            if status != 206 {
                return Attempt::Fail(StoreError::Status {
                    url: url.into(),
                    status,
                    what: format!("bytes={start}-{end}"),
                });
            }
            let cr = header_str(&resp, "content-range").unwrap_or_default();
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
            let mut buf = vec![0u8; want.min(1 << 20) as usize];
            let mut got = 0u64;
            loop {
                match resp.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if got + n as u64 > want {
                            return Attempt::Fail(StoreError::BodyLength {
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
                        return Attempt::Retry(Failure::msg(format!(
                            "reading bytes={start}-{end}: {e} after {got} of {want} bytes"
                        )));
                    }
                }
            }
            if got != want {
                return Attempt::Retry(Failure::msg(
                    StoreError::BodyLength {
                        url: url.into(),
                        start,
                        end,
                        expected: want,
                        found: got,
                    }
                    .to_string(),
                ));
            }
            Attempt::Done(object_len)
        })
    }

    /// GET `bytes=start-end` into memory. The buffer grows with the bytes
    /// that arrive (never from the declared length), and a range over
    /// [`HttpConfig::max_read_bytes`] is refused before it is asked for.
    pub fn get_range_vec(
        &self,
        url: &str,
        start: u64,
        end: u64,
        total: Option<u64>,
    ) -> Result<Vec<u8>> {
        check_read(url, start, end, self.config.max_read_bytes)?;
        let mut out = Vec::new();
        self.get_range(url, start, end, total, &mut collect_into(&mut out))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refused from the arguments alone: no request is sent.
    #[test]
    fn reversed_and_oversized_ranges_are_refused_before_any_request() {
        let h = Http::new(HttpConfig {
            max_read_bytes: 1 << 20,
            ..HttpConfig::default()
        })
        .expect("client");
        let url = "http://127.0.0.1:9/x";
        assert!(matches!(
            h.get_range_vec(url, 10, 9, None),
            Err(StoreError::EmptyRange { .. })
        ));
        assert!(matches!(
            h.get_range(url, 10, 9, None, &mut |_, _| {}),
            Err(StoreError::EmptyRange { .. })
        ));
        let e = h.get_range_vec(url, 0, 4 << 40, None);
        assert!(
            matches!(e, Err(StoreError::TooLarge { cap: 1048576, .. })),
            "{e:?}"
        );
        assert_eq!(h.stats().requests, 0);
    }

    #[test]
    fn content_range_rules() {
        let exact = Expect::Exact(Some(100));
        assert_eq!(exact.check("bytes 10-19/100", 10, 19), Ok((19, 100)));
        assert!(exact.check("bytes 10-19/101", 10, 19).is_err());
        assert!(exact.check("bytes 11-20/100", 10, 19).is_err());
        assert_eq!(
            Expect::Exact(None).check("bytes 10-19/7", 10, 19),
            Ok((19, 7))
        );
        // a prefix of a longer object, and of a shorter one
        let p = Expect::Prefix;
        assert_eq!(
            p.check("bytes 0-65535/1000000", 0, 65535),
            Ok((65535, 1000000))
        );
        assert_eq!(p.check("bytes 0-4119/4120", 0, 65535), Ok((4119, 4120)));
        assert!(
            p.check("bytes 0-4118/4120", 0, 65535).is_err(),
            "short of the end"
        );
        assert!(p.check("bytes 1-4119/4120", 0, 65535).is_err());
        assert!(p.check("bytes 0-65535/*", 0, 65535).is_err());
        assert!(p.check("", 0, 65535).is_err());
    }
}
