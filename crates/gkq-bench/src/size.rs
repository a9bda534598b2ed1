//! `cargo xtask bench size`: what a publisher stores and what a cold node
//! pays, one copy (FORMAT.md 7e, gkq-pack's default) against the blocks
//! in the knot too (`--knot-holds-blocks`: the layout main wrote before,
//! byte for byte, as `packed_digests_are_pinned` checks). For each of the
//! three real GGUFs: the package's bytes against the GGUF's, object by
//! object; then cold `gkq-rows` sessions of the six workloads (Qwen ids
//! folded into the model's vocabulary) over TLS + HTTP/2 behind a proxy
//! adding 10 ms each way and counting every byte: requests, wire bytes and
//! wall time; then a cold `gkq-decode` of each (bench coldstart's link:
//! 100 MB/s, 25 MB/s per response, 20 ms RTT): time to first token from
//! process start and wire bytes. The two layouts interleaved, medians of
//! `reps`. `GKQ_SIZE_FLAGS` adds gkq-pack flags to the one-copy layout
//! (`GKQ_SIZE_FLAGS=--no-runs`: the records apart, in the proof object).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fixtures::servers::{Nginx, NginxOptions, TestCa, WireProxy};

use super::common::{bench_dir, dir_bytes, median, pack_args, release_bin};

/// A real GGUF: its label, a short name, where it is.
type Model = (&'static str, &'static str, fn() -> PathBuf);

/// The real GGUFs.
const MODELS: [Model; 3] = [
    ("SmolLM2-135M-Instruct Q4_1", "smollm2", fixtures::smollm2),
    ("Gemma 3 270M Q4_K_M", "gemma3", fixtures::gemma3),
    (
        "Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
        "qwen05",
        fixtures::qwen05,
    ),
];

/// The two layouts: (label, directory suffix, gkq-pack flags).
const LAYOUTS: [(&str, &str, &[&str]); 2] = [
    ("one copy", "v5", &[]),
    ("before", "v4", &["--knot-holds-blocks"]),
];

/// One cold session: (requests, wire bytes, wall ms).
fn session(port: u16, ca: &Path, pack: &str, sessions: &Path) -> anyhow::Result<[f64; 3]> {
    let proxy = WireProxy::start(port, Duration::from_millis(10))?;
    let base = format!("https://127.0.0.1:{}/{pack}", proxy.port());
    let t = Instant::now();
    let o = Command::new(release_bin("gkq-rows"))
        .arg(format!("{base}/model.knot"))
        .arg("--ca-cert")
        .arg(ca)
        .arg("--sessions-file")
        .arg(sessions)
        .args(["--json", "--no-cache"])
        .output()
        .context("running gkq-rows")?;
    let wall = t.elapsed().as_secs_f64() * 1e3;
    if !o.status.success() {
        bail!("gkq-rows failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    if v["resolution"]["path"] != "columnar" {
        bail!("{pack}: not on the columnar path: {}", v["resolution"]);
    }
    let requests =
        v["requests"].as_u64().unwrap_or(0) + v["open"]["requests"].as_u64().unwrap_or(0);
    Ok([requests as f64, proxy.stats().total() as f64, wall])
}

/// The workload `name` with its ids folded into `vocab` rows, written once.
fn folded(name: &str, vocab: u64) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(fixtures::sessions::dir().join(format!("{name}.jsonl")))?;
    let mut out = String::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let ids: Vec<u64> = serde_json::from_str(line)?;
        let ids: Vec<u64> = ids.into_iter().map(|i| i % vocab).collect();
        out.push_str(&serde_json::to_string(&ids)?);
        out.push('\n');
    }
    let path = bench_dir().join(format!("size-{name}-{vocab}.jsonl"));
    std::fs::write(&path, out)?;
    Ok(path)
}

/// The objects of a package directory, largest first, as `name size`.
fn objects(dir: &Path) -> anyhow::Result<String> {
    let mut v: Vec<(u64, String)> = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        v.push((
            e.metadata()?.len(),
            e.file_name().to_string_lossy().into_owned(),
        ));
    }
    v.sort_unstable_by(|a, b| b.cmp(a));
    let mb = |n: u64| n as f64 / 1e6;
    let parts: Vec<String> = v
        .iter()
        .filter(|(n, _)| *n >= 1_000_000)
        .map(|(n, f)| format!("{f} {:.1} MB", mb(*n)))
        .collect();
    Ok(parts.join(", "))
}

/// Packs each model both ways and prints the size table; returns each
/// model's (slug, vocabulary).
fn sizes() -> anyhow::Result<Vec<(&'static str, u64)>> {
    println!("| model | GGUF B | layout | package B | × GGUF | objects over 1 MB |");
    println!("|---|---:|---|---:|---:|---|");
    let mut out = Vec::new();
    for (label, slug, path) in MODELS {
        let gguf = path();
        let g = std::fs::metadata(&gguf)
            .with_context(|| gguf.display().to_string())?
            .len();
        let extra = std::env::var("GKQ_SIZE_FLAGS").unwrap_or_default();
        for (k, (layout, suffix, args)) in LAYOUTS.into_iter().enumerate() {
            let dir = bench_dir().join(format!("size-{slug}-{suffix}"));
            // the one-copy layout (the first) with more flags (`--no-runs`:
            // records kept apart, in the proof object)
            let mut args = args.to_vec();
            if k == 0 {
                args.extend(extra.split_whitespace());
            }
            let layout = format!("{layout} {}", args.join(" ")).trim_end().to_owned();
            pack_args(&gguf, &dir, &args)?;
            let n = dir_bytes(&dir)?;
            println!(
                "| {label} | {g} | {layout} | {n} | {:.2}× | {} |",
                n as f64 / g as f64,
                objects(&dir)?
            );
        }
        let knot = std::fs::read(bench_dir().join(format!("size-{slug}-v5/model.knot")))?;
        let vocab = gkq_format::Knot::parse(&knot)?
            .header()
            .header()
            .meta_u64(gkq_format::keys::VOCAB_SIZE)
            .unwrap_or(1);
        out.push((slug, vocab));
    }
    Ok(out)
}

pub(crate) fn run(reps: usize) -> anyhow::Result<()> {
    println!(
        "bench size: each real GGUF packed with gkq-pack's defaults (one copy, FORMAT.md 7e) and with --knot-holds-blocks (the blocks in the knot too, the layout before)"
    );
    println!();
    let models = sizes()?;
    let ca = TestCa::generate(&bench_dir().join("tls-ca"))?;
    let opts = NginxOptions {
        tls: Some(ca.server.clone()),
        http2: true,
        ..NginxOptions::default()
    };
    let nginx = Nginx::start(&bench_dir(), &bench_dir().join("nginx-size"), &opts)?;
    println!();
    println!(
        "cold gkq-rows sessions over TLS + HTTP/2, 20 ms RTT, no disk cache; medians of {reps} interleaved rounds; ratio = one copy / --knot-holds-blocks"
    );
    println!();
    println!(
        "| model | workload | requests (one copy) | requests (before) | × | wire B (one copy) | wire B (before) | × | wall ms (one copy) | wall ms (before) | × |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &(slug, vocab) in &models {
        for (name, _) in fixtures::sessions::WORKLOADS {
            let file = folded(name, vocab)?;
            let mut got = [Vec::new(), Vec::new()];
            for _ in 0..reps {
                for (k, (_, suffix, _)) in LAYOUTS.iter().enumerate() {
                    got[k].push(session(
                        nginx.port(),
                        &ca.ca,
                        &format!("size-{slug}-{suffix}"),
                        &file,
                    )?);
                }
            }
            let m = |k: usize, i: usize| median(got[k].iter().map(|s| s[i]).collect());
            let cell = |i: usize| {
                format!(
                    "{:.0} | {:.0} | {:.2}",
                    m(0, i),
                    m(1, i),
                    m(0, i) / m(1, i).max(1.0)
                )
            };
            println!(
                "| {slug} | {name} | {} | {} | {} |",
                cell(0),
                cell(1),
                cell(2)
            );
        }
    }
    ttft(&models, reps)
}

/// Cold decodes on bench coldstart's link, both layouts interleaved.
fn ttft(models: &[(&str, u64)], reps: usize) -> anyhow::Result<()> {
    use super::coldstart::{SLOW, remote, site};
    let site = site(SLOW)?;
    println!();
    println!(
        "cold gkq-decode (32 prompt ids, 4 new tokens, --require-columnar) over TLS + HTTP/2, a 100 MB/s link with 25 MB/s per response and 20 ms RTT; medians of {reps} interleaved rounds"
    );
    println!();
    println!(
        "| model | TTFT s (one copy) | TTFT s (before) | × | wire MB (one copy) | wire MB (before) | × |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (slug, _) in models {
        let mut got = [Vec::new(), Vec::new()];
        for _ in 0..reps {
            for (k, (_, suffix, _)) in LAYOUTS.iter().enumerate() {
                let m = remote(
                    &site,
                    SLOW,
                    &format!("size-{slug}-{suffix}"),
                    &["--no-cache"],
                )?;
                got[k].push([m.ttft_s(), m.wire.total() as f64 / 1e6]);
            }
        }
        let m = |k: usize, i: usize| median(got[k].iter().map(|s| s[i]).collect());
        let cell = |i: usize| format!("{:.2} | {:.2} | {:.2}", m(0, i), m(1, i), m(0, i) / m(1, i));
        println!("| {slug} | {} | {} |", cell(0), cell(1));
    }
    Ok(())
}
