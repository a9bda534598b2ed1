//! `cargo xtask bench quantize` (issue 55): `gkq-pack --quant` against
//! `llama-quantize` on the same file, the bf16 GGUF of the qwen2.5-0.5b
//! preset (packed bf16, exported with `gkq-export --gguf`), both with the
//! machine's threads; q4_0 and Q4_K_M, the two tools interleaved, wall
//! time medians of `reps` pairs (after a `sync`, from spawn to exit), and
//! their CPU time. Each run writes to a path its previous output was
//! removed from, as a CI job writes to a clean workspace: overwriting
//! would favour llama-quantize, which truncates its old output before
//! writing and so reuses its page cache, while `gkq-pack --force` keeps
//! the old package until the new one is complete.

use std::ffi::OsStr;
use std::process::Command;

use super::common::{bench_dir, median, model, release_bin, run_cmd, timed_cpu};

pub(crate) fn run(reps: usize) -> anyhow::Result<()> {
    let (bin, _) = super::llama_cpp::llama_cpp()?;
    let dir = bench_dir().join("quantize");
    std::fs::create_dir_all(&dir)?;
    let (gguf, pkg) = (dir.join("bf16.gguf"), dir.join("bf16"));
    let gkq = |name: &str| Command::new(release_bin(name));
    run_cmd(
        gkq("gkq-pack")
            .arg(model()?)
            .arg("--out")
            .arg(&pkg)
            .args(["--force", "--quiet"]),
    )?;
    run_cmd(
        gkq("gkq-export")
            .arg("--gguf")
            .arg(&gguf)
            .arg(&pkg)
            .args(["--no-cache", "--force"]),
    )?;
    let bytes = std::fs::metadata(&gguf)?.len();
    println!(
        "bench quantize: the qwen2.5-0.5b preset's bf16 GGUF ({bytes} B), quantized by gkq-pack --quant and by llama-quantize (llama-cpp-python 0.3.36's llama.cpp), {reps} interleaved pairs, medians"
    );
    println!();
    println!(
        "| type | gkq-pack wall s | llama-quantize wall s | × (median of the pairs' ratios) | gkq-pack CPU s | llama-quantize CPU s |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let quantize = bin.join("llama-quantize");
    for (ours, theirs) in [("q4_0", "Q4_0"), ("Q4_K_M", "Q4_K_M")] {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let out = dir.join(format!("gkq-{ours}"));
            remove(&out)?;
            let flags = ["--quant", ours, "--quiet", "--out"].map(OsStr::new);
            let args = [&[gguf.as_os_str()], &flags[..], &[out.as_os_str()]].concat();
            a.push(timed_cpu(&release_bin("gkq-pack"), &args)?);
            let out = dir.join(format!("llama-{theirs}.gguf"));
            remove(&out)?;
            let args = [gguf.as_os_str(), out.as_os_str(), OsStr::new(theirs)];
            b.push(timed_cpu(&quantize, &args)?);
        }
        let ratio = median(a.iter().zip(&b).map(|(x, y)| x.0 / y.0).collect());
        let med = |v: &[(f64, f64)], cpu: bool| {
            median(v.iter().map(|p| if cpu { p.1 } else { p.0 }).collect())
        };
        println!(
            "| {ours} | {:.2} | {:.2} | {ratio:.2} | {:.2} | {:.2} |",
            med(&a, false),
            med(&b, false),
            med(&a, true),
            med(&b, true)
        );
    }
    Ok(())
}

/// Removes a previous run's output, a file or a package directory.
fn remove(path: &std::path::Path) -> anyhow::Result<()> {
    let gone = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match gone {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}
