//! The `remote` check: the published objects over plain HTTP(S).
//!
//! For `BASE_URL/model.knot` and every `BASE_URL/<row file>`:
//! a HEAD must answer 200 with the expected Content-Length; Range GETs
//! (the knot's header; the first, last and `--sample-rows` seeded-random
//! rows of each row file) must answer 206 with the right Content-Range and
//! exactly the local bytes. A 200 to a Range request is a failure, and its
//! body is never read. Redirects, timeouts and 4xx/5xx are failures naming
//! the URL. Each request is a single range: R2 and S3 do not serve
//! multi-range requests.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use gkq_format::{Knot, merkle};
use gkq_store::blocking::Runtime;
use gkq_store::{Head, RangeRead, ReadOptions, RetryPolicy, Store, StoreConfig, StoreError};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::{Acc, VerifyError, VerifyOptions};

pub(crate) struct RemoteOutcome {
    /// The server could not be reached at all: the checks did not run.
    pub(crate) unreachable: Option<(String, String)>,
    pub(crate) acc: Acc,
    pub(crate) summary: String,
    pub(crate) seconds: f64,
}

/// Rejects a base URL that is not http(s).
pub(crate) fn check_url(url: &str) -> Result<(), VerifyError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err(VerifyError::BadUrl {
            url: url.to_owned(),
            reason: "must start with http:// or https://",
        })
    }
}

/// Joins a base URL and an object name.
pub fn object_url(base: &str, object: &str) -> String {
    format!("{}/{object}", base.trim_end_matches('/'))
}

/// The HTTP client of the checks: blocking calls over the store's async
/// core. Each request has a deadline of the timeout plus its bytes at the
/// store's minimum throughput; no redirects are followed (they are
/// reported), nothing is decompressed, nothing is retried (a gate reports
/// what it saw), and the extra CA files given are trusted.
pub struct Http {
    rt: Runtime,
    store: Store,
}

const CALL: (&str, &str) = ("gkq_verify::verify with --url", "an async HTTP client");

impl Http {
    /// HEAD.
    pub fn head(&self, url: &str) -> Result<Head, StoreError> {
        self.rt.block_on(CALL.0, CALL.1, self.store.head(url))?
    }

    /// GET `bytes=start-end` (inclusive) of an object of `total` bytes.
    pub fn get_range_vec(
        &self,
        url: &str,
        start: u64,
        end: u64,
        total: Option<u64>,
    ) -> Result<Vec<u8>, StoreError> {
        let opts = ReadOptions {
            total,
            ..ReadOptions::default()
        };
        self.rt
            .block_on(CALL.0, CALL.1, self.store.read_vec(url, start, end, opts))?
    }
}

/// The HTTP client for the checks (see [`Http`]).
pub fn client(opts: &VerifyOptions) -> Result<Http, VerifyError> {
    let rt = Runtime::new(CALL.0, CALL.1).map_err(|e| VerifyError::Client(e.to_string()))?;
    let store = Store::new(StoreConfig {
        timeout: opts.timeout,
        retry: RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        },
        ca_certs: opts.ca_certs.clone(),
        ..StoreConfig::default()
    })
    .map_err(|e| VerifyError::Client(e.to_string()))?;
    Ok(Http { rt, store })
}

/// splitmix64.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// First, last and `n` seeded-random distinct rows of `rows`, sorted.
pub fn sample_rows(rows: u64, n: u64, seed: u64) -> Vec<u64> {
    let mut out = std::collections::BTreeSet::new();
    if rows == 0 {
        return Vec::new();
    }
    out.insert(0);
    out.insert(rows - 1);
    let mut st = seed;
    let want = (n + 2).min(rows);
    while (out.len() as u64) < want {
        out.insert(next(&mut st) % rows);
    }
    out.into_iter().collect()
}

enum Got {
    Ok(Vec<u8>),
    /// Stop checking this object.
    Fatal(String),
    Bad(String),
}

/// A HEAD that did not pass.
enum HeadError {
    /// No HTTP conversation at all (nothing listening, DNS, TLS).
    Transport(String),
    /// An answer, but the wrong one.
    Check(String),
}

impl HeadError {
    fn message(self) -> String {
        match self {
            HeadError::Transport(m) | HeadError::Check(m) => m,
        }
    }
}

/// HEAD: 200 and Content-Length == `expected`.
fn head(http: &Http, url: &str, expected: u64) -> Result<(), String> {
    head_typed(http, url, expected).map_err(HeadError::message)
}

fn head_typed(http: &Http, url: &str, expected: u64) -> Result<(), HeadError> {
    match http.head(url) {
        Err(e) if e.is_unreachable() => Err(HeadError::Transport(format!("HEAD failed: {e}"))),
        Err(StoreError::Redirect {
            status, location, ..
        }) => Err(HeadError::Check(format!(
            "HEAD answered a redirect (HTTP {status}) to {location}: publish the final URL"
        ))),
        Err(StoreError::Status { status, what, .. }) if what == "HEAD" => {
            Err(HeadError::Check(format!("HEAD answered HTTP {status}")))
        }
        Err(StoreError::Status { .. }) => {
            Err(HeadError::Check("HEAD has no Content-Length".into()))
        }
        Err(e) => Err(HeadError::Check(format!("HEAD failed: {e}"))),
        Ok(h) if h.len != expected => Err(HeadError::Check(format!(
            "Content-Length is {}, expected {expected}",
            h.len
        ))),
        Ok(_) => Ok(()),
    }
}

/// GET `bytes=start-end` (inclusive): 206, Content-Range `bytes start-end/total`, exact length.
fn range(http: &Http, url: &str, start: u64, end: u64, total: u64) -> Got {
    match http.get_range_vec(url, start, end, Some(total)) {
        Ok(b) => Got::Ok(b),
        Err(StoreError::IgnoresRange { .. }) => Got::Fatal(format!(
            "server ignored the Range header: HTTP 200 to bytes={start}-{end} (nodes would download all {total} bytes)"
        )),
        Err(StoreError::Status { status, .. }) => {
            Got::Fatal(format!("GET bytes={start}-{end} answered HTTP {status}"))
        }
        Err(StoreError::ContentRange {
            expected, found, ..
        }) => Got::Bad(format!("Content-Range is {found:?}, expected {expected:?}")),
        Err(e @ StoreError::BodyLength { .. }) => Got::Bad(e.to_string()),
        Err(e) => Got::Fatal(format!("GET bytes={start}-{end} failed: {e}")),
    }
}

pub(crate) fn check_remote(
    http: &Http,
    knot: &Knot<'_>,
    knot_bytes: &[u8],
    dir: &Path,
    base: &str,
    opts: &VerifyOptions,
) -> RemoteOutcome {
    let started = Instant::now();
    let mut acc = Acc::default();
    let mut requests = 0u64;

    // The knot: length and header.
    let url = object_url(base, gkq_format::KNOT_NAME);
    requests += 1;
    match head_typed(http, &url, knot_bytes.len() as u64) {
        Err(HeadError::Transport(m)) => {
            return RemoteOutcome {
                unreachable: Some((url, m)),
                acc,
                summary: String::new(),
                seconds: started.elapsed().as_secs_f64(),
            };
        }
        Err(HeadError::Check(m)) => acc.fail(url, m),
        Ok(()) => {
            let end = knot.header().header_end();
            requests += 1;
            match range(http, &url, 0, end - 1, knot_bytes.len() as u64) {
                Got::Ok(b) => {
                    acc.bytes += b.len() as u64;
                    if b != knot_bytes[..end as usize] {
                        acc.fail(
                            url,
                            format!(
                                "remote header (bytes 0-{}) differs from the local knot",
                                end - 1
                            ),
                        );
                    }
                }
                Got::Fatal(m) | Got::Bad(m) => acc.fail(url, m),
            }
        }
    }

    let mut objects = 0;
    for b in knot.blocks() {
        for d in &b.columnar {
            objects += 1;
            let url = object_url(base, &d.object);
            requests += 1;
            if let Err(m) = head(http, &url, d.byte_len) {
                acc.fail(url, m);
                continue;
            }
            let local = File::open(dir.join(&d.object)).ok();
            let rows = sample_rows(d.rows, opts.sample_rows, opts.seed);
            // the proof object (FORMAT.md 7a): length, chunk table against
            // the root, and every sampled row against its path record
            let layout = merkle::layout_of(d);
            let purl = object_url(base, &merkle::proof_object_name(&d.object));
            let mut roots = None;
            if let Some(layout) = layout {
                objects += 1;
                let plen = layout.object_len().unwrap_or(0);
                requests += 2;
                match head(http, &purl, plen) {
                    Err(m) => acc.fail(purl.clone(), m),
                    Ok(()) => match range(http, &purl, 0, layout.table_len() - 1, plen) {
                        Got::Ok(t) => {
                            acc.bytes += t.len() as u64;
                            match merkle::check_table(d, &t) {
                                Ok(r) => roots = Some(r),
                                Err(e) => acc.fail(purl.clone(), e.to_string()),
                            }
                        }
                        Got::Fatal(m) | Got::Bad(m) => acc.fail(purl.clone(), m),
                    },
                }
            }
            let per_row = if roots.is_some() { 2 } else { 1 };
            let prove = |r: u64, body: &[u8]| -> Result<u64, String> {
                let (Some(roots), Some(layout)) = (&roots, layout) else {
                    return Ok(0);
                };
                let record = match layout.records_range(r, 1) {
                    Some((s, e)) if e > s => {
                        match range(http, &purl, s, e - 1, layout.object_len().unwrap_or(0)) {
                            Got::Ok(b) => b,
                            Got::Fatal(m) | Got::Bad(m) => {
                                return Err(format!("{purl}: row {r}'s path record: {m}"));
                            }
                        }
                    }
                    _ => Vec::new(),
                };
                merkle::check_row(d, roots, r, body, &record)
                    .map_err(|e| format!("{e} (path record from {purl})"))?;
                Ok(record.len() as u64)
            };
            let fetch = |r: u64| -> Result<u64, String> {
                let (s, e) = (r * d.row_bytes, (r + 1) * d.row_bytes - 1);
                match range(http, &url, s, e, d.byte_len) {
                    Got::Fatal(m) => Err(m),
                    Got::Bad(m) => Err(format!("row {r}: {m}")),
                    Got::Ok(body) => {
                        if let Some(f) = &local {
                            let mut mine = vec![0u8; body.len()];
                            if f.read_exact_at(&mut mine, s).is_ok() && mine != body {
                                return Err(format!(
                                    "row {r} (bytes {s}-{e}) differs from the local row file"
                                ));
                            }
                        }
                        Ok(body.len() as u64 + prove(r, &body)?)
                    }
                }
            };
            // First and last row one at a time: a server that ignores Range
            // or stalls is reported once, not once per sampled row.
            let (ends, middle): (Vec<u64>, Vec<u64>) =
                rows.iter().partition(|&&r| r == 0 || r + 1 == d.rows);
            let mut stop = false;
            for r in ends {
                requests += per_row;
                match fetch(r) {
                    Ok(n) => acc.bytes += n,
                    Err(m) => {
                        acc.fail(url.clone(), m);
                        stop = true;
                        break;
                    }
                }
            }
            if stop {
                continue;
            }
            requests += per_row * middle.len() as u64;
            let results: Vec<Result<u64, String>> = middle.par_iter().map(|&r| fetch(r)).collect();
            for r in results {
                match r {
                    Ok(n) => acc.bytes += n,
                    Err(m) => acc.fail(url.clone(), m),
                }
            }
        }
    }
    // Companion files: whole, against the digest the knot records.
    for (name, want) in knot.header().header().package_files() {
        objects += 1;
        let url = object_url(base, name);
        let Ok(len) = std::fs::metadata(dir.join(name)).map(|m| m.len()) else {
            // reported by the local package check
            continue;
        };
        requests += 1;
        if let Err(m) = head(http, &url, len) {
            acc.fail(url, m);
            continue;
        }
        if len == 0 {
            continue;
        }
        requests += 1;
        match range(http, &url, 0, len - 1, len) {
            Got::Ok(body) => {
                acc.bytes += body.len() as u64;
                let got = gkq_format::hex(&Sha256::digest(&body));
                if got != *want {
                    acc.fail(url, format!("sha256 is {got}, the knot records {want}"));
                }
            }
            Got::Fatal(m) | Got::Bad(m) => acc.fail(url, m),
        }
    }
    RemoteOutcome {
        unreachable: None,
        summary: format!(
            "{} objects under {base}: HEAD Content-Length, {requests} requests with single-range GETs",
            objects + 1
        ),
        acc,
        seconds: started.elapsed().as_secs_f64(),
    }
}
