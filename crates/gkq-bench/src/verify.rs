//! `cargo xtask bench verify`: the packed qwen2.5-0.5b preset verified with
//! `--source`, against `sha256sum` and the 2-core SHA-256 limit.

use std::path::PathBuf;
use std::process::Command;

use anyhow::bail;

use super::common::{bench_dir, median, model, openssl_sha256_rate, pack_once, release_bin, timed};

pub(crate) fn run(reps: usize) -> anyhow::Result<()> {
    let model = model()?;
    let out = bench_dir().join("pack-f32");
    // always repack: a package of an older format would not verify
    pack_once(&model, &out, "f32")?;
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in [&out, &model] {
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            if p.is_file()
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
                && p.extension().is_none_or(|x| x != "json")
            {
                files.push(p);
            }
        }
    }
    files.sort();
    let total: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    // warm the page cache so both sides read from memory
    timed(
        Command::new("cat")
            .args(&files)
            .stdout(std::process::Stdio::null()),
    )?;
    let (mut vs, mut ss) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let (v, stdout) = timed(
            Command::new(release_bin("gkq-verify"))
                .arg(&out)
                .arg("--source")
                .arg(&model)
                .arg("--json"),
        )?;
        let report: serde_json::Value = serde_json::from_slice(&stdout)?;
        if report["passed"] != true {
            bail!("verification failed: {report}");
        }
        vs.push(v);
        let (s, _) = timed(Command::new("sha256sum").args(&files))?;
        ss.push(s);
    }
    let (v, s) = (median(vs), median(ss));
    let rate = openssl_sha256_rate()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let limit = total as f64 / (cores * rate);
    println!(
        "bench verify: packed qwen2.5-0.5b (f32 rows) with --source; {} files (knot, row files, proof objects, source), {:.1} MB; {reps} runs, medians; page cache warm",
        files.len(),
        total as f64 / 1e6
    );
    println!(
        "SHA-256 limit: the bytes ÷ ({cores} cores × `openssl speed -evp sha256` single-core rate {:.0} MB/s, 16 KiB blocks, measured in this run) = {limit:.2} s",
        rate / 1e6
    );
    println!(
        "| gkq-verify s | sha256sum s (same files, one core) | verify/sha256sum | 2-core SHA-256 limit s | verify/limit | target verify/limit |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {v:.2} | {s:.2} | {:.2} | {limit:.2} | {:.2} | <= 1.3 |",
        v / s,
        v / limit
    );
    Ok(())
}
