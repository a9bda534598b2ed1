//! `cargo xtask afl`: the coverage-guided fuzzer (AFL++ through cargo-afl,
//! stable toolchain) on each gkq-fuzz target for a bounded time, `jobs` at
//! once; prints inputs per second, the edges reached and what it found
//! from each run's `fuzzer_stats`. Needs `cargo install cargo-afl` once
//! (it builds AFL++). `--keep` adds the inputs that reached new edges to
//! the committed corpus (`fuzz/corpus/<target>/`), which the tests replay.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Child;

use anyhow::{Context, bail};

use fixtures::workspace::{cargo, root, run};

/// Every target of `fuzz/src/lib.rs`.
pub(crate) const TARGETS: [&str; 9] = [
    "knot",
    "merkle",
    "runs",
    "config",
    "safetensors",
    "spectral",
    "quant",
    "gguf",
    "sig",
];

fn out_dir(target: &str) -> PathBuf {
    root().join("target/afl-out").join(target)
}

fn start(target: &str, seconds: u64) -> anyhow::Result<Child> {
    let out = out_dir(target);
    let _ = std::fs::remove_dir_all(&out);
    // afl-fuzz makes its output directory, not the ones above it
    std::fs::create_dir_all(root().join("target/afl-out"))?;
    let bin = root()
        .join("target/afl/release")
        .join(format!("fuzz-{target}"));
    let child = cargo()
        .args(["afl", "fuzz", "-V", &seconds.to_string(), "-i"])
        .arg(root().join("fuzz/corpus").join(target))
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(bin)
        .env("AFL_NO_UI", "1")
        .env("AFL_SKIP_CPUFREQ", "1")
        .env("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1")
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("cargo afl fuzz (cargo install cargo-afl)")?;
    Ok(child)
}

fn stats(target: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let path = out_dir(target).join("default/fuzzer_stats");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect())
}

/// Copies the run's queue (inputs that reached new edges) into the corpus,
/// each named by its content (`afl-<sha256 prefix>`), so runs add to the
/// corpus without overwriting each other. Minimize before committing (see
/// the README's Fuzzing section).
fn keep(target: &str) -> anyhow::Result<usize> {
    use sha2::{Digest, Sha256};
    let queue = out_dir(target).join("default/queue");
    let corpus = root().join("fuzz/corpus").join(target);
    let mut n = 0;
    for e in std::fs::read_dir(&queue)? {
        let p = e?.path();
        let from_seed = p
            .file_name()
            .is_some_and(|s| s.to_string_lossy().contains("orig:"));
        if !p.is_file() || from_seed {
            continue;
        }
        let bytes = std::fs::read(&p)?;
        let digest = gkq_format::hex(&Sha256::digest(&bytes));
        let to = corpus.join(format!("afl-{}", &digest[..16]));
        if !to.exists() {
            std::fs::write(&to, &bytes)?;
            n += 1;
        }
    }
    Ok(n)
}

fn crashes(target: &str) -> usize {
    let dir = out_dir(target).join("default/crashes");
    std::fs::read_dir(&dir).map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| e.file_name() != "README.txt")
            .count()
    })
}

pub(crate) fn run_all(
    seconds: u64,
    jobs: usize,
    targets: &[String],
    save: bool,
) -> anyhow::Result<()> {
    let mut build = cargo();
    build
        .args([
            "afl",
            "build",
            "--release",
            "-p",
            "gkq-fuzz",
            "--features",
            "afl",
        ])
        .env("CARGO_TARGET_DIR", root().join("target/afl"));
    run(&mut build)?;
    let chosen: Vec<&str> = if targets.is_empty() {
        TARGETS.to_vec()
    } else {
        targets.iter().map(String::as_str).collect()
    };
    for t in &chosen {
        if !TARGETS.contains(t) {
            bail!("no fuzz target {t:?} (targets: {})", TARGETS.join(", "));
        }
    }
    for batch in chosen.chunks(jobs.max(1)) {
        eprintln!("afl: {} for {seconds} s", batch.join(", "));
        let children: Vec<Child> = batch
            .iter()
            .map(|t| start(t, seconds))
            .collect::<Result<_, _>>()?;
        for mut c in children {
            c.wait()?;
        }
    }
    println!(
        "| target | seconds | inputs | inputs/s | corpus | edges found / total | map coverage | crashes | hangs | kept |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut found = 0;
    for t in &chosen {
        let s = stats(t)?;
        let get = |k: &str| s.get(k).cloned().unwrap_or_default();
        let kept = if save { keep(t)? } else { 0 };
        let c = crashes(t);
        found += c;
        println!(
            "| {t} | {} | {} | {} | {} | {} / {} | {} | {c} | {} | {kept} |",
            get("run_time"),
            get("execs_done"),
            get("execs_per_sec"),
            get("corpus_count"),
            get("edges_found"),
            get("total_edges"),
            get("bitmap_cvg"),
            get("saved_hangs"),
        );
    }
    if found > 0 {
        bail!("afl found {found} crashing inputs: see target/afl-out/<target>/default/crashes");
    }
    Ok(())
}
