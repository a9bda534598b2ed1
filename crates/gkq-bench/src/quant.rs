//! `cargo xtask bench quant` (issue 29): what a node pays for a quantized
//! package against the bf16 one, in one run on the setup of `bench
//! coldstart` (nginx TLS + HTTP/2, 25 MB/s per response, a 100 MB/s link
//! with 20 ms RTT, bytes counted at the proxy). The qwen2.5-0.5b preset
//! packed bf16, q8_0 and q4_0 (its lm_head, the tied embedding, in q4_0
//! too); a Llama-shaped preset (hidden 1024) bf16 and q4_k; then, without
//! a target, the logits' error against the bf16 decode and per-tensor RMSE
//! of every type on real MiniLM.

use std::process::Command;

use anyhow::{Context, bail};
use fixtures::servers::{Nginx, NginxOptions, WireStats};
use serde_json::Value;

use super::coldstart::{self, Measured, SLOW, Site};
use super::common::{bench_dir, dir_bytes, model, pack_args, preset, release_bin};

/// The qwen2.5-0.5b packages: directory, gkq-pack flags, what it is.
const QWEN: [(&str, &[&str], &str); 3] = [
    (
        "quant-bf16",
        &["--dtype", "bf16"],
        "bf16 (the tied lm_head is the bf16 embedding)",
    ),
    (
        "quant-q8_0",
        &["--quant", "q8_0"],
        "--quant q8_0 (the tied embedding = lm_head in q8_0)",
    ),
    (
        "quant-q4_0",
        &["--quant", "q4_0", "--output-tensor-type", "q4_0"],
        "--quant q4_0 --output-tensor-type q4_0 (embedding = lm_head in q4_0)",
    ),
];

/// The Llama-shaped packages (hidden 1024: Q4_K applies).
const LLAMA: [(&str, &[&str], &str); 2] = [
    ("quant-llama-bf16", &["--dtype", "bf16"], "bf16, untied"),
    (
        "quant-llama-q4_k",
        &["--quant", "q4_k", "--pure", "--output-tensor-type", "q6_k"],
        "--quant q4_k --pure --output-tensor-type q6_k (every matrix and the embedding q4_k, lm_head q6_k)",
    ),
];

/// New tokens of the local decodes that time tokens per second.
const TOKENS: &str = "33";

fn mb(b: f64) -> String {
    format!("{:.1}", b / 1e6)
}

/// A local decode of `pack`'s files (no network): tokens per second, and
/// the first step's logits.
fn local(pack: &str) -> anyhow::Result<(Measured, Vec<f32>)> {
    let knot = bench_dir().join(pack).join("model.knot");
    let logits = bench_dir().join(format!("{pack}.logits"));
    let prompt = coldstart::prompt();
    let l = logits.display().to_string();
    let args = [
        "--no-cache",
        "--prompt-ids",
        &prompt,
        "--max-new-tokens",
        TOKENS,
        "--logits-out",
        &l,
        "--json",
    ];
    let m = coldstart::decode(&knot.display().to_string(), &args, WireStats::default)?;
    let bytes = std::fs::read(&logits)?;
    let v = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((m, v))
}

/// What one package measured.
struct Row {
    pack: &'static str,
    disk: u64,
    cold: Measured,
    tok_s: f64,
    logits: Vec<f32>,
}

/// Runs of each package's local decode, interleaved, for the median
/// tokens per second (these machines are noisy).
const TOK_RUNS: usize = 3;

/// The cold run of each of `packs`, then [`TOK_RUNS`] interleaved local
/// decodes of all of them (median tokens/s, the first step's logits).
fn measure(site: &Site, packs: &[&'static str]) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &pack in packs {
        rows.push(Row {
            pack,
            disk: dir_bytes(&bench_dir().join(pack))?,
            cold: coldstart::remote(site, SLOW, pack, &["--no-cache"])?,
            tok_s: 0.0,
            logits: Vec::new(),
        });
    }
    let mut speeds = vec![Vec::new(); packs.len()];
    for _ in 0..TOK_RUNS {
        for (k, r) in rows.iter_mut().enumerate() {
            let (m, logits) = local(r.pack)?;
            speeds[k].push(m.json["tokens_per_second"].as_f64().unwrap_or(0.0));
            r.logits = logits;
        }
    }
    for (r, s) in rows.iter_mut().zip(speeds) {
        r.tok_s = super::common::median(s);
    }
    Ok(rows)
}

fn table(rows: &[Row]) {
    println!(
        "| package | on disk MB | wire MB (proxy), cold whole-model node | lm_head MiB pulled | cold TTFT s (from process start) | peak RSS MiB | decode tokens/s (local files) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let lm = r.cold.json["bytes"]["lm_head"].as_f64().unwrap_or(0.0);
        println!(
            "| {} | {} | {} | {:.1} | {:.2} | {:.0} | {:.2} |",
            r.pack,
            mb(r.disk as f64),
            mb(r.cold.wire.total() as f64),
            lm / f64::from(1u32 << 20),
            r.cold.ttft_s(),
            r.cold.rss_mib,
            r.tok_s
        );
    }
}

fn ratio_line(name: &str, got: f64, target: &str, met: bool) {
    let verdict = if met { "met" } else { "missed" };
    println!("| {name} | {got:.3} | {target} | {verdict} |");
}

/// q4_0 against bf16: the targets.
fn targets(bf16: &Row, q4: &Row, q8_session: f64) {
    println!("| measure, q4_0 against bf16 in this run | ratio | target | |");
    println!("|---|---:|---|---|");
    let wire = q4.cold.wire.total() as f64 / bf16.cold.wire.total() as f64;
    ratio_line(
        "wire bytes, cold whole-model node",
        wire,
        "<= 0.32",
        wire <= 0.32,
    );
    let ttft = q4.cold.ttft_s() / bf16.cold.ttft_s();
    ratio_line(
        "cold TTFT from process start",
        ttft,
        "<= 0.40",
        ttft <= 0.40,
    );
    let rss = q4.cold.rss_mib / bf16.cold.rss_mib;
    ratio_line("peak RSS", rss, "<= 0.40", rss <= 0.40);
    let tok = q4.tok_s / bf16.tok_s;
    ratio_line(
        "decode tokens/s (bf16 widened to f32)",
        tok,
        ">= 2",
        tok >= 2.0,
    );
    let lm = q4.cold.json["bytes"]["lm_head"].as_f64().unwrap_or(0.0) / f64::from(1u32 << 20);
    println!(
        "| lm_head MiB pulled (q4_0) | {lm:.1} | ~ 73 MiB | {} |",
        if (lm - 73.0).abs() < 2.0 {
            "met"
        } else {
            "missed"
        }
    );
    println!(
        "| long_context session rows + proofs at q8_0, KB (1000 B) | {:.1} | < 500 | {} |",
        q8_session / 1e3,
        if q8_session < 500e3 { "met" } else { "missed" }
    );
}

/// The first step's logits of each package against bf16's.
fn logits_error(rows: &[Row]) {
    let base = &rows[0].logits;
    let scale = base.iter().fold(0f32, |a, x| a.max(x.abs()));
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i)
    };
    println!(
        "| package | max abs error of the logits vs bf16 | relative (over max abs bf16 logit {scale:.3}) | same first token |"
    );
    println!("|---|---:|---:|---|");
    for r in &rows[1..] {
        let err = r
            .logits
            .iter()
            .zip(base)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        println!(
            "| {} | {err:.4} | {:.4} | {} |",
            r.pack,
            err / scale,
            argmax(&r.logits) == argmax(base)
        );
    }
}

/// The long_context session through `gkq-rows` (no proxy): bytes of rows
/// and their proofs.
fn session_bytes(nginx: &Nginx, pack: &str) -> anyhow::Result<Value> {
    let base = format!("{}/{pack}", nginx.url());
    let file = fixtures::sessions::dir().join("long_context.jsonl");
    let out = Command::new(release_bin("gkq-rows"))
        .arg(format!("{base}/model.knot"))
        .arg("--columnar-embed")
        .arg(format!("{base}/"))
        .arg("--sessions-file")
        .arg(&file)
        .args(["--no-cache", "--json"])
        .output()
        .context("running gkq-rows")?;
    if !out.status.success() {
        bail!("gkq-rows failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn sessions(nginx: &Nginx) -> anyhow::Result<f64> {
    println!(
        "| package | row file | distinct rows | rows + proofs KB (1000 B) | of which proofs KB | requests |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    let mut q8 = 0.0;
    for (pack, _, _) in QWEN {
        let v = session_bytes(nginx, pack)?;
        let payload = v["payload_bytes"].as_f64().unwrap_or(0.0);
        let reason = v["resolution"]["reason"].as_str().unwrap_or("");
        let file = reason
            .split_whitespace()
            .find(|w| w.contains(".rows"))
            .unwrap_or("?");
        println!(
            "| {pack} | {} | {} | {:.1} | {:.1} | {} |",
            file.trim_end_matches([':', ';'])
                .rsplit('/')
                .next()
                .unwrap_or(file),
            v["distinct_rows"],
            payload / 1e3,
            v["proof_bytes"].as_f64().unwrap_or(0.0) / 1e3,
            v["requests"]
        );
        if pack == "quant-q8_0" {
            q8 = payload;
        }
    }
    Ok(q8)
}

/// Per-tensor RMSE of every type on real MiniLM (the report's figures).
fn minilm() -> anyhow::Result<()> {
    let src = fixtures::workspace::root().join("target/real-models/all-MiniLM-L6-v2");
    if !src.join("model.safetensors").is_file() {
        println!("(real MiniLM not installed: bash scripts/install-test-deps.sh)");
        return Ok(());
    }
    println!(
        "| type | 2-D tensors in it | fell back | word embedding RMSE | median RMSE | largest RMSE | largest max abs error |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for t in [
        "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "q6_k", "q5_k", "q4_k",
    ] {
        let out = bench_dir().join(format!("minilm-{t}"));
        let mut cmd = Command::new(release_bin("gkq-pack"));
        cmd.arg(&src)
            .arg("--out")
            .arg(&out)
            .args(["--json", "--force", "--quant", t]);
        let (_, stdout) = super::common::timed(&mut cmd)?;
        let r: Value = serde_json::from_slice(&stdout)?;
        let q = r["quantized"].as_array().cloned().unwrap_or_default();
        let of_type: Vec<&Value> = q.iter().filter(|e| e["dtype"] == t).collect();
        let mut rmse: Vec<f64> = of_type.iter().filter_map(|e| e["rmse"].as_f64()).collect();
        rmse.sort_by(f64::total_cmp);
        let embed = q
            .iter()
            .find(|e| e["tensor"] == "embeddings.word_embeddings.weight")
            .map_or(String::from("-"), |e| {
                format!(
                    "{:.3e} ({})",
                    e["rmse"].as_f64().unwrap_or(0.0),
                    e["dtype"].as_str().unwrap_or("")
                )
            });
        let max_abs = of_type
            .iter()
            .filter_map(|e| e["max_abs_error"].as_f64())
            .fold(0f64, f64::max);
        println!(
            "| {t} | {} | {} | {embed} | {:.3e} | {:.3e} | {max_abs:.3e} |",
            of_type.len(),
            r["fallbacks"].as_array().map_or(0, Vec::len),
            rmse.get(rmse.len() / 2).copied().unwrap_or(0.0),
            rmse.last().copied().unwrap_or(0.0),
        );
    }
    Ok(())
}

pub(crate) fn run() -> anyhow::Result<()> {
    let qwen = model()?;
    let llama = preset("llama-0.3b-bf16")?;
    println!("bench quant: packing (release gkq-pack, this machine's cores)");
    println!();
    println!("| package | flags | pack s |");
    println!("|---|---|---:|");
    for (src, packs) in [(&qwen, &QWEN[..]), (&llama, &LLAMA[..])] {
        for (pack, flags, what) in packs {
            let secs = pack_args(src, &bench_dir().join(pack), flags)?;
            println!("| {pack} | {what} | {secs:.1} |");
        }
    }
    let site = coldstart::site(SLOW)?;
    println!();
    println!(
        "qwen2.5-0.5b preset (24 layers, vocab 151,936, hidden 896, tied); a fresh gkq-decode per run, --no-cache, {} prompt ids; cold: the setup of bench coldstart (TLS + HTTP/2, 25 MB/s per response, 100 MB/s link, 20 ms RTT); tokens/s: local decodes of {TOKENS} new tokens, the packages interleaved, the median of {TOK_RUNS}",
        32
    );
    println!();
    let rows = measure(&site, &QWEN.map(|p| p.0))?;
    table(&rows);
    println!();
    let nginx = Nginx::start(
        &bench_dir(),
        &bench_dir().join("nginx-quant"),
        &NginxOptions::default(),
    )?;
    println!(
        "The long_context session (628 tokens) through gkq-rows, nginx on 127.0.0.1, each row verified:"
    );
    println!();
    let q8 = sessions(&nginx)?;
    println!();
    targets(&rows[0], &rows[2], q8);
    println!();
    logits_error(&rows);
    println!();
    println!(
        "Llama-shaped preset (24 layers, hidden 1024, MLP 2816, vocab 32,000, untied), the same setup:"
    );
    println!();
    let llama_rows = measure(&site, &LLAMA.map(|p| p.0))?;
    table(&llama_rows);
    println!();
    logits_error(&llama_rows);
    println!();
    println!(
        "Real all-MiniLM-L6-v2 (f32, hidden 384: K types fall back on rows of 384), per-tensor RMSE against the source as gkq-pack reports it:"
    );
    println!();
    minilm()
}
