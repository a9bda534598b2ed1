//! `cargo xtask bench quantize` (issue 55): `gkq-pack --quant` against
//! `llama-quantize` on the same file, the bf16 GGUF of the qwen2.5-0.5b
//! preset (packed bf16, exported with `gkq-export --gguf`), both with the
//! machine's threads; q4_0 and Q4_K_M, the two tools interleaved, wall
//! time medians of `reps` pairs (after a `sync`, from spawn to exit).

use std::process::Command;

use super::common::{bench_dir, median, model, release_bin, run_cmd, timed};

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
        "| type | gkq-pack wall s | llama-quantize wall s | × (median of the pairs' ratios) |"
    );
    println!("|---|---:|---:|---:|");
    for (ours, theirs) in [("q4_0", "Q4_0"), ("Q4_K_M", "Q4_K_M")] {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let out = dir.join(format!("gkq-{ours}"));
            let args = ["--quant", ours, "--force", "--quiet", "--out"];
            a.push(timed(gkq("gkq-pack").arg(&gguf).args(args).arg(out))?.0);
            let out = dir.join(format!("llama-{theirs}.gguf"));
            b.push(
                timed(
                    Command::new(bin.join("llama-quantize"))
                        .arg(&gguf)
                        .arg(out)
                        .arg(theirs),
                )?
                .0,
            );
        }
        let ratio = median(a.iter().zip(&b).map(|(x, y)| x / y).collect());
        println!(
            "| {ours} | {:.2} | {:.2} | {ratio:.2} |",
            median(a),
            median(b)
        );
    }
    Ok(())
}
