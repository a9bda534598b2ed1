//! The `remote` check (`--url`): the published objects over plain HTTP(S).
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

use gkq_format::{ColumnarDescriptor, Knot, ObjectKind, merkle};
use gkq_store::blocking::Runtime;
use gkq_store::url::join;
use gkq_store::{
    Head, RangeRead, ReadCheck, ReadChecked, ReadOptions, RetryPolicy, Store, StoreConfig,
    StoreError,
};
use rayon::prelude::*;

use crate::report::{CheckFindings, RemoteFinding};

mod copy;
mod derived;
use crate::{VerifyError, VerifyOptions};
pub(crate) use copy::fetch;

pub(crate) struct RemoteOutcome {
    /// The server could not be reached at all: the checks did not run.
    pub(crate) unreachable: Option<(String, String)>,
    pub(crate) acc: CheckFindings,
    pub(crate) summary: String,
    pub(crate) seconds: f64,
}

/// Rejects a base URL that is not http(s).
pub(crate) fn check_url(url: &str) -> Result<(), VerifyError> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(VerifyError::BadUrl {
            url: url.to_owned(),
            reason: "must start with http:// or https://",
        });
    }
    let path = url.split(['?', '#']).next().unwrap_or(url);
    if let Some((base, _)) = path
        .rsplit_once('/')
        .filter(|(_, name)| name.ends_with(".knot"))
    {
        return Err(VerifyError::KnotUrl {
            url: url.to_owned(),
            base: base.to_owned(),
        });
    }
    Ok(())
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

    /// The first `max` bytes of an object (all of it when it is shorter).
    pub fn prefix(&self, url: &str, max: u64) -> Result<Vec<u8>, StoreError> {
        let got = self
            .rt
            .block_on(CALL.0, CALL.1, self.store.read_prefix(url, max))?;
        got.map(|(bytes, _)| bytes)
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

impl Http {
    /// An object of `len` bytes, whole, checked by the store against the
    /// SHA-256 `want` (other bytes are [`StoreError::Digest`]; with this
    /// client's one attempt they are not fetched again).
    pub fn get_checked(&self, url: &str, len: u64, want: [u8; 32]) -> Result<(), StoreError> {
        let read = self
            .store
            .read_checked(url, (0, len), Some(len), ReadCheck::Sha256(want));
        self.rt.block_on(CALL.0, CALL.1, read)?.map(|_| ())
    }
}

impl Http {
    /// The signature object next to the knot at `knot_url`
    /// ([`gkq_store::read_signature`]): its first bytes, `None` when absent.
    pub fn signature(&self, knot_url: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let read = gkq_store::read_signature(&self.store, knot_url);
        Ok(self.rt.block_on(CALL.0, CALL.1, read)??.map(|(b, _)| b))
    }

    /// The first `len` bytes of `url` streamed into `path` a step at a time
    /// ([`gkq_store::copy_to_file`], unchecked: the local checks check them).
    pub fn copy_to_file(
        &self,
        url: &str,
        len: u64,
        path: &Path,
        progress: &dyn gkq_format::progress::Progress,
    ) -> Result<u64, StoreError> {
        let copy = gkq_store::copy_to_file(&self.store, url, (len, None), path, progress);
        self.rt.block_on(CALL.0, CALL.1, copy)?
    }
}

/// The HTTP client for the checks (see [`Http`]).
pub fn client(opts: &VerifyOptions) -> Result<Http, VerifyError> {
    let rt = Runtime::new(CALL.0, CALL.1).map_err(VerifyError::Client)?;
    let store = Store::new(StoreConfig {
        timeout: opts.timeout,
        min_throughput: opts.min_throughput,
        retry: RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        },
        ca_certs: opts.ca_certs.clone(),
        ..StoreConfig::default()
    })
    .map_err(VerifyError::Client)?;
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

/// A range that did not come back right: `fatal` stops checking the object.
struct Bad {
    finding: RemoteFinding,
    fatal: bool,
}

/// A HEAD that did not pass.
enum HeadErr {
    /// No HTTP conversation at all (nothing listening, DNS, TLS).
    Down(StoreError),
    /// An answer, but the wrong one.
    Bad(RemoteFinding),
}

impl HeadErr {
    /// As a finding (an unreachable server met after the knot is one too).
    fn finding(self) -> RemoteFinding {
        match self {
            HeadErr::Down(e) => RemoteFinding::HeadFailed(e),
            HeadErr::Bad(f) => f,
        }
    }
}

/// HEAD: 200 and Content-Length == `expected`.
fn head(http: &Http, url: &str, expected: u64) -> Result<(), HeadErr> {
    let bad = |f| Err(HeadErr::Bad(f));
    match http.head(url) {
        Err(e) if e.is_unreachable() => Err(HeadErr::Down(e)),
        Err(StoreError::Redirect {
            status, location, ..
        }) => bad(RemoteFinding::HeadRedirect { status, location }),
        Err(StoreError::Status { status, what, .. }) if what == "HEAD" => {
            bad(RemoteFinding::HeadStatus(status))
        }
        Err(StoreError::Status { .. }) => bad(RemoteFinding::HeadNoLength),
        Err(e) => bad(RemoteFinding::HeadFailed(e)),
        Ok(h) if h.len != expected => bad(RemoteFinding::Length {
            found: h.len,
            expected,
        }),
        Ok(_) => Ok(()),
    }
}

/// GET `bytes=start-end` (inclusive): 206, Content-Range `bytes start-end/total`, exact length.
fn range(http: &Http, url: &str, (start, end): (u64, u64), total: u64) -> Result<Vec<u8>, Bad> {
    http.get_range_vec(url, start, end, Some(total))
        .map_err(|e| bad(e, (start, end), total))
}

/// The finding of a failed GET of `bytes=start-end`.
fn bad(e: StoreError, (start, end): (u64, u64), total: u64) -> Bad {
    let fatal = |finding| Bad {
        finding,
        fatal: true,
    };
    match e {
        StoreError::IgnoresRange { .. } => fatal(RemoteFinding::IgnoresRange { start, end, total }),
        StoreError::Status { status, .. } => fatal(RemoteFinding::GetStatus { start, end, status }),
        StoreError::ContentRange {
            expected, found, ..
        } => Bad {
            finding: RemoteFinding::ContentRange { found, expected },
            fatal: false,
        },
        e @ StoreError::BodyLength { .. } => Bad {
            finding: RemoteFinding::BodyLength(e),
            fatal: false,
        },
        error => fatal(RemoteFinding::GetFailed { start, end, error }),
    }
}

/// The knot: its length and its header. Returns the requests made, or
/// the URL and message when the server could not be reached.
fn check_knot(
    http: &Http,
    knot: &Knot<'_>,
    knot_bytes: &[u8],
    base: &str,
    acc: &mut CheckFindings,
) -> Result<u64, (String, String)> {
    let url = join(base, gkq_format::KNOT_NAME);
    match head(http, &url, knot_bytes.len() as u64) {
        Err(HeadErr::Down(e)) => Err((url, RemoteFinding::HeadFailed(e).to_string())),
        Err(HeadErr::Bad(f)) => {
            acc.fail(url, f);
            Ok(1)
        }
        Ok(()) => {
            let end = knot.header().header_end();
            match range(http, &url, (0, end - 1), knot_bytes.len() as u64) {
                Ok(b) => {
                    acc.bytes += b.len() as u64;
                    if b != knot_bytes[..end as usize] {
                        acc.fail(url, RemoteFinding::HeaderDiffers { end: end - 1 });
                    }
                }
                Err(b) => acc.fail(url, b.finding),
            }
            Ok(2)
        }
    }
}

/// One row file's remote check: its length, its proof object's table, and
/// the sampled rows with their path records. Returns the objects checked
/// and the requests made.
fn check_row_file(
    http: &Http,
    (d, runs, warm): (&ColumnarDescriptor, bool, Option<&[u64]>),
    dir: &Path,
    base: &str,
    opts: &VerifyOptions,
    acc: &mut CheckFindings,
) -> (u64, u64) {
    let url = join(base, &d.object);
    let mut requests = 1;
    if let Err(f) = head(http, &url, d.byte_len) {
        acc.fail(url, f.finding());
        return (1, requests);
    }
    let proof = ProofCheck::start(http, d, base, acc, &mut requests);
    let objects = 1 + u64::from(proof.layout.is_some());
    let rows = sample_rows(d.rows, opts.sample_rows, opts.seed);
    let local = File::open(dir.join(&d.object)).ok();
    let fetch = |r: u64| fetch_row(http, d, &url, r, local.as_ref(), &proof);
    // a record inline (FORMAT.md 7e) comes in the row's own range
    let per_row = if proof.roots.is_some() && !d.inline_proof() {
        2
    } else {
        1
    };
    // First and last row one at a time: a server that ignores Range or
    // stalls is reported once, not once per sampled row.
    let (ends, middle): (Vec<u64>, Vec<u64>) =
        rows.iter().partition(|&&r| r == 0 || r + 1 == d.rows);
    for r in ends {
        requests += per_row;
        match fetch(r) {
            Ok(n) => acc.bytes += n,
            Err(f) => {
                acc.fail(url, f);
                return (objects, requests);
            }
        }
    }
    requests += per_row * middle.len() as u64;
    let results: Vec<Result<u64, RemoteFinding>> = middle.par_iter().map(|&r| fetch(r)).collect();
    for r in results {
        match r {
            Ok(n) => acc.bytes += n,
            Err(f) => acc.fail(url.clone(), f),
        }
    }
    let Some(roots) = &proof.roots else {
        return (objects, requests);
    };
    let mut done = (objects, requests);
    if runs {
        let (o, r) = derived::check_runs(http, d, base, roots, (&rows, local.as_ref()), acc);
        done = (done.0 + o, done.1 + r);
    }
    if let Some(ids) = warm {
        let (o, r) = derived::check_warm(http, d, base, ids, local.as_ref(), acc);
        done = (done.0 + o, done.1 + r);
    }
    done
}

/// A row file's proof object (FORMAT.md 7a): its length and its chunk
/// table against the root; the rows' path records are checked with them.
struct ProofCheck {
    url: String,
    layout: Option<merkle::ProofLayout>,
    roots: Option<Vec<merkle::Hash>>,
}

impl ProofCheck {
    fn start(
        http: &Http,
        d: &ColumnarDescriptor,
        base: &str,
        acc: &mut CheckFindings,
        requests: &mut u64,
    ) -> ProofCheck {
        let layout = merkle::layout_of(d);
        let url = join(base, &merkle::proof_object_name(&d.object));
        let mut roots = None;
        if let Some(layout) = layout {
            let plen = merkle::proof_object_len(d).unwrap_or(0);
            *requests += 2;
            match head(http, &url, plen) {
                Err(f) => acc.fail(url.clone(), f.finding()),
                Ok(()) => match range(http, &url, (0, layout.table_len() - 1), plen) {
                    Ok(t) => {
                        acc.bytes += t.len() as u64;
                        match merkle::check_table(d, &t) {
                            Ok(r) => roots = Some(r),
                            Err(e) => acc.fail(url.clone(), e),
                        }
                    }
                    Err(b) => acc.fail(url.clone(), b.finding),
                },
            }
        }
        ProofCheck { url, layout, roots }
    }

    /// Row `r`'s path record, checked with `body`; the bytes fetched.
    fn prove(
        &self,
        http: &Http,
        d: &ColumnarDescriptor,
        r: u64,
        body: &[u8],
    ) -> Result<u64, RemoteFinding> {
        let (Some(roots), Some(layout)) = (&self.roots, self.layout) else {
            return Ok(0);
        };
        let record = match layout.records_range(r, 1) {
            Some((s, e)) if e > s => {
                match range(
                    http,
                    &self.url,
                    (s, e - 1),
                    layout.object_len().unwrap_or(0),
                ) {
                    Ok(b) => b,
                    Err(b) => {
                        return Err(RemoteFinding::Record {
                            proof_url: self.url.clone(),
                            row: r,
                            inner: Box::new(b.finding),
                        });
                    }
                }
            }
            _ => Vec::new(),
        };
        merkle::check_row(d, roots, r, body, &record).map_err(|error| RemoteFinding::RowProof {
            error,
            proof_url: self.url.clone(),
        })?;
        Ok(record.len() as u64)
    }
}

/// Row `r`: its range, the local bytes, its proof; the bytes fetched.
fn fetch_row(
    http: &Http,
    d: &ColumnarDescriptor,
    url: &str,
    r: u64,
    local: Option<&File>,
    proof: &ProofCheck,
) -> Result<u64, RemoteFinding> {
    // with an inline proof (FORMAT.md 7e) the row's record follows it
    let stride = d.stride();
    let (s, e) = (r * stride, (r + 1) * stride - 1);
    let body = match range(http, url, (s, e), d.byte_len) {
        Ok(b) => b,
        Err(Bad {
            finding,
            fatal: true,
        }) => return Err(finding),
        Err(Bad { finding, .. }) => {
            return Err(RemoteFinding::Row {
                row: r,
                inner: Box::new(finding),
            });
        }
    };
    if let Some(f) = local {
        let mut mine = vec![0u8; body.len()];
        if f.read_exact_at(&mut mine, s).is_ok() && mine != body {
            return Err(RemoteFinding::RowDiffers {
                row: r,
                start: s,
                end: e,
            });
        }
    }
    if !d.inline_proof() {
        return Ok(body.len() as u64 + proof.prove(http, d, r, &body)?);
    }
    let (row, record) = body.split_at((d.row_bytes as usize).min(body.len()));
    if let Some(roots) = &proof.roots {
        merkle::check_row(d, roots, r, row, record).map_err(|error| RemoteFinding::RowProof {
            error,
            proof_url: url.to_owned(),
        })?;
    }
    Ok(body.len() as u64)
}

/// Companion files, whole, checked by the store against the digests the
/// knot records. Returns (objects, requests).
fn check_companions(
    http: &Http,
    knot: &Knot<'_>,
    dir: &Path,
    base: &str,
    acc: &mut CheckFindings,
) -> (u64, u64) {
    let (mut objects, mut requests) = (0, 0);
    let companions = knot.header().header().objects().into_iter();
    for o in companions.filter(|o| o.kind == ObjectKind::Companion) {
        objects += 1;
        let url = join(base, &o.name);
        let Ok(len) = std::fs::metadata(dir.join(&o.name)).map(|m| m.len()) else {
            continue; // reported by the local package check
        };
        requests += 1;
        if let Err(f) = head(http, &url, len) {
            acc.fail(url, f.finding());
            continue;
        }
        // the knot's validation makes every companion's digest 64 hex digits
        let (Some(want), true) = (o.sha256, len > 0) else {
            continue;
        };
        requests += 1;
        match http.get_checked(&url, len, want) {
            Ok(()) => acc.bytes += len,
            Err(StoreError::Digest {
                found, expected, ..
            }) => {
                acc.bytes += len;
                let recorded = expected;
                acc.fail(url, RemoteFinding::Digest { found, recorded });
            }
            Err(e) => acc.fail(url, bad(e, (0, len - 1), len).finding),
        }
    }
    (objects, requests)
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
    let mut acc = CheckFindings::default();
    let mut requests = match check_knot(http, knot, knot_bytes, base, &mut acc) {
        Ok(n) => n,
        Err(down) => {
            return RemoteOutcome {
                unreachable: Some(down),
                acc,
                summary: String::new(),
                seconds: started.elapsed().as_secs_f64(),
            };
        }
    };
    let mut objects = 0;
    let h = knot.header().header();
    let warm_rows = h.warm_rows();
    for d in knot.blocks().iter().flat_map(|b| &b.columnar) {
        let runs = h.has_runs(&d.object);
        let warm = h.has_warm(&d.object).then_some(warm_rows.as_slice());
        let (o, r) = check_row_file(http, (d, runs, warm), dir, base, opts, &mut acc);
        objects += o;
        requests += r;
    }
    let (o, r) = check_companions(http, knot, dir, base, &mut acc);
    RemoteOutcome {
        unreachable: None,
        summary: format!(
            "{} objects under {base}: HEAD Content-Length, {} requests with single-range GETs",
            objects + o + 1,
            requests + r
        ),
        acc,
        seconds: started.elapsed().as_secs_f64(),
    }
}
