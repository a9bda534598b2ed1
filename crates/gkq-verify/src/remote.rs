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

use gkq_format::Knot;
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

/// An HTTP agent for checks: one timeout for the whole of each request, no
/// redirects followed (they are reported), statuses returned rather than
/// turned into errors, no compression.
pub fn agent(timeout: std::time::Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .max_redirects(0)
        .http_status_as_error(false)
        .user_agent(concat!("gkq-verify/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
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

/// What went wrong, in the words a user can act on.
pub fn describe(e: &ureq::Error) -> String {
    let text = e.to_string();
    match e {
        ureq::Error::Timeout(t) => format!("timed out ({t})"),
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

/// Whether a request failed because no HTTP conversation was possible (no
/// server listening, DNS, TLS). A server that accepts and then stalls is up
/// but broken: that is a failed check, not this.
fn is_transport(e: &ureq::Error) -> bool {
    !matches!(e, ureq::Error::StatusCode(_) | ureq::Error::Timeout(_))
}

/// A HEAD that did not pass.
enum HeadError {
    /// No HTTP answer at all.
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
fn head(agent: &ureq::Agent, url: &str, expected: u64) -> Result<(), String> {
    head_typed(agent, url, expected).map_err(HeadError::message)
}

fn head_typed(agent: &ureq::Agent, url: &str, expected: u64) -> Result<(), HeadError> {
    let resp = agent.head(url).call().map_err(|e| {
        let m = format!("HEAD failed: {}", describe(&e));
        if is_transport(&e) {
            HeadError::Transport(m)
        } else {
            HeadError::Check(m)
        }
    })?;
    let check = |m: String| HeadError::Check(m);
    let status = resp.status().as_u16();
    if (300..400).contains(&status) {
        let to = resp
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("?");
        return Err(check(format!(
            "HEAD answered a redirect (HTTP {status}) to {to}: publish the final URL"
        )));
    }
    if status != 200 {
        return Err(check(format!("HEAD answered HTTP {status}")));
    }
    let len = resp
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match len {
        None => Err(check("HEAD has no Content-Length".into())),
        Some(l) if l != expected => {
            Err(check(format!("Content-Length is {l}, expected {expected}")))
        }
        Some(_) => Ok(()),
    }
}

/// GET `bytes=start-end` (inclusive): 206, Content-Range `bytes start-end/total`, exact length.
fn range(agent: &ureq::Agent, url: &str, start: u64, end: u64, total: u64) -> Got {
    let want = end - start + 1;
    let mut resp = match agent
        .get(url)
        .header("Range", format!("bytes={start}-{end}"))
        .call()
    {
        Ok(r) => r,
        Err(e) => return Got::Fatal(format!("GET bytes={start}-{end} failed: {}", describe(&e))),
    };
    let status = resp.status().as_u16();
    if status == 200 {
        // Do not read the body: it is the whole object.
        return Got::Fatal(format!(
            "server ignored the Range header: HTTP 200 to bytes={start}-{end} (nodes would download all {total} bytes)"
        ));
    }
    if status != 206 {
        return Got::Fatal(format!("GET bytes={start}-{end} answered HTTP {status}"));
    }
    let expected_cr = format!("bytes {start}-{end}/{total}");
    let cr = resp
        .headers()
        .get("content-range")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if cr != expected_cr {
        return Got::Bad(format!("Content-Range is {cr:?}, expected {expected_cr:?}"));
    }
    match resp.body_mut().with_config().limit(want + 1).read_to_vec() {
        Ok(b) if b.len() as u64 == want => Got::Ok(b),
        Ok(b) => Got::Bad(format!(
            "bytes={start}-{end}: body is {} bytes, expected {want}",
            b.len()
        )),
        Err(e) => Got::Bad(format!(
            "bytes={start}-{end}: reading the body failed: {}",
            describe(&e)
        )),
    }
}

pub(crate) fn check_remote(
    knot: &Knot<'_>,
    knot_bytes: &[u8],
    dir: &Path,
    base: &str,
    opts: &VerifyOptions,
) -> RemoteOutcome {
    let started = Instant::now();
    let agent = agent(opts.timeout);
    let mut acc = Acc::default();
    let mut requests = 0u64;

    // The knot: length and header.
    let url = object_url(base, gkq_format::KNOT_NAME);
    requests += 1;
    match head_typed(&agent, &url, knot_bytes.len() as u64) {
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
            match range(&agent, &url, 0, end - 1, knot_bytes.len() as u64) {
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
            if let Err(m) = head(&agent, &url, d.byte_len) {
                acc.fail(url, m);
                continue;
            }
            let local = File::open(dir.join(&d.object)).ok();
            let rows = sample_rows(d.rows, opts.sample_rows, opts.seed);
            let fetch = |r: u64| -> Result<u64, String> {
                let (s, e) = (r * d.row_bytes, (r + 1) * d.row_bytes - 1);
                match range(&agent, &url, s, e, d.byte_len) {
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
                        Ok(body.len() as u64)
                    }
                }
            };
            // First and last row one at a time: a server that ignores Range
            // or stalls is reported once, not once per sampled row.
            let (ends, middle): (Vec<u64>, Vec<u64>) =
                rows.iter().partition(|&&r| r == 0 || r + 1 == d.rows);
            let mut stop = false;
            for r in ends {
                requests += 1;
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
            requests += middle.len() as u64;
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
    let h = knot.header().header();
    let files = h
        .meta_list(gkq_format::keys::PACKAGE_FILES)
        .unwrap_or_default();
    let hashes = h
        .meta_list(gkq_format::keys::PACKAGE_SHA256)
        .unwrap_or_default();
    for (name, want) in files.iter().zip(hashes) {
        objects += 1;
        let url = object_url(base, name);
        let Ok(len) = std::fs::metadata(dir.join(name)).map(|m| m.len()) else {
            // reported by the local package check
            continue;
        };
        requests += 1;
        if let Err(m) = head(&agent, &url, len) {
            acc.fail(url, m);
            continue;
        }
        if len == 0 {
            continue;
        }
        requests += 1;
        match range(&agent, &url, 0, len - 1, len) {
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
