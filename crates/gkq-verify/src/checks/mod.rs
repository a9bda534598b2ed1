//! The checks, one module each, over a shared [`Context`]: the plan of the
//! local work (every payload with its row files, every source file,
//! largest first), its run in parallel with the remote check, and the
//! report in [`CheckName`] order.

pub(crate) mod columnar;
pub(crate) mod home;
pub(crate) mod knot;
pub(crate) mod package;
pub(crate) mod quant;
pub(crate) mod remote;
pub(crate) mod signature;
pub(crate) mod source;
pub(crate) mod spectral;

use std::path::{Path, PathBuf};
use std::time::Instant;

use gkq_format::Knot;
use gkq_source::SourceModel;
use rayon::prelude::*;

use crate::error::{Result, VerifyError};
use crate::files::KnotMap;
use crate::report::{CheckFindings, CheckName, VerifyReport};
use crate::{Progress, VerifyOptions};

/// What every check reads.
pub(crate) struct Context<'a> {
    pub(crate) knot: Knot<'a>,
    /// The payloads of blocks stored in their row files (FORMAT.md 7e).
    pub(crate) homes: home::Homes,
    pub(crate) map: &'a KnotMap,
    pub(crate) dir: PathBuf,
    pub(crate) opts: &'a VerifyOptions,
    pub(crate) source: Option<std::result::Result<SourceModel, gkq_source::SourceError>>,
    pub(crate) http: Option<remote::Http>,
    pub(crate) trusted: Vec<gkq_format::sig::PublicKey>,
}

/// What the options ask for, checked before the knot is opened.
pub(crate) struct Setup {
    pub(crate) source_dir: Option<PathBuf>,
    pub(crate) http: Option<remote::Http>,
    pub(crate) trusted: Vec<gkq_format::sig::PublicKey>,
}

impl Setup {
    /// `--source` (a directory, a `.gguf` file, or ORG/NAME in the local
    /// Hugging Face cache) and `--url` (http(s), with its client).
    pub(crate) fn new(opts: &VerifyOptions) -> Result<Setup> {
        let source_dir = match &opts.source {
            Some(s) if s.is_dir() => Some(s.clone()),
            Some(s) => match gkq_source::hub::locate(s) {
                Ok(l) => Some(l.source),
                Err(_) => return Err(VerifyError::SourceNotDir { path: s.clone() }),
            },
            None => None,
        };
        let http = match &opts.url {
            Some(u) => {
                remote::check_url(u)?;
                Some(remote::client(opts)?)
            }
            None => None,
        };
        let trusted = gkq_files::load_trusted_keys(&opts.trust_keys)
            .map_err(|error| VerifyError::TrustKey { error })?;
        Ok(Setup {
            source_dir,
            http,
            trusted,
        })
    }
}

/// One local work item.
pub(crate) enum Item {
    /// A block's payload, with its row files.
    Block(usize),
    /// A source file.
    Source(usize),
}

impl Context<'_> {
    fn src(&self) -> Option<&SourceModel> {
        self.source.as_ref().and_then(|s| s.as_ref().ok())
    }

    /// Bytes an item reads from the knot or the source (the progress total).
    fn item_bytes(&self, it: &Item) -> u64 {
        match it {
            Item::Block(i) => self.knot.blocks()[*i]
                .encoding
                .payload()
                .map_or(0, |p| p.len),
            Item::Source(i) => self.src().map_or(0, |s| source::tensor_bytes(s, *i)),
        }
    }

    /// The local items, largest first (so the tail of the parallel run is
    /// short), and the bytes they read.
    pub(crate) fn plan(&self) -> (Vec<Item>, u64) {
        let blocks = self.knot.blocks();
        let mut items: Vec<Item> = (0..blocks.len())
            .filter(|&i| blocks[i].encoding.payload().is_some())
            .map(Item::Block)
            .collect();
        if let Some(src) = self.src() {
            items.extend((0..src.files.len()).map(Item::Source));
        }
        let size = |it: &Item| match it {
            Item::Block(i) => blocks[*i]
                .encoding
                .payload()
                .map_or(0, |p| p.len * (1 + blocks[*i].columnar.len() as u64)),
            Item::Source(i) => self.src().map_or(0, |s| s.files[*i].len),
        };
        items.sort_by_key(|it| std::cmp::Reverse(size(it)));
        let total = items.iter().map(|it| self.item_bytes(it)).sum();
        (items, total)
    }

    /// Runs the local items in parallel, and the remote check alongside.
    fn run(&self, items: &[Item], progress: &dyn Progress) -> Ran {
        let pages = self.map.pages();
        let (results, remote) = rayon::join(
            || {
                items
                    .par_iter()
                    .map(|it| match it {
                        Item::Block(i) => {
                            let b = knot::check_block(
                                (&self.knot, &self.homes),
                                &pages,
                                &self.dir,
                                *i,
                                progress,
                            );
                            (b.knot, b.columnar, CheckFindings::default())
                        }
                        Item::Source(i) => {
                            let src = self.src().expect("source items only when it opened");
                            let s = source::check_file(
                                (&self.knot, &self.homes),
                                &pages,
                                src,
                                *i,
                                progress,
                            );
                            (CheckFindings::default(), CheckFindings::default(), s)
                        }
                    })
                    .collect::<Vec<_>>()
            },
            || {
                let (url, http) = self.opts.url.as_ref().zip(self.http.as_ref())?;
                let (knot, bytes) = (&self.knot, self.map.bytes());
                Some(remote::check_remote(
                    http, knot, bytes, &self.dir, url, self.opts,
                ))
            },
        );
        let mut ran = Ran {
            knot: CheckFindings::default(),
            columnar: CheckFindings::default(),
            source: CheckFindings::default(),
            remote,
        };
        for (k, c, s) in results {
            ran.knot.merge(k);
            ran.columnar.merge(c);
            ran.source.merge(s);
        }
        ran
    }

    /// Every check, run and reported.
    pub(crate) fn verify(self, progress: &dyn Progress, started: Instant) -> Result<VerifyReport> {
        let (items, total) = self.plan();
        progress.start(total);
        let ran = self.run(&items, progress);
        self.report(ran, started)
    }

    /// The report, in [`CheckName`] order; an unreachable `--url` is an error.
    fn report(mut self, mut ran: Ran, started: Instant) -> Result<VerifyReport> {
        let header = self.knot.header().header();
        let n_desc: usize = header.blocks.iter().map(|b| b.columnar.len()).sum();
        let mut checks = vec![
            ran.knot.check(CheckName::Knot, started, knot::summary(&self.knot)),
            ran.columnar.check(
                CheckName::Columnar,
                started,
                format!(
                    "{n_desc} row files: size, sha256, every row against its block, exactness flags, proof objects (Merkle roots){}{}",
                    listed(header, gkq_format::keys::COLUMNAR_RUNS, "runs"),
                    listed(header, gkq_format::keys::COLUMNAR_WARM, "warm"),
                ),
            ),
        ];
        if let Some((acc, n)) = package::check(&self.knot, &self.dir) {
            let summary = format!("{n} companion files: sha256 against the knot");
            checks.push(acc.check(CheckName::Package, started, summary));
        }
        if let Some(src) = self.source.take() {
            match src {
                Err(e) => ran.source.fail(source_name(self.opts.source.as_deref()), e),
                Ok(src) => {
                    source::check_model(&self.knot, &src, &mut ran.source);
                    source::check_gguf_layout(&self.knot, &src, &self.dir, &mut ran.source);
                    source::check_companions(&self.knot, &src, &mut ran.source);
                    source::different_model(&self.knot, &mut ran.source);
                }
            }
            let summary =
                "every tensor, source file digest and companion file against the original"
                    .to_owned();
            checks.push(ran.source.check(CheckName::Source, started, summary));
        }
        if !self.trusted.is_empty() {
            let (acc, summary) = signature::check(&self);
            checks.push(acc.check(CheckName::Signature, started, summary));
        }
        if let Some(r) = ran.remote {
            if let Some((url, reason)) = r.unreachable {
                return Err(VerifyError::Unreachable { url, reason });
            }
            let mut c = r.acc.check(CheckName::Remote, started, r.summary);
            c.seconds = r.seconds;
            checks.push(c);
        }
        let bytes = checks.iter().map(|c| c.bytes).sum();
        Ok(VerifyReport {
            passed: checks.iter().all(|c| c.passed),
            checks,
            bytes,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// The findings of the local checks and the remote outcome.
struct Ran {
    knot: CheckFindings,
    columnar: CheckFindings,
    source: CheckFindings,
    remote: Option<remote::RemoteOutcome>,
}

fn source_name(p: Option<&Path>) -> String {
    p.map(|p| p.display().to_string()).unwrap_or_default()
}

/// `, N runs objects` for the N objects a `columnar.*` key lists, or nothing.
fn listed(header: &gkq_format::Header, key: &str, what: &str) -> String {
    match header.meta_list(key).map_or(0, <[String]>::len) {
        0 => String::new(),
        n => format!(", {n} {what} objects"),
    }
}
