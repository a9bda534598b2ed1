//! `cargo xtask bench pack`: the qwen2.5-0.5b preset packed with each
//! `--dtype`, against `cp -r` (and `cp -r && sync`) and the Python
//! reference converter, in the same run.

use std::path::Path;
use std::process::Command;

use anyhow::bail;

use super::common::{bench_dir, dir_bytes, median, model, pack_with, timed};
use crate::root;

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
    Ok(())
}
