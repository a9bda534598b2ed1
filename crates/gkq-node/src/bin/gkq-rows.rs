//! `gkq-rows`: read embedding rows of a published model the way a node does,
//! and show what it cost.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Parser;
use gkq_reader::{CacheStats, Embedding, NetStats, NodeArgs, Reader, ReaderConfig, Serve};
use serde_json::{Value, json};

/// `println!` that returns a closed stdout as an error instead of panicking.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($t)*)?
    }};
}

/// Fetch embedding rows of a GKQ knot (path or URL) through the runtime reader.
#[derive(Parser, Debug)]
#[command(
    name = "gkq-rows",
    version = gkq_node::version(),
    after_help = "When --columnar-embed is given but cannot be used (a typo, a server that is down, a row file of the wrong size), the embedding falls back to the knot's dense block and a warning on stderr says why and what it costs; --require-columnar makes that an error.\n\nExit status: 0 rows read; 1 error (bad ids, unreachable knot, --require-columnar refused the fallback)."
)]
struct Args {
    /// The knot: a path or an http(s) URL.
    knot: String,
    #[command(flatten)]
    embed: NodeArgs,
    /// Token ids, comma-separated.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["tokens_file", "sessions_file"])]
    tokens: Vec<u64>,
    /// A file of token ids (a JSON array, or ids separated by commas or white space).
    #[arg(long, conflicts_with = "sessions_file")]
    tokens_file: Option<PathBuf>,
    /// One JSON array of token ids per line, replayed through one warm backend.
    #[arg(long)]
    sessions_file: Option<PathBuf>,
    /// Token ids to preload before the lookups (a warm seed), comma-separated.
    #[arg(long, value_delimiter = ',')]
    warm: Vec<u64>,
    /// Print the rows as f32.
    #[arg(long)]
    f32: bool,
    /// After the lookup, repeat it N times from the warm cache and report the cost per row hit.
    #[arg(long, value_name = "N")]
    bench_hits: Option<u32>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_ids(text: &str) -> anyhow::Result<Vec<u64>> {
    let t = text.trim();
    if t.starts_with('[') {
        return Ok(serde_json::from_str(t)?);
    }
    t.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u64>()
                .with_context(|| format!("bad token id {s:?}"))
        })
        .collect()
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

/// A `--columnar-embed` that is not used is worth a warning: the dense
/// fallback downloads the whole matrix.
fn warn_fallback(a: &Args, reader: &Reader) {
    let Some(url) = &a.embed.columnar_embed else {
        return;
    };
    let Ok(e) = reader.embedding() else { return };
    let res = e.resolution();
    if res.path == gkq_reader::ReadPath::Columnar {
        return;
    }
    let bytes = reader
        .knot()
        .header()
        .header()
        .block_index(&res.tensor)
        .and_then(|i| reader.knot().header().payload_of(i))
        .map_or(0, |p| p.len);
    eprintln!(
        "gkq-rows: warning: --columnar-embed {url} is not used; the embedding is read from the knot's {:?} block ({bytes} bytes) because: {}",
        res.path, res.reason
    );
}

fn run(a: Args) -> anyhow::Result<()> {
    let config = ReaderConfig::try_from(a.embed.clone()).map_err(anyhow::Error::msg)?;
    let t0 = Instant::now();
    let reader = Reader::open(&a.knot, config, Serve::INPUT)?;
    let e = reader.embedding()?;
    let open = reader.net_stats();
    let res = e.resolution();
    let mut out = json!({
        "knot": a.knot,
        "open": { "requests": open.requests, "payload_bytes": open.payload_bytes, "http_bytes": open.http_bytes, "seconds": t0.elapsed().as_secs_f64() },
    });
    if !a.json {
        eprintln!("resolution: {:?}: {}", res.path, res.reason);
    }
    warn_fallback(&a, &reader);
    if !a.warm.is_empty() {
        let (c0, n0, t) = (e.cache_stats(), reader.net_stats(), Instant::now());
        e.warm(&a.warm)?;
        let v = counters(
            &a.warm,
            e.cache_stats().since(&c0),
            reader.net_stats().since(&n0),
            t.elapsed().as_secs_f64(),
        );
        if !a.json {
            human("warm seed", &v);
        }
        out["warm"] = v;
    }
    if let Some(path) = &a.sessions_file {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let (c0, n0, t) = (e.cache_stats(), reader.net_stats(), Instant::now());
        let mut sessions = Vec::new();
        let mut all = Vec::new();
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let ids: Vec<u64> = serde_json::from_str(line).with_context(|| {
                format!(
                    "{}:{}: not a JSON array of token ids",
                    path.display(),
                    n + 1
                )
            })?;
            let (v, _) = lookup(&reader, &e, &ids, false)?;
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
        for k in [
            "distinct_rows",
            "hits",
            "misses",
            "requests",
            "payload_bytes",
            "proof_bytes",
            "http_bytes",
            "seconds",
            "rows_fetched",
            "tokens",
            "retries",
        ] {
            out[k] = total[k].clone();
        }
        out["sessions"] = Value::Array(sessions);
    } else {
        let ids = match &a.tokens_file {
            Some(p) => parse_ids(
                &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            )?,
            None => a.tokens.clone(),
        };
        if ids.is_empty() {
            bail!("no token ids: give --tokens, --tokens-file or --sessions-file");
        }
        let (v, rows) = lookup(&reader, &e, &ids, a.f32)?;
        if !a.json {
            human("lookup", &v);
            if let Some(rows) = &rows {
                let hidden = rows.len() / ids.len();
                for (id, row) in ids.iter().zip(rows.chunks(hidden.max(1))) {
                    outln!(
                        "{id}\t{}",
                        row.iter()
                            .map(|x| format!("{x:e}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    );
                }
            }
        }
        for (k, val) in v.as_object().expect("counters are an object") {
            out[k] = val.clone();
        }
        if let Some(n) = a.bench_hits {
            let before = reader.net_stats();
            let t = Instant::now();
            for _ in 0..n {
                std::hint::black_box(e.rows(&ids)?);
            }
            let per_row =
                t.elapsed().as_secs_f64() * 1e9 / (f64::from(n.max(1)) * ids.len() as f64);
            if reader.net_stats() != before {
                bail!(
                    "--bench-hits: repeated lookups made requests (cache smaller than the token set?)"
                );
            }
            if !a.json {
                eprintln!(
                    "cache hits: {per_row:.0} ns per row ({n} repeats of {} ids)",
                    ids.len()
                );
            }
            out["lru_hit_ns_per_row"] = json!(per_row);
        }
        if let Some(rows) = rows {
            let hidden = rows.len() / ids.len();
            out["rows"] = Value::Array(rows.chunks(hidden.max(1)).map(|r| json!(r)).collect());
        }
    }
    let before = res.path;
    let res = e.resolution();
    if res.path != before {
        warn_fallback(&a, &reader);
    }
    out["resolution"] = json!({ "path": res.path, "reason": res.reason });
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else if res.path != gkq_reader::ReadPath::Columnar {
        eprintln!("resolution now: {:?}: {}", res.path, res.reason);
    }
    Ok(())
}

fn main() -> ExitCode {
    gkq_cli::init_logging();
    gkq_cli::exit("gkq-rows", run(Args::parse()))
}
