//! `cargo xtask bench big` (issue 15): a Llama-3-70B-shaped embedding and
//! untied lm_head, 128256 × 8192 each in bf16 (4.2 GB of safetensors), packed
//! `--dtype bf16` and verified with `--source`, with peak RSS measured by
//! `/usr/bin/time` and the same-run references of `bench pack` and `bench
//! verify`: `cp -r && sync`, the Python reference converter, the 2-core
//! SHA-256 limit. Everything it writes is deleted at the end (about 13 GB
//! at the peak).

use std::path::Path;
use std::process::Command;

use anyhow::bail;

use super::common::{bench_dir, dir_bytes, release_bin, timed, timed_rss};
use fixtures::workspace::root;

/// `cp -r && sync` of `model`: the reference for writing as many bytes.
fn copy_time(model: &Path) -> anyhow::Result<f64> {
    let copy = bench_dir().join("big-copy");
    let _ = std::fs::remove_dir_all(&copy);
    let (cp, _) = timed(Command::new("sh").arg("-c").arg(format!(
        "cp -r '{}' '{}' && sync",
        model.display(),
        copy.display()
    )))?;
    std::fs::remove_dir_all(&copy)?;
    Ok(cp)
}

/// scripts/reference_pack.py on `model` (our output gone: disk): its
/// seconds, peak RSS and the knot id line it prints.
fn reference(model: &Path) -> anyhow::Result<(f64, u64, String)> {
    let s = |p: &Path| p.as_os_str().to_owned();
    let py_out = bench_dir().join("big-reference");
    let _ = std::fs::remove_dir_all(&py_out);
    let script = root().join("scripts/reference_pack.py");
    let tool = format!("--tool=gkq-pack {}", env!("CARGO_PKG_VERSION"));
    let (py, py_rss, stdout) = timed_rss(
        Path::new("python3"),
        &[
            &s(&script),
            &s(model),
            &s(&py_out),
            "--dtype".as_ref(),
            "bf16".as_ref(),
            tool.as_ref(),
        ],
    )?;
    std::fs::remove_dir_all(&py_out)?;
    Ok((py, py_rss, String::from_utf8_lossy(&stdout).into_owned()))
}

pub(crate) fn run() -> anyhow::Result<()> {
    if !Path::new("/usr/bin/time").exists() {
        bail!("bench big needs /usr/bin/time (apt-get install time) for peak RSS");
    }
    // generated afresh: the end of the run deletes it (disk)
    let _ = std::fs::remove_dir_all(bench_dir().join("llama3-70b-embed"));
    let model = crate::common::preset("llama3-70b-embed")?;
    let input = dir_bytes(&model)?;
    let cp = copy_time(&model)?;

    let out = bench_dir().join("big-pack");
    let _ = std::fs::remove_dir_all(&out);
    let s = |p: &Path| p.as_os_str().to_owned();
    let (pack, pack_rss, stdout) = timed_rss(
        &release_bin("gkq-pack"),
        &[
            &s(&model),
            "--out".as_ref(),
            &s(&out),
            "--dtype".as_ref(),
            "bf16".as_ref(),
            "--json".as_ref(),
        ],
    )?;
    let report: serde_json::Value = serde_json::from_slice(&stdout)?;
    let knot_id = report["knot_id"].as_str().unwrap_or_default().to_owned();
    let output = dir_bytes(&out)?;

    // verify: every byte of the package and the source, page cache as it is
    let verified = output + input;
    let (verify, verify_rss, stdout) = timed_rss(
        &release_bin("gkq-verify"),
        &[&s(&out), "--source".as_ref(), &s(&model), "--json".as_ref()],
    )?;
    let v: serde_json::Value = serde_json::from_slice(&stdout)?;
    if v["passed"] != true {
        bail!("verification failed: {v}");
    }
    let rate = crate::common::openssl_sha256_rate()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let limit = verified as f64 / (cores * rate);
    std::fs::remove_dir_all(&out)?;

    let (py, py_rss, py_id) = reference(&model)?;
    let same = py_id.trim() == format!("knot id {knot_id}");
    std::fs::remove_dir_all(&model)?;

    println!(
        "bench big: Llama-3-70B-shaped token embedding + untied lm_head, 2 x 128256 x 8192 bf16, {:.2} GB of safetensors; `--dtype bf16` (f32 rows would need 21 GB of disk); one run each",
        input as f64 / 1e9
    );
    println!("| measure | s | peak RSS MiB | reference | ratio | goal |");
    println!("|---|---:|---:|---|---:|---:|");
    println!(
        "| gkq-pack --dtype bf16 ({:.2} GB written) | {pack:.2} | {:.0} | `cp -r && sync` {cp:.2} s | {:.2} | 1.5 |",
        output as f64 / 1e9,
        pack_rss as f64 / 1024.0,
        pack / cp
    );
    println!(
        "| gkq-pack against scripts/reference_pack.py (knot id {}) | {pack:.2} | | Python {py:.2} s, peak RSS {:.0} MiB | {:.2} | 0.2 |",
        if same { "identical" } else { "DIFFERENT" },
        py_rss as f64 / 1024.0,
        pack / py
    );
    println!(
        "| gkq-verify --source ({:.2} GB) | {verify:.2} | {:.0} | 2-core SHA-256 limit {limit:.2} s (openssl {:.0} MB/s per core) | {:.2} | 1.3 |",
        verified as f64 / 1e9,
        verify_rss as f64 / 1024.0,
        rate / 1e6,
        verify / limit
    );
    if !same {
        bail!("reference_pack.py printed {py_id:?}, gkq-pack's knot id is {knot_id}");
    }
    Ok(())
}
