//! `bench stress`: many decodes of a real model's local package, two at a
//! time, with a third process keeping the cores busy: how many end in a
//! crash (a signal), and the most threads a run held. Issue 57's exit
//! crash (glibc's `pthread_detach` of an exiting thread, about 1 run in
//! 300 under load) is what it counts.

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use fixtures::workspace::root;

use super::common::{bench_dir, pack_args, release_bin};

/// Decodes in all (`GKQ_STRESS_RUNS` to change it).
const RUNS: usize = 500;

/// The package of the SmolLM2 GGUF (packed once).
fn package() -> anyhow::Result<PathBuf> {
    let out = bench_dir().join("stress/smollm2");
    if !out.join("model.knot").exists() {
        let gguf = root().join("target/real-models/SmolLM2-135M-Instruct.Q4_1.gguf");
        if !gguf.exists() {
            bail!(
                "{}: missing (bash scripts/install-test-deps.sh fetches it)",
                gguf.display()
            );
        }
        std::fs::create_dir_all(out.parent().context("a parent")?)?;
        pack_args(&gguf, &out, &[])?;
    }
    Ok(out)
}

/// How a decode ended: its exit code, the signal that ended it (a crash),
/// and the threads it reported.
type Ended = (Option<i32>, Option<i32>, u64);

/// One decode, and how it ended.
fn decode(pkg: &Path) -> anyhow::Result<Ended> {
    let o = Command::new(release_bin("gkq-decode"))
        .arg(pkg)
        .args(["--chat", "Name a colour.", "-n", "2", "--json"])
        .stdin(Stdio::null())
        .output()?;
    let threads = serde_json::from_slice::<serde_json::Value>(&o.stdout)
        .ok()
        .and_then(|v| v["process_threads"].as_u64())
        .unwrap_or(0);
    Ok((o.status.code(), o.status.signal(), threads))
}

pub(crate) fn run() -> anyhow::Result<()> {
    let pkg = &package()?;
    let runs = std::env::var("GKQ_STRESS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(RUNS);
    // the load: one busy process beside the two decodes
    let mut load = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()?;
    let t = std::time::Instant::now();
    let results: Vec<anyhow::Result<Ended>> = std::thread::scope(|s| {
        let half = |n: usize| s.spawn(move || (0..n).map(|_| decode(pkg)).collect::<Vec<_>>());
        let (a, b) = (half(runs / 2), half(runs - runs / 2));
        let mut all = a.join().unwrap_or_default();
        all.extend(b.join().unwrap_or_default());
        all
    });
    let _ = load.kill();
    let _ = load.wait();
    let (mut ok, mut failed, mut crashed, mut threads) = (0, 0, Vec::new(), 0);
    for r in results {
        match r? {
            (Some(0), _, t) => {
                ok += 1;
                threads = threads.max(t);
            }
            (_, Some(sig), _) => crashed.push(sig),
            _ => failed += 1,
        }
    }
    println!(
        "stress: {runs} decodes of SmolLM2's local package, 2 at a time beside a busy process, in {:.0} s: {ok} exit 0, {failed} other exits, {} crashed {crashed:?}; most threads a run reported at its end: {threads}",
        t.elapsed().as_secs_f64(),
        crashed.len()
    );
    if !crashed.is_empty() || failed > 0 {
        bail!("{} crashes, {failed} failures", crashed.len());
    }
    Ok(())
}

/// `bench memory`: SmolLM2's local package prefilling 1,000, 2,000 and
/// 4,000-token prompts (`-n 1`): peak RSS (GNU time) and prefill tokens/s;
/// issue 57's line is 4,000 tokens under 400 MB (it was 2.15 GB).
pub(crate) fn memory() -> anyhow::Result<()> {
    let pkg = package()?;
    let dir = bench_dir().join("stress");
    // a text of common words, tokenized by the model: a token a word
    let words = [
        "the", "of", "and", "to", "in", "is", "was", "that", "for", "on", "with", "as", "by", "at",
        "from", "his", "it", "an", "be", "this", "which", "or", "are", "had", "not",
    ];
    let mut rng = fixtures::Rng(1);
    println!("| prompt tokens | peak RSS | prefill tok/s |\n|---:|---:|---:|");
    for target in [1000usize, 2000, 4000] {
        let n = target;
        let text: Vec<&str> = (0..n).map(|_| words[rng.below(words.len())]).collect();
        let file = dir.join(format!("prompt-{target}.txt"));
        std::fs::write(&file, text.join(" "))?;
        let (_, kib, out) = super::common::timed_rss(
            &release_bin("gkq-decode"),
            &[
                pkg.as_os_str(),
                "-f".as_ref(),
                file.as_os_str(),
                "-n".as_ref(),
                "1".as_ref(),
                // the model's context, not llama-cli's default of 4096
                "-c".as_ref(),
                "0".as_ref(),
                "--json".as_ref(),
            ],
        )?;
        let v: serde_json::Value = serde_json::from_slice(&out)?;
        let tokens = v["prompt_ids"].as_array().map_or(0, Vec::len);
        println!(
            "| {tokens} | {:.0} MB | {:.1} |",
            kib as f64 / 1024.0,
            v["prefill_tokens_per_second"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}
