//! The `gkq-inspect` tool (its binary parses the flags and calls [`run`]): what is inside a knot, local or remote (header only).

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use gkq_cli::NetArgs;
use gkq_format::{Block, Encoding, KnotHeader, Quant, Value as MetaValue, hex};
use gkq_reader::{Reader, ReaderConfig, Serve, is_url};
use serde_json::{Value, json};

/// Show the metadata, the block table and the knot id of a GKQ v2 knot.
#[derive(Parser, Debug)]
#[command(
    name = "gkq-inspect",
    version = gkq_cli::version_line(gkq_store::FEATURES),
    after_help = "\
Examples:
  gkq-inspect out/qwen2-tiny                              a local package (a directory means its model.knot)
  gkq-inspect https://HOST/qwen/v1/model.knot --json      a published knot, as one JSON object
  gkq-inspect s3://bucket/qwen/v1/model.knot --endpoint http://127.0.0.1:8014

A URL is read the way a node opens it: one range GET of the knot's first 32 KiB (on a restart, of the header length last seen at that URL), and a second for the rest of the header when it is longer; no payload is fetched.

Output: the knot id, metadata and block table on stdout (text, or one JSON object with --json); errors on stderr.

Exit status: 0 printed; 1 the knot could not be read or is invalid (the message says which rule it breaks); 2 usage error."
)]
#[allow(missing_docs)] // clap derive: the flags' help documents them
pub(crate) struct Args {
    /// The knot: a path, a package directory, or an http(s):// or s3:// URL.
    pub(crate) knot: String,
    /// Print one JSON object.
    #[arg(short, long)]
    pub(crate) json: bool,
    /// Also pull every block of the model, verified, without computing
    /// anything (what a node's boot moves; `cargo xtask bench fleet`), and
    /// report the bytes, the time from process start and each source.
    #[arg(long)]
    pub(crate) pull: bool,
    #[command(flatten)]
    pub(crate) net: NetArgs,
}

/// Pulls every block with a payload through the reader's pull plan (every
/// part verified, the budget bounding memory): `{bytes, blocks, ready_ms}`.
fn pull_all(reader: &Reader, started: std::time::Instant) -> anyhow::Result<Value> {
    let header = reader.knot().header().header();
    let plan = header
        .blocks
        .iter()
        .filter(|b| b.encoding.payload().is_some())
        .fold(gkq_reader::PullPlan::new().budget(256 << 20), |p, b| {
            p.block(b.name.clone())
        });
    let (mut bytes, mut blocks) = (0u64, 0u64);
    for item in reader.pull(plan) {
        if let gkq_reader::Pulled::Block { bytes: b, .. } = item?.1 {
            bytes += b.len() as u64;
            blocks += 1;
        }
    }
    Ok(json!({
        "bytes": bytes,
        "blocks": blocks,
        "ready_ms": started.elapsed().as_secs_f64() * 1e3,
        "net": {"requests": reader.net_stats().requests, "payload_bytes": reader.net_stats().payload_bytes},
        "sources": reader.sources(),
    }))
}

fn meta_json(v: &MetaValue) -> Value {
    match v {
        MetaValue::U64(n) => json!(n),
        MetaValue::Bool(b) => json!(b),
        MetaValue::Str(s) => json!(s),
        MetaValue::StrList(l) => json!(l),
    }
}

fn meta_type(v: &MetaValue) -> &'static str {
    match v {
        MetaValue::U64(_) => "U64",
        MetaValue::Bool(_) => "BOOL",
        MetaValue::Str(_) => "STR",
        MetaValue::StrList(_) => "STR_LIST",
    }
}

fn encoding(b: &Block, blocks: &[Block]) -> (String, Value) {
    match &b.encoding {
        Encoding::Dense(p) => (
            "dense".into(),
            json!({"offset": p.offset, "bytes": p.len, "sha256": hex(&p.sha256)}),
        ),
        Encoding::Spectral {
            rank,
            factor_dtype,
            quant,
            payload: p,
        } => (
            format!(
                "spectral rank {rank} ({factor_dtype}{})",
                if *quant == Quant::U8Affine {
                    ", u8 affine"
                } else {
                    ""
                }
            ),
            json!({"offset": p.offset, "bytes": p.len, "sha256": hex(&p.sha256),
                   "rank": rank, "factor_dtype": factor_dtype.name(),
                   "quant": if *quant == Quant::U8Affine { 1 } else { 0 }}),
        ),
        Encoding::Alias { target } => {
            let t = blocks
                .get(*target as usize)
                .map_or("?", |t| t.name.as_str());
            (format!("alias of {t}"), json!({"alias_of": t}))
        }
    }
}

fn report(location: &str, k: &KnotHeader) -> Value {
    let h = k.header();
    let p = k.preamble();
    let metadata: serde_json::Map<String, Value> = h
        .metadata
        .iter()
        .map(|(key, v)| (key.clone(), meta_json(v)))
        .collect();
    let blocks: Vec<Value> = h
        .blocks
        .iter()
        .map(|b| {
            let (enc, body) = encoding(b, &h.blocks);
            let mut o = json!({
                "name": b.name,
                "encoding": enc,
                "dtype": b.dtype.name(),
                "shape": b.shape,
                "flags": b.flags,
                "columnar_eligible": b.is_columnar_eligible(),
                "columnar": b.columnar.iter().map(|d| json!({
                    "object": d.object, "dtype": d.dtype.name(), "rows": d.rows,
                    "row_bytes": d.row_bytes, "byte_len": d.byte_len, "sha256": hex(&d.sha256),
                    "source_exact": d.is_source_exact(), "block_exact": d.is_block_exact(),
                    "proof_height": d.proof.map(|p| p.height), "merkle_root": d.proof.map(|p| hex(&p.root)),
                })).collect::<Vec<_>>(),
            });
            if let (Some(o), Some(body)) = (o.as_object_mut(), body.as_object()) {
                o.extend(body.clone());
            }
            o
        })
        .collect();
    json!({
        "location": location,
        "knot_id": hex(&p.header_sha256),
        "file_len": p.file_len,
        "header_len": p.header_len,
        "data_offset": p.data_offset,
        "metadata": metadata,
        "blocks": blocks,
    })
}

fn human(out: &mut impl Write, location: &str, k: &KnotHeader) -> std::io::Result<()> {
    let h = k.header();
    let p = k.preamble();
    writeln!(out, "knot {location}")?;
    writeln!(out, "knot id (header sha256) {}", hex(&p.header_sha256))?;
    writeln!(
        out,
        "{} bytes: header {} bytes, payloads from offset {}",
        p.file_len, p.header_len, p.data_offset
    )?;
    writeln!(out, "\nmetadata ({} entries)", h.metadata.len())?;
    for (key, v) in &h.metadata {
        let shown = match v {
            MetaValue::StrList(l) => format!("[{}]", l.join(", ")),
            other => meta_json(other).to_string(),
        };
        writeln!(out, "  {key:<28} {:<8} {shown}", meta_type(v))?;
    }
    writeln!(out, "\nblocks ({})", h.blocks.len())?;
    writeln!(
        out,
        "  {:>4}  {:<44} {:<24} {:<6} {:<18} {:>5} {:>12}",
        "#", "name", "encoding", "dtype", "shape", "flags", "bytes"
    )?;
    for (i, b) in h.blocks.iter().enumerate() {
        let (enc, _) = encoding(b, &h.blocks);
        // FORMAT.md 7e: a block stored in its row file, not here
        let bytes = match b.encoding.payload() {
            Some(p) if b.in_row_file() => format!("{} in its row file", p.len),
            Some(p) => p.len.to_string(),
            None => "-".to_owned(),
        };
        writeln!(
            out,
            "  {i:>4}  {:<44} {:<24} {:<6} {:<18} {:>#5x} {:>12}",
            b.name,
            enc,
            b.dtype.name(),
            format!("{:?}", b.shape),
            b.flags,
            bytes
        )?;
        row_files(out, b)?;
    }
    out.flush()
}

/// Runs the tool on its flags.
pub(crate) fn run(a: &Args, started: std::time::Instant) -> anyhow::Result<()> {
    let config = ReaderConfig::try_from(a.net.clone()).map_err(anyhow::Error::msg)?;
    let reader = Reader::open(&a.knot, config, Serve::NONE)
        .with_context(|| format!("cannot inspect {}", gkq_store::url::redact(&a.knot)))?;
    let knot = reader.knot();
    let mut out = std::io::stdout().lock();
    if a.json {
        let mut v = report(&a.knot, knot.header());
        v["trusted"] = json!(knot.trusted());
        if a.pull {
            v["pull"] = pull_all(&reader, started)?;
        }
        if is_url(&a.knot) {
            let s = reader.net_stats();
            v["fetched"] = json!({"requests": s.requests, "payload_bytes": s.payload_bytes, "beyond_header": knot.beyond_header()});
        }
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        human(&mut out, &a.knot, knot.header())?;
        writeln!(out, "trust: {}", knot.trusted())?;
        if a.pull {
            let p = pull_all(&reader, started)?;
            writeln!(
                out,
                "pulled {} blocks, {} bytes, verified, ready after {:.0} ms",
                p["blocks"],
                p["bytes"],
                p["ready_ms"].as_f64().unwrap_or(0.0)
            )?;
            for src in p["sources"].as_array().into_iter().flatten() {
                writeln!(
                    out,
                    "source {}: {} requests, {} bytes{}",
                    src["base"].as_str().unwrap_or(""),
                    src["requests"],
                    src["bytes"],
                    src["dropped"]
                        .as_str()
                        .map(|d| format!(", dropped: {d}"))
                        .unwrap_or_default()
                )?;
            }
        }
        if is_url(&a.knot) {
            let s = reader.net_stats();
            writeln!(
                out,
                "\nread {} bytes in {} requests for a {}-byte header ({} bytes beyond it)",
                s.payload_bytes,
                s.requests,
                knot.header().header_end(),
                knot.beyond_header()
            )?;
        }
    }
    Ok(())
}

/// The lines of a block's row files: each one's layout, exactness and proof.
fn row_files(out: &mut impl Write, b: &gkq_format::Block) -> std::io::Result<()> {
    for d in &b.columnar {
        let records = match d.inline_proof() {
            true => format!(", each followed by its record ({} B strides)", d.stride()),
            false => String::new(),
        };
        writeln!(
            out,
            "        row file {} ({}, {} rows x {} bytes{records} = {} bytes, sha256 {})",
            d.object,
            d.dtype.name(),
            d.rows,
            d.row_bytes,
            d.byte_len,
            hex(&d.sha256)
        )?;
        let exact = match (d.is_source_exact(), d.is_block_exact()) {
            (true, true) => "SOURCE_EXACT | BLOCK_EXACT",
            (true, false) => "SOURCE_EXACT",
            (false, true) => "BLOCK_EXACT",
            (false, false) => "not exact",
        };
        match d.proof {
            Some(p) => writeln!(
                out,
                "          {exact}; proof {}.proof{}, height {}, merkle root {}",
                d.object,
                if d.inline_proof() {
                    " (its chunk table alone)"
                } else {
                    ""
                },
                p.height,
                hex(&p.root)
            )?,
            None => writeln!(out, "          {exact}; no row proof (version 2 knot)")?,
        }
    }
    Ok(())
}
