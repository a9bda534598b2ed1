//! `gkq-report`: what a package costs its nodes on a publisher's own text
//! (the proposal's bandwidth report, section 8), computed from the knot's
//! row files and the texts tokenized as a node would, and with `--url`
//! measured by fetching the rows.
//!
//! Workloads and tokenization are `gkq_text`'s (each file one workload
//! named by its stem; the package's `tokenizer.json` or `--tokenizer`,
//! padding and truncation off, special tokens as the tokenizer adds them).
//!
//! Per cold session (a fresh node): the rows the reader fetches (distinct
//! ids in runs merged across gaps of one row, gap rows included), their
//! Merkle records and the chunk table, for each row file of the token
//! embedding; against the row file's whole length (shipping the dense
//! matrix). The amortisation ([`Amortised`]): N sessions drawn from the mix
//! with a seeded RNG on one node, warmed first with the package's warm
//! object (FORMAT.md 7d) or, without one, the top K ids of the texts.

use std::collections::HashSet;
use std::path::PathBuf;

use gkq_format::ColumnarDescriptor;
use gkq_reader::{Reader, ReaderConfig, Serve};
use serde::Serialize;

use crate::NodeError;

mod amortise;
mod markdown;

pub use amortise::{Amortised, AmortisedCost, WarmFrom};
pub use markdown::markdown;

/// What to report.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// Workload files.
    pub texts: Vec<PathBuf>,
    /// A tokenizer.json instead of the package's.
    pub tokenizer: Option<PathBuf>,
    /// Sessions drawn for the amortisation.
    pub sessions: usize,
    /// The warm set's size when the package has no warm object: the top K
    /// ids of the texts (also reported as `warm_ids`, for `gkq-pack
    /// --warm-ids`).
    pub warm: usize,
    /// Seed of the draw.
    pub seed: u64,
    /// Also fetch from the package's URL and report what the wire carried.
    pub measure: bool,
}

/// One row file of the token embedding.
#[derive(Clone, Debug, Serialize)]
pub struct RowFile {
    /// The object.
    pub object: String,
    /// Its dtype.
    pub dtype: String,
    /// Bytes per row.
    pub row_bytes: u64,
    /// Bytes of a row's Merkle record.
    pub record_len: u64,
    /// Bytes of the chunk table (once per node).
    pub table_len: u64,
    /// The whole file: shipping the dense matrix.
    pub file_len: u64,
    /// Requests per run of rows: 1 from a runs object or a row file with
    /// its records inline, 2 from the row file and its proof object.
    pub requests_per_run: u64,
    /// Its warm object's length, when the package has one.
    pub warm_len: Option<u64>,
}

/// A cost on one row file.
#[derive(Clone, Debug, Serialize)]
pub struct Cost {
    /// The row file's dtype.
    pub dtype: String,
    /// Row bytes fetched.
    pub rows: u64,
    /// Record and chunk-table bytes.
    pub proof: u64,
    /// Both.
    pub total: u64,
    /// Percent saved against shipping the dense matrix (per session).
    pub saved_pct: f64,
}

/// What a node fetched on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Measured {
    /// Requests.
    pub requests: u64,
    /// Round trips: requests sent together count once, each answer waited
    /// for before the next request once more (connection handshakes apart).
    pub round_trips: u64,
    /// Payload bytes.
    pub bytes: u64,
}

/// One workload's line.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadLine {
    /// The file's stem.
    pub name: String,
    /// Sessions in the file.
    pub sessions: usize,
    /// Tokens per session (mean).
    pub tokens: f64,
    /// Distinct ids per session (mean).
    pub distinct: f64,
    /// Mean cost of a cold session, per row file.
    pub cost: Vec<Cost>,
    /// With `--url`: each session of the workload fetched by a fresh node
    /// given the package's URL, the mean per session (comparable with
    /// `cost` on the row file that node reads, `measured_object`).
    pub measured: Option<Measured>,
    /// The row file the measured nodes read.
    pub measured_object: Option<String>,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The knot id.
    pub knot_id: String,
    /// The embedding's rows.
    pub vocab: u64,
    /// The row files.
    pub files: Vec<RowFile>,
    /// One line per workload.
    pub workloads: Vec<WorkloadLine>,
    /// The amortisation.
    pub amortised: Amortised,
    /// The top K ids of the texts, most needed first (what `gkq-pack
    /// --warm-set K --warm-corpus` with these texts would choose; `gkq-pack
    /// --warm-ids` takes this report's JSON).
    pub warm_ids: Vec<u32>,
}

/// A workload: its name and the token ids of each session.
pub(crate) type Workload = (String, Vec<Vec<u32>>);

fn bad(what: impl Into<String>) -> NodeError {
    NodeError::Unsupported(what.into())
}

/// The embedding's row files, with the warm rows the package lists.
fn row_files(reader: &Reader) -> Result<(u64, Vec<RowFile>), NodeError> {
    let h = reader.knot().header().header();
    let name = h
        .meta_str(gkq_format::keys::ROLE_TOKEN_EMBD)
        .ok_or_else(|| bad("the knot names no token embedding (role.token_embd)"))?;
    let block = h
        .blocks
        .iter()
        .find(|b| b.name == name)
        .ok_or_else(|| bad(format!("no block {name:?}")))?;
    let vocab = block.shape.first().copied().unwrap_or(0);
    let warm = h.warm_rows().len() as u64;
    let files: Vec<RowFile> = block
        .columnar
        .iter()
        .map(|d| {
            row_file(
                d,
                h.has_runs(&d.object),
                h.has_warm(&d.object).then_some(warm),
            )
        })
        .collect();
    if files.is_empty() {
        return Err(bad(format!(
            "block {name:?} has no row file: nothing to report"
        )));
    }
    Ok((vocab, files))
}

fn row_file(d: &ColumnarDescriptor, runs: bool, warm: Option<u64>) -> RowFile {
    let layout = gkq_format::merkle::layout_of(d);
    let record_len = layout.map_or(0, |l| l.record_len());
    RowFile {
        object: d.object.clone(),
        dtype: d.dtype.to_string(),
        row_bytes: d.row_bytes,
        record_len,
        table_len: layout.map_or(0, |l| l.table_len()),
        file_len: d.byte_len,
        // one range per run from a runs object or a row file with its
        // records inline (FORMAT.md 7e)
        requests_per_run: if runs || d.inline_proof() || record_len == 0 {
            1
        } else {
            2
        },
        warm_len: warm
            .and_then(|k| gkq_format::warm::WarmLayout::of(d, k))
            .and_then(|l| l.object_len()),
    }
}

/// The runs the reader fetches for `ids` (its defaults: merged across a
/// gap of one row, at most 1,024 rows a run).
pub(crate) fn runs_of(ids: &HashSet<u32>) -> Vec<gkq_reader::ranges::RowRun> {
    let mut v: Vec<u64> = ids.iter().map(|&i| u64::from(i)).collect();
    v.sort_unstable();
    let f = gkq_reader::FetchConfig::default();
    gkq_reader::ranges::coalesce(&v, f.max_gap_rows, f.max_run_rows)
}

/// Rows the reader fetches for `ids`, gap rows included.
pub fn fetched_rows(ids: &HashSet<u32>) -> u64 {
    runs_of(ids).iter().map(|r| r.count).sum()
}

fn cost(f: &RowFile, rows: u64, table: bool) -> Cost {
    let r = rows * f.row_bytes;
    let p = rows * f.record_len + if table { f.table_len } else { 0 };
    Cost {
        dtype: f.dtype.clone(),
        rows: r,
        proof: p,
        total: r + p,
        saved_pct: 100.0 * (1.0 - (r + p) as f64 / f.file_len.max(1) as f64),
    }
}

/// Tokenizes every workload with the package's tokenizer (its
/// tokenizer.json, or the GGUF tokenizer of its metadata.gguf), or
/// `o.tokenizer`, checked against `vocab`.
fn tokenized(reader: &Reader, vocab: u64, o: &ReportOptions) -> Result<Vec<Workload>, NodeError> {
    let listed = reader.knot().header().header().package_file_names();
    let read = |name: &str| reader.package_file(name).map(|b| b.to_vec());
    let t = gkq_text::Tokenizer::of_package(o.tokenizer.as_deref(), listed, read, vocab)?;
    let workloads = gkq_text::Workload::load_all(&o.texts)?;
    Ok(t.encode_all(&workloads)?)
}

/// One workload's line: the mean cold-session cost on each row file.
fn workload_line(
    (name, sessions): &Workload,
    files: &[RowFile],
    measured: Option<(String, Measured)>,
) -> WorkloadLine {
    let n = sessions.len() as f64;
    let distinct: Vec<HashSet<u32>> = sessions
        .iter()
        .map(|s| s.iter().copied().collect())
        .collect();
    let rows: Vec<u64> = distinct.iter().map(fetched_rows).collect();
    let cost = files
        .iter()
        .map(|f| {
            let mut c = cost(f, 0, true);
            let per: Vec<Cost> = rows.iter().map(|&r| cost(f, r, true)).collect();
            c.rows = per.iter().map(|p| p.rows).sum::<u64>() / per.len().max(1) as u64;
            c.proof = per.iter().map(|p| p.proof).sum::<u64>() / per.len().max(1) as u64;
            c.total = c.rows + c.proof;
            c.saved_pct = per.iter().map(|p| p.saved_pct).sum::<f64>() / n.max(1.0);
            c
        })
        .collect();
    WorkloadLine {
        name: name.clone(),
        sessions: sessions.len(),
        tokens: sessions.iter().map(Vec::len).sum::<usize>() as f64 / n,
        distinct: distinct.iter().map(HashSet::len).sum::<usize>() as f64 / n,
        cost,
        measured_object: measured.as_ref().map(|m| m.0.clone()),
        measured: measured.map(|m| m.1),
    }
}

/// Each session on a fresh node: the row file read and the mean per
/// session, rounded.
fn measure_each(
    location: &str,
    config: &ReaderConfig,
    sessions: &[Vec<u32>],
) -> Result<Option<(String, Measured)>, NodeError> {
    let (mut object, mut sum) = (String::new(), Measured::default());
    for s in sessions {
        let (o, _, m) = amortise::measure(location, config, (false, &[]), [s.as_slice()])?;
        object = o;
        sum.requests += m.requests;
        sum.round_trips += m.round_trips;
        sum.bytes += m.bytes;
    }
    let n = sessions.len() as u64;
    let mean = |v: u64| (v + n / 2) / n.max(1);
    Ok((n > 0).then(|| {
        let m = Measured {
            requests: mean(sum.requests),
            round_trips: mean(sum.round_trips),
            bytes: mean(sum.bytes),
        };
        (object, m)
    }))
}

/// The report of the package at `location` on the texts of `o`.
pub fn report(
    location: &str,
    config: ReaderConfig,
    o: &ReportOptions,
) -> Result<Report, NodeError> {
    let reader = Reader::open(location, config.clone(), Serve::NONE)?;
    let (vocab, files) = row_files(&reader)?;
    if o.warm as u64 > vocab {
        return Err(bad(format!(
            "--warm-set {} is larger than the vocabulary ({vocab} rows)",
            o.warm
        )));
    }
    let all = tokenized(&reader, vocab, o)?;
    let mut workloads = Vec::new();
    for w in &all {
        let measured = match o.measure {
            true => measure_each(location, &config, &w.1)?,
            false => None,
        };
        workloads.push(workload_line(w, &files, measured));
    }
    let sessions = all.iter().flat_map(|(_, s)| s.iter().map(Vec::as_slice));
    let warm_ids = gkq_text::warm_set(sessions, o.warm);
    let package_warm = reader.knot().header().header().warm_rows();
    let amortised = amortise::amortise(&all, &files, (&package_warm, &warm_ids), o);
    let amortised = match o.measure {
        true => amortise::measured(
            amortised,
            location,
            &config,
            (&all, &package_warm, &warm_ids),
            o,
        )?,
        false => amortised,
    };
    Ok(Report {
        knot_id: reader.knot_id(),
        vocab,
        files,
        workloads,
        amortised,
        warm_ids,
    })
}
