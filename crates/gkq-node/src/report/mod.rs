//! `gkq-report`: what a package costs its nodes on a publisher's own text
//! (the proposal's bandwidth report, section 8), computed from the knot's
//! row files and the texts tokenized as a node would, and with `--url`
//! measured by fetching the rows.
//!
//! Each text file is one workload named by its stem: its whole text is one
//! session, or, for `.jsonl`, one session per line (`{"text": …}`, or
//! `{"messages": [{"role", "content"}…]}` joined as `role: content` lines:
//! no chat template is applied). Tokenized with the package's
//! `tokenizer.json` (or `--tokenizer`), padding and truncation off, special
//! tokens as the tokenizer adds them.
//!
//! Per cold session (a fresh node): the rows the reader fetches (distinct
//! ids in runs merged across gaps of one row, gap rows included), their
//! Merkle records and the chunk table, for each row file of the token
//! embedding; against the row file's whole length (shipping the dense
//! matrix). The amortisation: N sessions drawn from the mix with a seeded
//! RNG on one node, warmed with the top K ids of those sessions, then every
//! cold row once (the node's LRU keeps what it fetched).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use gkq_format::ColumnarDescriptor;
use gkq_reader::{Reader, ReaderConfig, Serve};
use serde::Serialize;

use crate::NodeError;

/// What to report.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// Workload files.
    pub texts: Vec<PathBuf>,
    /// A tokenizer.json instead of the package's.
    pub tokenizer: Option<PathBuf>,
    /// Sessions drawn for the amortisation.
    pub sessions: usize,
    /// The warm set: the top K ids.
    pub warm: usize,
    /// Seed of the draw.
    pub seed: u64,
    /// Also fetch each workload's first session from the package's URL
    /// and report what the wire carried.
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
    /// Measured on the first session with `--url`: (requests, bytes).
    pub measured: Option<(u64, u64)>,
}

/// The amortisation over many sessions on one node.
#[derive(Clone, Debug, Serialize)]
pub struct Amortised {
    /// Sessions drawn.
    pub sessions: usize,
    /// The warm set's size.
    pub warm: usize,
    /// Distinct ids over every session.
    pub distinct: usize,
    /// Per row file: the warm set's bytes, the cold tail's, the total, and
    /// the percent saved against the dense matrix per session.
    pub cost: Vec<(String, u64, u64, u64, f64)>,
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
}

/// A workload: its name and the token ids of each session.
type Workload = (String, Vec<Vec<u32>>);

fn bad(what: impl Into<String>) -> NodeError {
    NodeError::Unsupported(what.into())
}

/// The embedding's row files.
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
    let files: Vec<RowFile> = block.columnar.iter().map(row_file).collect();
    if files.is_empty() {
        return Err(bad(format!(
            "block {name:?} has no row file: nothing to report"
        )));
    }
    Ok((vocab, files))
}

fn row_file(d: &ColumnarDescriptor) -> RowFile {
    let layout = gkq_format::merkle::layout_of(d);
    RowFile {
        object: d.object.clone(),
        dtype: d.dtype.to_string(),
        row_bytes: d.row_bytes,
        record_len: layout.map_or(0, |l| l.record_len()),
        table_len: layout.map_or(0, |l| l.table_len()),
        file_len: d.byte_len,
    }
}

/// Rows the reader fetches for `ids`: runs merged across a gap of one row
/// (the gap fetched too), at most 1,024 rows a run (its defaults).
pub fn fetched_rows(ids: &HashSet<u32>) -> u64 {
    let mut v: Vec<u64> = ids.iter().map(|&i| u64::from(i)).collect();
    v.sort_unstable();
    let (mut rows, mut run): (u64, Option<(u64, u64)>) = (0, None);
    for id in v {
        run = match run {
            Some((first, last)) if id <= last + 2 && id - first < 1024 => Some((first, id)),
            Some((first, last)) => {
                rows += last - first + 1;
                Some((id, id))
            }
            None => Some((id, id)),
        };
    }
    rows + run.map_or(0, |(f, l)| l - f + 1)
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

/// The sessions of one workload file.
fn sessions_of(path: &Path) -> Result<Vec<String>, NodeError> {
    let bytes = std::fs::read(path).map_err(|error| NodeError::Io {
        path: path.to_owned(),
        error,
    })?;
    let text = String::from_utf8(bytes)
        .map_err(|e| bad(format!("{}: not UTF-8 text ({e})", path.display())))?;
    if path.extension().is_some_and(|e| e == "jsonl") {
        let mut out = Vec::new();
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| bad(format!("{}:{}: {e}", path.display(), n + 1)))?;
            out.push(session_text(&v).ok_or_else(|| {
                bad(format!(
                    "{}:{}: neither {{\"text\"}} nor {{\"messages\"}}",
                    path.display(),
                    n + 1
                ))
            })?);
        }
        return Ok(out);
    }
    Ok(vec![text])
}

fn session_text(v: &serde_json::Value) -> Option<String> {
    if let Some(t) = v["text"].as_str() {
        return Some(t.to_owned());
    }
    let msgs = v["messages"].as_array()?;
    Some(
        msgs.iter()
            .map(|m| {
                format!(
                    "{}: {}",
                    m["role"].as_str().unwrap_or(""),
                    m["content"].as_str().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// xorshift64*: the seeded draw of the amortisation.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn amortise(all: &[Workload], files: &[RowFile], o: &ReportOptions) -> Amortised {
    let mut state = o.seed | 1;
    let mut drawn: Vec<&Vec<u32>> = Vec::new();
    for _ in 0..o.sessions {
        let w = &all[(next(&mut state) % all.len() as u64) as usize].1;
        drawn.push(&w[(next(&mut state) % w.len() as u64) as usize]);
    }
    let mut freq: HashMap<u32, u64> = HashMap::new();
    for s in &drawn {
        for &id in *s {
            *freq.entry(id).or_default() += 1;
        }
    }
    let mut top: Vec<(u32, u64)> = freq.iter().map(|(&k, &v)| (k, v)).collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let warm: HashSet<u32> = top.iter().take(o.warm).map(|t| t.0).collect();
    let cold: HashSet<u32> = freq.keys().copied().filter(|k| !warm.contains(k)).collect();
    let cost = files
        .iter()
        .map(|f| {
            let w = cost(f, fetched_rows(&warm), true).total;
            let c = cost(f, fetched_rows(&cold), false).total;
            let dense = f.file_len as f64 * o.sessions as f64;
            (
                f.dtype.clone(),
                w,
                c,
                w + c,
                100.0 * (1.0 - (w + c) as f64 / dense.max(1.0)),
            )
        })
        .collect();
    Amortised {
        sessions: o.sessions,
        warm: warm.len(),
        distinct: freq.len(),
        cost,
    }
}

/// Tokenizes every workload with `tokenizer_json`, checked against `vocab`.
fn tokenized(
    tokenizer_json: &[u8],
    vocab: u64,
    o: &ReportOptions,
) -> Result<Vec<Workload>, NodeError> {
    let mut t = tokenizers::Tokenizer::from_bytes(tokenizer_json)
        .map_err(|e| bad(format!("the tokenizer: {e}")))?;
    t.with_padding(None);
    let _ = t.with_truncation(None);
    let size = t.get_vocab_size(true) as u64;
    if size > vocab {
        return Err(bad(format!(
            "the tokenizer has {size} ids but the package's embedding has {vocab} rows: not this package's tokenizer (--tokenizer)"
        )));
    }
    if o.texts.is_empty() {
        return Err(bad("no texts (--texts FILE...)"));
    }
    let mut all = Vec::new();
    for path in &o.texts {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let texts = sessions_of(path)?;
        if texts.iter().all(|t| t.trim().is_empty()) {
            return Err(bad(format!(
                "{}: an empty workload (no text)",
                path.display()
            )));
        }
        let mut sessions = Vec::new();
        for text in texts {
            let enc = t
                .encode(text.as_str(), true)
                .map_err(|e| bad(format!("{}: {e}", path.display())))?;
            sessions.push(enc.get_ids().to_vec());
        }
        all.push((name, sessions));
    }
    Ok(all)
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
            "--warm {} is larger than the vocabulary ({vocab} rows)",
            o.warm
        )));
    }
    let tok = match &o.tokenizer {
        Some(p) => std::fs::read(p).map_err(|error| NodeError::Io {
            path: p.clone(),
            error,
        })?,
        None => reader
            .package_file("tokenizer.json")
            .map(|b| b.to_vec())
            .map_err(|e| {
                bad(format!(
                    "the package's tokenizer.json: {e} (give --tokenizer FILE)"
                ))
            })?,
    };
    let all = tokenized(&tok, vocab, o)?;
    let mut workloads = Vec::new();
    for (name, sessions) in &all {
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
        let measured = match (o.measure, sessions.first()) {
            (true, Some(first)) => Some(measure(location, &config, first)?),
            _ => None,
        };
        workloads.push(WorkloadLine {
            name: name.clone(),
            sessions: sessions.len(),
            tokens: sessions.iter().map(Vec::len).sum::<usize>() as f64 / n,
            distinct: distinct.iter().map(HashSet::len).sum::<usize>() as f64 / n,
            cost,
            measured,
        });
    }
    Ok(Report {
        knot_id: reader.knot_id(),
        vocab,
        files,
        amortised: amortise(&all, &row_files(&reader)?.1, o),
        workloads,
    })
}

/// A fresh node fetching one session's rows from the package's base URL
/// (the reader's default row file): (requests, payload bytes).
fn measure(location: &str, config: &ReaderConfig, ids: &[u32]) -> Result<(u64, u64), NodeError> {
    let mut c = config.clone();
    c.cache.dir = None;
    let knot = gkq_reader::is_url(location)
        .then_some(location)
        .ok_or_else(|| bad("--url needs a package URL"))?;
    c.columnar_embed = Some(gkq_store::url::sibling(knot, ""));
    let r = Reader::open(knot, c, Serve::INPUT)?;
    let before = r.net_stats();
    let ids: Vec<u64> = ids.iter().map(|&i| u64::from(i)).collect();
    r.embedding()?.rows(&ids)?;
    let s = r.net_stats().since(&before);
    Ok((s.requests, s.payload_bytes))
}

/// The report as Markdown: the proposal's tables.
pub fn markdown(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let kb = |b: u64| format!("{:.2} KB", b as f64 / 1000.0);
    let _ = writeln!(
        out,
        "Knot {}, token embedding {} rows; row files: {}.\n",
        r.knot_id,
        r.vocab,
        r.files
            .iter()
            .map(|f| format!(
                "{} ({} B/row, {} MB)",
                f.dtype,
                f.row_bytes,
                f.file_len / 1_000_000
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let heads: Vec<String> = r
        .files
        .iter()
        .map(|f| format!("{} per cold session (saved)", f.dtype))
        .collect();
    let _ = writeln!(
        out,
        "| workload | sessions | tokens | distinct ids | {} | measured (requests, bytes) |",
        heads.join(" | ")
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|{}---|",
        "---:|".repeat(heads.len())
    );
    for w in &r.workloads {
        let cells: Vec<String> = w
            .cost
            .iter()
            .map(|c| format!("{} ({:.3} %)", kb(c.total), c.saved_pct))
            .collect();
        let m = w
            .measured
            .map_or("-".to_owned(), |(q, b)| format!("{q}, {}", kb(b)));
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {} | {m} |",
            w.name,
            w.sessions,
            w.tokens,
            w.distinct,
            cells.join(" | ")
        );
    }
    let a = &r.amortised;
    let _ = writeln!(
        out,
        "\n{} sessions drawn from the mix, top-{} warm set, {} distinct ids:\n",
        a.sessions, a.warm, a.distinct
    );
    let _ = writeln!(
        out,
        "| row file | warm set | cold tail | total | saved vs dense per session |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|");
    for (d, w, c, t, s) in &a.cost {
        let _ = writeln!(
            out,
            "| {d} | {} | {} | {} | {s:.6} % |",
            kb(*w),
            kb(*c),
            kb(*t)
        );
    }
    out
}
