//! `cargo xtask bench reader`: the qwen2.5-0.5b preset (a bf16 source)
//! packed with `--dtype f32 --dtype bf16`, served by nginx on 127.0.0.1; the
//! reader is given the package's base URL and picks the narrowest exact row
//! file (bf16, 1,792 B/row), verifying every row with its Merkle proof;
//! token sessions replayed through `gkq-rows`
//! (release) with a cold backend per workload, then 100 sessions through
//! one warm backend with a top-100 warm seed, then the cold sessions again
//! behind a proxy that adds 20 ms to every request.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use fixtures::servers::{DelayProxy, Nginx, NginxOptions};
use serde_json::Value;

use super::common::{PACK, bench_dir, packed, release_bin};

const DENSE: f64 = 151_936.0 * 896.0 * 4.0;
const ROW: f64 = 896.0 * 2.0;
fn rows_json(base: &str, extra: &[&str]) -> anyhow::Result<Value> {
    let out = Command::new(release_bin("gkq-rows"))
        .arg(format!("{base}/model.knot"))
        .arg("--columnar-embed")
        .arg(format!("{base}/"))
        .arg("--json")
        .args(extra)
        .output()
        .context("running gkq-rows")?;
    if !out.status.success() {
        bail!("gkq-rows failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: Value = serde_json::from_slice(&out.stdout)?;
    if v["resolution"]["path"] != "columnar"
        || !v["resolution"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("token_embd.bf16.rows")
    {
        bail!("not on the bf16 columnar path: {}", v["resolution"]);
    }
    Ok(v)
}

fn kib(b: f64) -> String {
    format!("{:.2} KB", b / 1024.0)
}

/// One cold `gkq-rows` per workload; returns the knot header's bytes.
fn cold(base: &str, s: &dyn Fn(&str) -> String) -> anyhow::Result<f64> {
    println!(
        "Cold backend per workload (a fresh gkq-rows process; the knot header fetch is shown separately):"
    );
    println!(
        "| workload | tokens | distinct rows | row payload | proof | proof / row payload | row payload / (distinct x 1792 B) | requests | response header bytes | wall ms | vs dense | saved |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut header = 0.0;
    for (name, _) in fixtures::sessions::WORKLOADS {
        let v = rows_json(base, &["--sessions-file", &s(&format!("{name}.jsonl"))])?;
        header = v["open"]["payload_bytes"].as_f64().unwrap_or(0.0);
        let payload = v["payload_bytes"].as_f64().unwrap_or(0.0);
        let proof = v["proof_bytes"].as_f64().unwrap_or(0.0);
        let rows = payload - proof;
        let distinct = v["distinct_rows"].as_f64().unwrap_or(0.0);
        println!(
            "| {name} | {} | {distinct} | {} | {} | {:.1}% | {:.3} | {} | {} | {:.1} | {:.4}% | {:.3}% |",
            v["tokens"],
            kib(rows),
            kib(proof),
            proof / rows * 100.0,
            rows / (distinct * ROW),
            v["requests"],
            v["http_bytes"].as_f64().unwrap_or(0.0) - payload,
            v["seconds"].as_f64().unwrap_or(0.0) * 1e3,
            payload / DENSE * 100.0,
            100.0 - payload / DENSE * 100.0
        );
    }
    Ok(header)
}

/// 100 sessions through one warm backend, against the proposal's figures.
fn warm(base: &str, s: &dyn Fn(&str) -> String) -> anyhow::Result<()> {
    let warm = std::fs::read_to_string(s("warm100.txt"))?;
    let naive = 100.0 * DENSE;
    let mut cols = Vec::new();
    for file in ["mix100.jsonl", "fresh100.jsonl"] {
        let v = rows_json(
            base,
            &["--sessions-file", &s(file), "--prefetch", warm.trim()],
        )?;
        cols.push(v);
    }
    println!(
        "100 sessions through one warm backend with a top-100 warm seed. mix100: drawn from the four workloads (the proposal's method); fresh100: 100 independent Zipf sessions:"
    );
    println!("| | mix100 | fresh100 | proposal |");
    println!("|---|---:|---:|---:|");
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let w = |v: &Value| v["prefetch"]["payload_bytes"].as_f64().unwrap_or(0.0);
    let total = |v: &Value| w(v) + f(v, "payload_bytes");
    let (a, b) = (&cols[0], &cols[1]);
    println!("| warm seed | {} | {} | 350 KB |", kib(w(a)), kib(w(b)));
    println!(
        "| cold tail | {} ({} misses) | {} ({} misses) | 647.50 KB |",
        kib(f(a, "payload_bytes")),
        a["misses"],
        kib(f(b, "payload_bytes")),
        b["misses"]
    );
    println!(
        "| total paid | {} | {} | 997.50 KB |",
        kib(total(a)),
        kib(total(b))
    );
    let gb = naive / 1073741824.0;
    println!("| naive dense per session | {gb:.2} GB | {gb:.2} GB | 50.71 GB |");
    let ratio = |v: &Value| total(v) / naive * 100.0;
    println!(
        "| ratio | {:.6}% | {:.6}% | 0.001876% |",
        ratio(a),
        ratio(b)
    );
    println!(
        "| saved | {:.6}% | {:.6}% | 99.998124% |",
        100.0 - ratio(a),
        100.0 - ratio(b)
    );
    Ok(())
}

/// The cost of a row served from the warm in-memory cache.
fn lru_hit(base: &str, s: &dyn Fn(&str) -> String) -> anyhow::Result<()> {
    let hits = Command::new(release_bin("gkq-rows"))
        .arg(format!("{base}/model.knot"))
        .args([
            "--columnar-embed",
            &format!("{base}/"),
            "--tokens-file",
            &s("long_context.jsonl"),
            "--bench-hits",
            "2000",
            "--json",
        ])
        .output()?;
    let hv: Value = serde_json::from_slice(&hits.stdout).context("gkq-rows --bench-hits")?;
    println!(
        "LRU hit: {:.0} ns per row (long_context ids, 2000 repeats, warm cache; target < 1000 ns)",
        hv["lru_hit_ns_per_row"].as_f64().unwrap_or(f64::NAN)
    );
    Ok(())
}

/// Cold sessions behind a proxy that adds 20 ms to every request.
fn delayed(nginx: &Nginx, s: &dyn Fn(&str) -> String) -> anyhow::Result<()> {
    let proxy = DelayProxy::start(nginx.port(), Duration::from_millis(20))?;
    let pbase = format!("{}/{PACK}", proxy.url());
    println!(
        "Cold sessions behind a proxy adding 20 ms to every request (target: 100 distinct rows < 100 ms):"
    );
    println!("| workload | distinct rows | requests | wall ms | 20 ms x requests (sequential) |");
    println!("|---|---:|---:|---:|---:|");
    for (name, _) in fixtures::sessions::WORKLOADS {
        let v = rows_json(&pbase, &["--sessions-file", &s(&format!("{name}.jsonl"))])?;
        let req = v["requests"].as_f64().unwrap_or(0.0);
        println!(
            "| {name} | {} | {req} | {:.1} | {:.0} |",
            v["distinct_rows"],
            v["seconds"].as_f64().unwrap_or(0.0) * 1e3,
            req * 20.0
        );
    }
    Ok(())
}

pub(crate) fn run() -> anyhow::Result<()> {
    packed()?;
    let nginx = Nginx::start(
        &bench_dir(),
        &bench_dir().join("nginx-reader"),
        &NginxOptions::default(),
    )?;
    let base = format!("{}/{PACK}", nginx.url());
    let sessions = fixtures::sessions::dir();
    let s = |n: &str| sessions.join(n).display().to_string();
    println!(
        "bench reader: qwen2.5-0.5b preset (bf16 source) packed with --dtype f32 --dtype bf16, served by nginx on 127.0.0.1; the reader gets the base URL and picks the bf16 rows (exact: 1792 B/row instead of 3584), each verified with its Merkle proof (height 7: 224 B per row, and a 37,984 B chunk table once); dense f32 embedding = 544,538,624 B = 519.31 MB (MiB, as in the proposal); KB = 1024 B"
    );
    println!();
    let header = cold(&base, &s)?;
    println!();
    println!(
        "Opening the knot remotely (one range GET of the header, + HEAD of the row file): {} of payload per process.",
        kib(header)
    );
    println!();
    warm(&base, &s)?;
    println!();
    lru_hit(&base, &s)?;
    println!();
    delayed(&nginx, &s)
}
