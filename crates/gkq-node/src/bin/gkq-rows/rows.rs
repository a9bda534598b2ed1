//! The `gkq-rows` tool (its binary parses the flags and calls [`run`]): read embedding rows of a published model the way a node does,
//! and show what it cost.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Parser;
use gkq_cli::NodeArgs;
use gkq_reader::{CacheStats, Embedding, NetStats, Reader, ReaderConfig, Serve};
use serde_json::{Value, json};

/// `println!` that returns a closed stdout as an error instead of panicking.
macro_rules! outln {
    ($($t:tt)*) => {{
        gkq_cli::print_line(format_args!($($t)*))?
    }};
}

const AFTER_HELP: &str = "\
Examples:
  gkq-rows out/qwen2-tiny --tokens 1,2,3 --f32
      rows of a local package (a directory means its model.knot), printed as f32
  gkq-rows https://HOST/qwen/v1/model.knot -t 9707,11,1879 --json
      the narrowest exact row file next to the published knot, verified row by row
  gkq-rows https://HOST/qwen/v1/model.knot --columnar-embed https://CDN/qwen/v1/ -t 9707,11,1879
      the row files from another host (a CDN, a copy); --dense reads the knot's block instead
  gkq-rows https://HOST/qwen/v1/model.knot --knot-id 2e1e52fc… --sessions-file sessions.jsonl
      replay sessions through one warm cache, pinned to a knot id

Output: the report (resolution, requests, bytes, time) goes to stderr; stdout gets the rows with --f32 (one line per id: ID<TAB>values) or one JSON object with --json, and nothing otherwise.

A package is a directory: the row files the knot names are read next to it. When they cannot be used (a typo in --columnar-embed, a server that is down, a row file of the wrong size, a missing or damaged proof object), the embedding falls back to the knot's dense block and a warning on stderr says why and what it costs; --require-columnar makes that an error.

Exit status: 0 rows read; 1 error (bad ids, unreachable knot, --require-columnar refused the fallback); 2 usage error.";

/// Token ids: commas and/or white space (`1,2`, `1, 2`, `1 2`), or a JSON array.
/// Token ids as given on the command line.
#[derive(Clone, Debug)]
pub(crate) struct Ids(Vec<u64>);

fn ids_arg(text: &str) -> Result<Ids, String> {
    parse_ids(text).map(Ids).map_err(|e| format!("{e:#}"))
}

/// Fetch embedding rows of a GKQ knot (path, directory or URL) the way a
/// node does, and report what it cost.
#[derive(Parser, Debug)]
#[command(
    name = "gkq-rows",
    version = gkq_cli::version_line(gkq_store::FEATURES),
    after_help = AFTER_HELP,
    group = clap::ArgGroup::new("ids").required(true).args(["tokens", "tokens_file", "sessions_file"])
)]
#[allow(missing_docs)] // clap derive: the flags' help documents them
pub(crate) struct Args {
    /// The knot: a path, a package directory, or an http(s):// or s3:// URL.
    pub(crate) knot: String,
    #[command(flatten)]
    pub(crate) embed: NodeArgs,
    /// Token ids, comma- or space-separated.
    #[arg(short, long, value_name = "IDS", value_parser = ids_arg, help_heading = "Input")]
    pub(crate) tokens: Option<Ids>,
    /// A file of token ids (a JSON array, or ids separated by commas or white space).
    #[arg(long, value_name = "FILE", help_heading = "Input")]
    pub(crate) tokens_file: Option<PathBuf>,
    /// One JSON array of token ids per line, replayed through one warm backend.
    #[arg(long, value_name = "FILE", help_heading = "Input")]
    pub(crate) sessions_file: Option<PathBuf>,
    /// Token ids to fetch before the lookups (a hand-made warm seed; --warm
    /// takes the package's own warm object instead).
    #[arg(long, value_name = "IDS", value_parser = ids_arg, help_heading = "Input")]
    pub(crate) prefetch: Option<Ids>,
    /// Print the rows as f32 on stdout.
    #[arg(long, help_heading = "Output")]
    f32: bool,
    /// After the lookup, repeat it N times from the warm cache and report the cost per row hit.
    #[arg(long, value_name = "N", help_heading = "Output")]
    pub(crate) bench_hits: Option<u32>,
    /// Print one JSON object on stdout.
    #[arg(long, help_heading = "Output")]
    pub(crate) json: bool,
}

/// Token ids as written (gkq-text's one parser of them).
fn parse_ids(text: &str) -> anyhow::Result<Vec<u64>> {
    Ok(gkq_text::parse_ids(text)?)
}

fn counters(ids: &[u64], cache: CacheStats, net: NetStats, seconds: f64) -> Value {
    let distinct: std::collections::HashSet<_> = ids.iter().collect();
    json!({
        "tokens": ids.len(),
        "distinct_rows": distinct.len(),
        "hits": cache.hits,
        "misses": cache.misses,
        "rows_fetched": cache.rows_fetched,
        "rows_rejected": cache.rows_rejected,
        "requests": net.requests,
        "proof_bytes": cache.proof_bytes,
        "payload_bytes": net.payload_bytes,
        "http_bytes": net.http_bytes,
        "retries": net.retries,
        "round_trips": net.round_trips,
        "seconds": seconds,
    })
}

fn lookup(
    r: &Reader,
    e: &Embedding,
    ids: &[u64],
    want_rows: bool,
) -> anyhow::Result<(Value, Option<Vec<f32>>)> {
    let (c0, n0, t) = (e.cache_stats(), r.net_stats(), Instant::now());
    let rows = e.rows(ids)?;
    let secs = t.elapsed().as_secs_f64();
    let v = counters(
        ids,
        e.cache_stats().since(&c0),
        r.net_stats().since(&n0),
        secs,
    );
    Ok((
        v,
        if want_rows {
            Some(rows.to_f32()?)
        } else {
            None
        },
    ))
}

fn human(label: &str, v: &Value) {
    eprintln!(
        "{label}: {} tokens, {} distinct rows, {} hits, {} misses, {} requests, {} payload bytes (of which {} proof), {} HTTP bytes, {:.4}s",
        v["tokens"],
        v["distinct_rows"],
        v["hits"],
        v["misses"],
        v["requests"],
        v["payload_bytes"],
        v["proof_bytes"],
        v["http_bytes"],
        v["seconds"].as_f64().unwrap_or(0.0)
    );
}

/// Row files that are not used are worth a warning: the dense fallback
/// downloads the whole matrix.
fn warn_fallback(a: &Args, reader: &Reader) {
    let Ok(e) = reader.embedding() else { return };
    let res = e.resolution();
    if !res.rows_unused() {
        return;
    }
    let rows = a.embed.columnar_embed.as_ref().map_or_else(
        || "the row files next to the knot are".to_owned(),
        |url| format!("--columnar-embed {url} is"),
    );
    let bytes = reader
        .knot()
        .header()
        .header()
        .block_index(&res.tensor)
        .map_or(0, |i| reader.knot().header().payload_len(i));
    eprintln!(
        "gkq-rows: warning: {rows} not used; the embedding is read from the knot's {:?} block ({bytes} bytes) because: {}",
        res.kind(),
        res.reason()
    );
}

/// `--prefetch`: fetches rows ahead, and reports what that cost.
fn prefetch(a: &Args, reader: &Reader, e: &Embedding, out: &mut Value) -> anyhow::Result<()> {
    let Some(Ids(ids)) = &a.prefetch else {
        return Ok(());
    };
    let (c0, n0, t) = (e.cache_stats(), reader.net_stats(), Instant::now());
    e.prefetch(ids)?;
    let v = counters(
        ids,
        e.cache_stats().since(&c0),
        reader.net_stats().since(&n0),
        t.elapsed().as_secs_f64(),
    );
    if !a.json {
        human("prefetch", &v);
    }
    out["prefetch"] = v;
    Ok(())
}

/// `--warm`: what seeding the cache with the warm object did at open.
fn warmed(a: &Args, e: &Embedding, out: &mut Value) {
    let Some(w) = e.warm_report() else { return };
    if !a.json {
        match &w.unused {
            None => eprintln!(
                "warm: {} of {} warm rows seeded ({} from the disk cache, {} rejected), {} requests, {} bytes",
                w.seeded, w.listed, w.from_disk, w.rejected, w.requests, w.bytes
            ),
            Some(why) => eprintln!("gkq-rows: warning: --warm: the warm object is not used: {why}"),
        }
    }
    out["warm"] = json!(w);
}

/// `--sessions-file`: one lookup per line through one warm backend.
fn sessions(
    a: &Args,
    path: &Path,
    reader: &Reader,
    e: &Embedding,
    out: &mut Value,
) -> anyhow::Result<()> {
    let text = gkq_files::read_text(
        path,
        gkq_text::MAX_WORKLOAD_BYTES,
        "a sessions file",
        gkq_files::Follow::Yes,
    )?;
    let (c0, n0, t) = (e.cache_stats(), reader.net_stats(), Instant::now());
    let mut sessions = Vec::new();
    let mut all = Vec::new();
    let lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    for (n, line) in lines {
        let ids: Vec<u64> = serde_json::from_str(line).with_context(|| {
            format!(
                "{}:{}: not a JSON array of token ids",
                path.display(),
                n + 1
            )
        })?;
        let (v, _) = lookup(reader, e, &ids, false)?;
        if !a.json {
            human(&format!("session {}", sessions.len() + 1), &v);
        }
        all.extend_from_slice(&ids);
        sessions.push(v);
    }
    let total = counters(
        &all,
        e.cache_stats().since(&c0),
        reader.net_stats().since(&n0),
        t.elapsed().as_secs_f64(),
    );
    if !a.json {
        human("total", &total);
    }
    for (k, val) in total.as_object().expect("counters are an object") {
        out[k] = val.clone();
    }
    out["sessions"] = Value::Array(sessions);
    Ok(())
}

/// `--tokens`/`--tokens-file`: one lookup, the rows on stdout with `--f32`.
fn tokens(a: &Args, reader: &Reader, e: &Embedding, out: &mut Value) -> anyhow::Result<()> {
    let ids = match (&a.tokens_file, &a.tokens) {
        (Some(p), _) => parse_ids(&gkq_files::read_text(
            p,
            gkq_text::MAX_SESSION_BYTES,
            "a tokens file",
            gkq_files::Follow::Yes,
        )?)?,
        (None, Some(Ids(ids))) => ids.clone(),
        (None, None) => Vec::new(),
    };
    if ids.is_empty() {
        bail!("no token ids: give --tokens, --tokens-file or --sessions-file");
    }
    let (v, rows) = lookup(reader, e, &ids, a.f32)?;
    if !a.json {
        human("lookup", &v);
        if let Some(rows) = &rows {
            let hidden = rows.len() / ids.len();
            for (id, row) in ids.iter().zip(rows.chunks(hidden.max(1))) {
                let values: Vec<String> = row.iter().map(|x| format!("{x:e}")).collect();
                outln!("{id}\t{}", values.join(" "));
            }
        }
    }
    for (k, val) in v.as_object().expect("counters are an object") {
        out[k] = val.clone();
    }
    if let Some(n) = a.bench_hits {
        out["lru_hit_ns_per_row"] = json!(bench_hits(a, reader, e, &ids, n)?);
    }
    if let Some(rows) = rows {
        let hidden = rows.len() / ids.len();
        out["rows"] = Value::Array(rows.chunks(hidden.max(1)).map(|r| json!(r)).collect());
    }
    Ok(())
}

/// `--bench-hits N`: nanoseconds per row served from the warm cache.
fn bench_hits(
    a: &Args,
    reader: &Reader,
    e: &Embedding,
    ids: &[u64],
    n: u32,
) -> anyhow::Result<f64> {
    let before = reader.net_stats();
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(e.rows(ids)?);
    }
    let per_row = t.elapsed().as_secs_f64() * 1e9 / (f64::from(n.max(1)) * ids.len() as f64);
    if reader.net_stats() != before {
        bail!("--bench-hits: repeated lookups made requests (cache smaller than the token set?)");
    }
    if !a.json {
        eprintln!(
            "cache hits: {per_row:.0} ns per row ({n} repeats of {} ids)",
            ids.len()
        );
    }
    Ok(per_row)
}

/// Runs the tool on its flags.
pub(crate) fn run(a: Args) -> anyhow::Result<()> {
    let config = ReaderConfig::try_from(a.embed.clone()).map_err(anyhow::Error::msg)?;
    let t0 = Instant::now();
    let reader = Reader::open(&a.knot, config, Serve::INPUT)?;
    let e = reader.embedding()?;
    let open = reader.net_stats();
    let res = e.resolution();
    let mut out = json!({
        "knot": a.knot,
        "open": { "requests": open.requests, "payload_bytes": open.payload_bytes, "http_bytes": open.http_bytes, "beyond_header": reader.knot().beyond_header(), "seconds": t0.elapsed().as_secs_f64(), "trusted": reader.knot().trusted(), "header_from": reader.knot().header_from() },
    });
    if !a.json {
        eprintln!("knot {}: {}", reader.knot_id(), reader.knot().trusted());
        if let Some(from) = reader.knot().header_from() {
            eprintln!("knot header from {from}");
        }
        eprintln!("resolution: {:?}: {}", res.kind(), res.reason());
    }
    warn_fallback(&a, &reader);
    warmed(&a, &e, &mut out);
    prefetch(&a, &reader, &e, &mut out)?;
    match &a.sessions_file {
        Some(path) => sessions(&a, path, &reader, &e, &mut out)?,
        None => tokens(&a, &reader, &e, &mut out)?,
    }
    let before = res.kind();
    let res = e.resolution();
    if res.kind() != before {
        warn_fallback(&a, &reader);
    }
    out["resolution"] = json!({ "path": res.kind(), "reason": res.reason() });
    if a.json {
        if !a.embed.net.mirrors.is_empty() {
            out["sources"] = json!(reader.sources());
        }
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else if res.kind() != gkq_reader::PathKind::Columnar {
        eprintln!("resolution now: {:?}: {}", res.kind(), res.reason());
    }
    Ok(())
}
