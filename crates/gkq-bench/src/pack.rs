//! `cargo xtask bench pack`: the qwen2.5-0.5b preset packed with each
//! `--dtype`, against `cp -r` (and `cp -r && sync`) and the Python
//! reference converter, in the same run.

use std::path::Path;
use std::process::Command;

use anyhow::bail;

use super::common::{bench_dir, dir_bytes, median, model, pack_with, timed};
use fixtures::workspace::root;

/// Median times of `reps` runs: `cp -r`, `cp -r && sync`, and the pack.
struct PackTimes {
    pack: f64,
    cp: f64,
    cp_sync: f64,
    rss: u64,
    out_bytes: u64,
}

fn time_pack(model: &Path, dtypes: &[&str], reps: usize) -> anyhow::Result<PackTimes> {
    let copy = bench_dir().join("cp-copy");
    let out = bench_dir().join(format!("pack-{}", dtypes.join("-")));
    let (mut packs, mut cps, mut cpss, mut rss, mut out_bytes) =
        (Vec::new(), Vec::new(), Vec::new(), 0u64, 0u64);
    for _ in 0..reps {
        let _ = std::fs::remove_dir_all(&copy);
        let (c, _) = timed(Command::new("cp").arg("-r").arg(model).arg(&copy))?;
        cps.push(c);
        let _ = std::fs::remove_dir_all(&copy);
        let (cs, _) = timed(Command::new("sh").arg("-c").arg(format!(
            "cp -r '{}' '{}' && sync",
            model.display(),
            copy.display()
        )))?;
        cpss.push(cs);
        let _ = std::fs::remove_dir_all(&copy);
        let _ = std::fs::remove_dir_all(&out);
        let (p, report) = pack_with(model, &out, dtypes)?;
        packs.push(p);
        rss = rss.max(report["peak_rss_bytes"].as_u64().unwrap_or(0));
        out_bytes = dir_bytes(&out)?;
    }
    Ok(PackTimes {
        pack: median(packs),
        cp: median(cps),
        cp_sync: median(cpss),
        rss,
        out_bytes,
    })
}

/// `scripts/reference_pack.py` on `model` with `dtypes` (median of `reps`),
/// after checking that it writes the same files as gkq-pack did in `ours`.
fn time_reference(model: &Path, dtypes: &[&str], ours: &Path, reps: usize) -> anyhow::Result<f64> {
    let out = bench_dir().join("pack-reference");
    let mut times = Vec::new();
    for _ in 0..reps {
        let _ = std::fs::remove_dir_all(&out);
        let mut cmd = Command::new("python3");
        cmd.arg(root().join("scripts/reference_pack.py"))
            .arg(model)
            .arg(&out)
            .args(["--tool", &format!("gkq-pack {}", env!("CARGO_PKG_VERSION"))]);
        for d in dtypes {
            cmd.args(["--dtype", d]);
        }
        times.push(timed(&mut cmd)?.0);
    }
    for e in std::fs::read_dir(ours)? {
        let name = e?.file_name();
        let same = Command::new("cmp")
            .arg("-s")
            .arg(ours.join(&name))
            .arg(out.join(&name))
            .status()?
            .success();
        if !same {
            bail!("reference_pack.py wrote a different {name:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(median(times))
}

/// The qwen2.5-0.5b preset as a q4_0 GGUF, written once by gguf-py
/// (`scripts/gguf_from_model.py`) under `target/bench`.
fn preset_gguf(model: &Path) -> anyhow::Result<std::path::PathBuf> {
    let dir = bench_dir().join("qwen2.5-0.5b-gguf");
    let file = dir.join("qwen2.5-0.5b-q4_0.gguf");
    let stamp = dir.join(".complete");
    if !stamp.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        eprintln!("bench: writing the preset as a q4_0 GGUF with gguf-py");
        fixtures::gguf::write(model, &file, "q4_0", None)?;
        std::fs::write(&stamp, "")?;
    }
    Ok(file)
}

/// The GGUF row: pack the q4_0 GGUF (nothing re-encoded) against `cp` of
/// the GGUF and `cp -r` of the package, each with `sync` (medians).
fn gguf_row(model: &Path, reps: usize) -> anyhow::Result<()> {
    let gguf = preset_gguf(model)?;
    let out = bench_dir().join("pack-gguf-q4_0");
    let copy = bench_dir().join("cp-copy");
    let (mut packs, mut cp_in, mut cp_out, mut rss) = (Vec::new(), Vec::new(), Vec::new(), 0u64);
    for _ in 0..reps {
        let _ = std::fs::remove_dir_all(&out);
        let mut cmd = Command::new(super::common::release_bin("gkq-pack"));
        cmd.arg(&gguf)
            .arg("--out")
            .arg(&out)
            .args(["--json", "--force"]);
        let (p, stdout) = timed(&mut cmd)?;
        packs.push(p);
        let report: serde_json::Value = serde_json::from_slice(&stdout)?;
        rss = rss.max(report["peak_rss_bytes"].as_u64().unwrap_or(0));
        for (from, times) in [(&gguf, &mut cp_in), (&out, &mut cp_out)] {
            let _ = std::fs::remove_dir_all(&copy);
            let _ = std::fs::remove_file(&copy);
            let sh = format!("cp -r '{}' '{}' && sync", from.display(), copy.display());
            times.push(timed(Command::new("sh").arg("-c").arg(sh))?.0);
        }
    }
    let _ = std::fs::remove_dir_all(&copy);
    let _ = std::fs::remove_file(&copy);
    let (pack, cin, cout) = (median(packs), median(cp_in), median(cp_out));
    let input = std::fs::metadata(&gguf)?.len() as f64;
    println!();
    println!(
        "GGUF in (issue 30): the preset as a q4_0 GGUF written by gguf-py ({:.1} MB), packed as it is (every tensor's bytes kept; row files, proofs and runs objects of the q4_0 embedding added), {reps} runs each, medians:",
        input / 1e6
    );
    println!(
        "| input | pack s | peak RSS MiB | output MB | cp GGUF && sync s | pack / that | cp -r output && sync s | pack / that (target 1.5) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| q4_0 GGUF | {pack:.2} | {:.0} | {:.1} | {cin:.2} | {:.2} | {cout:.2} | {:.2} ({}) |",
        rss as f64 / (1 << 20) as f64,
        dir_bytes(&out)? as f64 / 1e6,
        pack / cin,
        pack / cout,
        if pack / cout <= 1.5 { "met" } else { "missed" }
    );
    Ok(())
}

/// The GGUF row alone (`cargo xtask bench pack-gguf`).
pub(crate) fn gguf_only(reps: usize) -> anyhow::Result<()> {
    gguf_row(&model()?, reps)
}

pub(crate) fn run(reps: usize) -> anyhow::Result<()> {
    let model = model()?;
    let input = dir_bytes(&model)?;
    println!(
        "bench pack: qwen2.5-0.5b preset, {:.1} MB of bf16 safetensors, {reps} runs each, medians",
        input as f64 / 1e6
    );
    println!(
        "gkq-pack syncs its output to disk before the atomic rename; `cp -r` does not, so `cp -r && sync` is shown too. The Python reference is scripts/reference_pack.py (numpy + hashlib, fsync), checked here to write the same files."
    );
    println!(
        "| --dtype | pack s | input MB/s | peak RSS MiB | output MB | cp -r s | cp -r && sync s | pack/(cp+sync) (goal 1.5) | Python reference s | pack/Python (goal 0.2) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for dtypes in [&["bf16"][..], &["f32"], &["f32", "bf16"]] {
        let t = time_pack(&model, dtypes, reps)?;
        let (py, ratio) = if dtypes.len() == 2 {
            let ours = bench_dir().join(format!("pack-{}", dtypes.join("-")));
            let py = time_reference(&model, dtypes, &ours, reps)?;
            (format!("{py:.2}"), format!("{:.2}", t.pack / py))
        } else {
            (String::new(), String::new())
        };
        println!(
            "| {} | {:.2} | {:.0} | {:.0} | {:.1} | {:.2} | {:.2} | {:.2} | {py} | {ratio} |",
            dtypes.join(" + "),
            t.pack,
            input as f64 / 1e6 / t.pack,
            t.rss as f64 / (1 << 20) as f64,
            t.out_bytes as f64 / 1e6,
            t.cp,
            t.cp_sync,
            t.pack / t.cp_sync,
        );
    }
    gguf_row(&model, reps)
}
