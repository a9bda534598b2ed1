//! `gkq-verify`: the release gate for a packed model.
//!
//! Checks, each reported with every failure it found (file, tensor, row or
//! byte range, expected vs found), one module each under `checks`:
//!
//! 1. `knot`: the structure rules of docs/FORMAT.md and every payload digest;
//! 2. `columnar`: each row file present, of the right length and digest, and
//!    every row bit-identical to the dense block after the documented cast;
//!    its proof object rebuilt and compared;
//! 3. `package`: the companion files against their digests;
//! 4. `source` (`--source`): every tensor bit-identical to the original
//!    safetensors after the documented cast, every source tensor accounted
//!    for, and the recorded source file digests;
//! 5. `remote` (`--url`): Content-Length and Range behaviour of the published
//!    objects.
//!
//! Local work is one pass per byte where it can be: a block's payload is
//! hashed in the same pass that compares it with its row files, a row file
//! is hashed while it is compared, and a source file while its tensors are
//! compared. Independent files go in parallel (rayon). Inside, the checks
//! collect typed [`Finding`]s and [`Note`]s; the report renders them.

// Findings are built once per problem found, never on a hot path: they
// stay unboxed, whatever their size.
#![allow(clippy::result_large_err)]

mod checks;
mod error;
mod files;
mod report;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gkq_format::Knot;

pub use checks::remote::{Http, client, sample_rows};
pub use checks::spectral::SPECTRAL_ERROR_TOLERANCE;
pub use error::{Result, VerifyError};
pub use files::{KnotMap, knot_path};
pub use gkq_format::progress::{NoProgress, Progress};
pub use report::{Check, CheckName, Differ, Failure, Finding, Note, RemoteFinding, VerifyReport};

/// What to verify.
#[derive(Clone, Debug)]
pub struct VerifyOptions {
    /// An output directory of gkq-pack, or the knot itself.
    pub target: PathBuf,
    /// The original the package was packed from: a Hugging Face model directory, or a GGUF file or directory of shards.
    pub source: Option<PathBuf>,
    /// Base URL where the objects are published.
    pub url: Option<String>,
    /// Random rows checked per row file over HTTP (besides first and last).
    pub sample_rows: u64,
    /// Seed of the row sample.
    pub seed: u64,
    /// Per-request timeout for `--url` (the floor of each request's deadline).
    pub timeout: Duration,
    /// Bytes per second a response must keep up with `--url` (0: only the timeout).
    pub min_throughput: u64,
    /// Extra CA certificate files (PEM) to trust for `--url` (`--ca-cert`).
    pub ca_certs: Vec<PathBuf>,
    /// Public keys (PEM) of the publishers trusted to sign the package
    /// (`--trust-key`): with any, the `signature` check runs.
    pub trust_keys: Vec<PathBuf>,
    /// The package asked for (`--package NAME`), which a signature that
    /// names a package must name; without it, the path the package is
    /// published under (`--url`, or the URL checked), else its directory
    /// (FORMAT.md 7c).
    pub package: Option<String>,
}

/// Rows sampled per row file with `--url` by default (besides the first and last).
pub const DEFAULT_SAMPLE_ROWS: u64 = 64;
/// Seed of the sampled rows by default.
pub const DEFAULT_SEED: u64 = 0x6b6e_6f74;

impl VerifyOptions {
    /// Local checks only, with the defaults.
    pub fn new(target: impl Into<PathBuf>) -> VerifyOptions {
        VerifyOptions {
            target: target.into(),
            source: None,
            url: None,
            sample_rows: DEFAULT_SAMPLE_ROWS,
            seed: DEFAULT_SEED,
            timeout: gkq_store::DEFAULT_TIMEOUT,
            min_throughput: gkq_store::DEFAULT_MIN_THROUGHPUT,
            ca_certs: Vec::new(),
            trust_keys: Vec::new(),
            package: None,
        }
    }
}

/// Runs every check that the options ask for.
pub fn verify(opts: &VerifyOptions) -> Result<VerifyReport> {
    verify_with(opts, &NoProgress)
}

/// [`verify`], reporting the bytes the local checks read to `progress`:
/// plan (the options, the knot, the work items), run (in parallel, the
/// remote check alongside), report.
pub fn verify_with(opts: &VerifyOptions, progress: &dyn Progress) -> Result<VerifyReport> {
    if let Some(url) = published(&opts.target) {
        return verify_published(url, opts, progress);
    }
    let started = Instant::now();
    let path = knot_path(&opts.target);
    let setup = checks::Setup::new(opts)?;
    let map = KnotMap::open(&path).map_err(|error| VerifyError::OpenKnot {
        path: path.clone(),
        error,
    })?;
    let knot = match Knot::parse(map.bytes()) {
        Ok(k) => k,
        Err(e) => return Ok(unparsable(&path, e, started)),
    };
    let dir = path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let cx = checks::Context {
        homes: checks::home::Homes::load(&knot, &dir),
        knot,
        map: &map,
        dir,
        opts,
        source: setup
            .source_dir
            .as_deref()
            .map(gkq_source::SourceModel::open),
        http: setup.http,
        trusted: setup.trusted,
    };
    cx.verify(progress, started)
}

/// The target when it is an http(s) URL: a published package.
fn published(target: &Path) -> Option<&str> {
    target
        .to_str()
        .filter(|t| t.starts_with("http://") || t.starts_with("https://"))
}

/// `gkq-verify URL`: the package copied from `url` into a temporary
/// directory (bounded by what its knot declares), checked there as a local
/// package, and the published objects checked as `--url` checks them.
fn verify_published(
    url: &str,
    opts: &VerifyOptions,
    progress: &dyn Progress,
) -> Result<VerifyReport> {
    if let Some(given) = &opts.url {
        return Err(VerifyError::BadUrl {
            url: given.clone(),
            reason: "the package to check is already a URL: leave --url out",
        });
    }
    let http = checks::remote::client(opts)?;
    let copy = checks::remote::fetch(&http, url, progress)?;
    drop(http);
    let local = VerifyOptions {
        target: copy.knot(),
        url: Some(copy.base.clone()),
        ..opts.clone()
    };
    let mut report = verify_with(&local, progress)?;
    // what the checks of the copy name, named by its URL: the temporary
    // directory is gone when the report is read
    let dir = format!("{}/", copy.dir.path().display());
    let base = format!("{}/", copy.base);
    for c in &mut report.checks {
        for f in c.failures.iter_mut().chain(c.notes.iter_mut()) {
            f.object = f.object.replace(&dir, &base);
            f.message = f.message.replace(&dir, &base);
        }
        c.summary = c.summary.replace(&dir, &base);
    }
    Ok(report)
}

/// The report of a knot that does not parse: the `knot` check alone.
fn unparsable(path: &Path, e: gkq_format::Error, started: Instant) -> VerifyReport {
    let mut acc = report::CheckFindings::default();
    acc.fail(path.display().to_string(), e);
    VerifyReport {
        passed: false,
        bytes: 0,
        seconds: started.elapsed().as_secs_f64(),
        checks: vec![acc.check(CheckName::Knot, started, "structure".into())],
    }
}

impl VerifyReport {
    /// Every failure, one line each: `check: object: message`.
    pub fn failure_lines(&self) -> Vec<String> {
        self.checks
            .iter()
            .flat_map(|c| {
                c.failures
                    .iter()
                    .map(move |f| format!("{}: {}: {}", c.name, f.object, f.message))
            })
            .collect()
    }
}
