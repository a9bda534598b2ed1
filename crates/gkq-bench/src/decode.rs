//! `cargo xtask bench decode`: a cold node decodes 32 prompt tokens and 32
//! generated tokens of the qwen2.5-0.5b preset (full vocabulary, 24 layers,
//! random weights: bit-identity is the claim, not the text) from the
//! package over TLS + HTTP/2, behind a proxy that adds 10 ms each way and
//! counts every byte. Once with the embedding from the verified bf16 rows
//! (the base URL), once with the dense embedding block; the logits of the
//! two runs must be bit-identical.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fixtures::servers::{Nginx, NginxOptions, TestCa, WireProxy};
use serde_json::Value;

use super::common::PACK;
use super::common::{bench_dir, release_bin};

const PROMPT_TOKENS: u32 = 32;
const NEW_TOKENS: &str = "32";
/// The input node runs layers 0..12, the output node 12..24 and lm_head.
const SPLIT: &str = "12";

fn decode(base: &str, ca: &std::path::Path, columnar: bool) -> anyhow::Result<(Value, f64)> {
    let mut cmd = Command::new(release_bin("gkq-decode"));
    // 32 prompt ids spread over the vocabulary
    let ids: Vec<String> = (0..PROMPT_TOKENS)
        .map(|i| ((i * 4_729 + 17) % 151_936).to_string())
        .collect();
    cmd.arg(format!("{base}/model.knot"))
        .arg("--ca-cert")
        .arg(ca)
        .args([
            "--prompt-ids",
            &ids.join(","),
            "--max-new-tokens",
            NEW_TOKENS,
            "--json",
            "--split",
            SPLIT,
        ]);
    if columnar {
        cmd.args([
            "--columnar-embed",
            &format!("{base}/"),
            "--require-columnar",
        ]);
    }
    let t = Instant::now();
    let o = cmd.output().context("running gkq-decode")?;
    let wall = t.elapsed().as_secs_f64();
    if !o.status.success() {
        bail!("gkq-decode failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok((serde_json::from_slice(&o.stdout)?, wall))
}

pub(crate) fn run() -> anyhow::Result<()> {
    super::common::packed()?;
    let ca = TestCa::generate(&bench_dir().join("tls-ca"))?;
    let nginx = Nginx::start(
        &bench_dir(),
        &bench_dir().join("nginx-decode"),
        &NginxOptions {
            tls: Some(ca.server.clone()),
            http2: true,
            ..NginxOptions::default()
        },
    )?;
    println!(
        "bench decode: qwen2.5-0.5b preset (bf16 source, vocab 151,936, 24 layers, tied, random weights) packed with --dtype f32 --dtype bf16; one cold gkq-decode process playing a two-node pipeline (--split {SPLIT}: a cold input node, and an output node that pulls the tied lm_head), {PROMPT_TOKENS} prompt tokens + {NEW_TOKENS} generated, f32 compute on 2 cores; nginx over TLS + HTTP/2 behind a proxy adding 10 ms each way (20 ms RTT) that counts every byte"
    );
    println!();
    println!(
        "| input node's embedding | input node: embedding bytes | input node: layers 0..12 B | input node: knot header B | input node total B | output node: lm_head B | output node: layers 12..24 B | both nodes, wire B (proxy) | time to first token ms | tokens/s | process wall s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut digests = Vec::new();
    let mut emb = Vec::new();
    for (label, columnar) in [
        ("verified bf16 rows (base URL)", true),
        ("dense block", false),
    ] {
        let proxy = WireProxy::start(nginx.port(), Duration::from_millis(10))?;
        let base = format!("https://127.0.0.1:{}/{PACK}", proxy.port());
        let (v, wall) = decode(&base, &ca.ca, columnar)?;
        let node = |i: usize, k: &str| v["stage_bytes"][i][k].as_u64().unwrap_or(0);
        let g = |k: &str| node(0, k);
        let total = g("knot_header") + g("embedding_rows") + g("lm_head") + g("other_blocks");
        println!(
            "| {label} | {} | {} | {} | {total} | {} | {} | {} | {:.0} | {:.2} | {wall:.1} |",
            g("embedding_rows"),
            g("other_blocks"),
            g("knot_header"),
            node(1, "lm_head"),
            node(1, "other_blocks"),
            proxy.stats().total(),
            v["time_to_first_token_ms"].as_f64().unwrap_or(0.0),
            v["tokens_per_second"].as_f64().unwrap_or(0.0),
        );
        emb.push(g("embedding_rows"));
        if node(0, "lm_head") != 0 || node(1, "embedding_rows") != 0 {
            bail!(
                "a node fetched bytes of a role it does not serve: {}",
                v["stage_bytes"]
            );
        }
        digests.push(v["logits_sha256"].clone());
        if columnar && v["resolutions"][0]["path"] != "columnar" {
            bail!("not on the columnar path: {}", v["resolutions"]);
        }
    }
    println!();
    if digests[0] != digests[1] {
        bail!("the logits of the two runs differ");
    }
    println!(
        "logits of all {NEW_TOKENS} steps bit-identical between the two runs; embedding bytes of the cold input node: {} B against the 500 KB target (512,000 B): {}; {:.5} % of the dense embedding's {} B",
        emb[0],
        if emb[0] < 512_000 { "met" } else { "missed" },
        emb[0] as f64 / emb[1].max(1) as f64 * 100.0,
        emb[1]
    );
    Ok(())
}
