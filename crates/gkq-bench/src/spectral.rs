//! `cargo xtask bench spectral` (issue 14): what `--analyze` and
//! `--spectral` cost, against a dense pack of the same model in the same
//! run.
//!
//! 1. The qwen2.5-0.5b shapes in one layer (896×896, 128×896, 4864×896,
//!    896×4864; vocab 8192): `--analyze` time per matrix, and the time a
//!    rank-64 `--spectral` adds for a 896×896 and a 4864×896 matrix.
//! 2. The qwen2.5-0.5b preset: a dense bf16 pack against one with
//!    `--spectral 'model.layers.*.self_attn.k_proj.weight=rank:64'`.

use std::path::Path;
use std::process::Command;

use anyhow::Context;

use super::common::{bench_dir, model, preset, release_bin};

/// Packs with `--dtype bf16` and the given `--spectral` arguments; median
/// wall time over `reps`, and the last report.
fn pack(
    model: &Path,
    out: &Path,
    spectral: &[&str],
    reps: usize,
) -> anyhow::Result<(f64, serde_json::Value)> {
    let mut times = Vec::new();
    let mut report = serde_json::Value::Null;
    for _ in 0..reps {
        let mut cmd = Command::new(release_bin("gkq-pack"));
        cmd.arg(model)
            .arg("--out")
            .arg(out)
            .args(["--json", "--force", "--dtype", "bf16"]);
        for s in spectral {
            cmd.args(["--spectral", s]);
        }
        let (secs, stdout) = crate::common::timed(&mut cmd)?;
        times.push(secs);
        report = serde_json::from_slice(&stdout)?;
    }
    Ok((crate::common::median(times), report))
}

fn knot_bytes(report: &serde_json::Value) -> u64 {
    report["knot"]["bytes"].as_u64().unwrap_or(0)
}

/// `--analyze` on the one-layer shapes, one line per tensor.
fn analyze(shapes: &std::path::Path) -> anyhow::Result<()> {
    let (secs, stdout) = crate::common::timed(
        Command::new(release_bin("gkq-pack"))
            .arg(shapes)
            .args(["--analyze", "--json"]),
    )?;
    let analysis: serde_json::Value = serde_json::from_slice(&stdout)?;
    println!(
        "bench spectral: qwen2.5-0.5b shapes in one layer (bf16, vocab 8192); --analyze in {secs:.2} s (every 2-D tensor, f64 singular values, one thread)"
    );
    println!("| tensor | shape | --analyze s | rank for 99 % energy | error at rank 64 |");
    println!("|---|---|---:|---:|---:|");
    for t in analysis["tensors"].as_array().context("tensors")? {
        println!(
            "| {} | {}×{} | {:.3} | {} | {:.3} |",
            t["tensor"].as_str().unwrap_or(""),
            t["shape"][0],
            t["shape"][1],
            t["seconds"].as_f64().unwrap_or(0.0),
            t["rank_for_energy"][0],
            t["at_rank"][1]["rel_frobenius_error"]
                .as_f64()
                .unwrap_or(0.0),
        );
    }
    Ok(())
}

/// One-layer packs with one rank-64 matrix, against the dense pack.
fn one_layer(shapes: &std::path::Path, out: &std::path::Path, reps: usize) -> anyhow::Result<()> {
    let (dense, _) = pack(shapes, out, &[], reps)?;
    println!(
        "`gkq-pack --dtype bf16` of the one-layer model: dense {dense:.2} s (median of {reps}); with one rank-64 spectral matrix:"
    );
    println!(
        "| --spectral | pack s | pack/dense | SVD+encode+check s | block bytes | dense bytes | rel. Frobenius error |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for arg in [
        "model.layers.0.self_attn.q_proj.weight=rank:64",
        "model.layers.0.mlp.gate_proj.weight=rank:64",
        "model.layers.0.mlp.gate_proj.weight=rank:64,quant:u8",
    ] {
        let (secs, report) = pack(shapes, out, &[arg], reps)?;
        let s = &report["spectral"][0];
        println!(
            "| `{arg}` | {secs:.2} | {:.2} | {:.3} | {} | {} | {:.4} |",
            secs / dense,
            s["seconds"].as_f64().unwrap_or(0.0),
            s["bytes"],
            s["dense_bytes"],
            s["rel_frobenius_error"].as_f64().unwrap_or(0.0),
        );
    }
    Ok(())
}

pub(crate) fn run(reps: usize) -> anyhow::Result<()> {
    let shapes = preset("qwen2.5-0.5b-1layer")?;
    analyze(&shapes)?;
    println!();
    let out = bench_dir().join("pack-spectral");
    one_layer(&shapes, &out, reps)?;
    println!();
    let full = model()?;
    let arg = "model.layers.*.self_attn.k_proj.weight=rank:64";
    let (dense, dr) = pack(&full, &out, &[], reps)?;
    let (spec, sr) = pack(&full, &out, &[arg], reps)?;
    let blocks = sr["spectral"].as_array().context("spectral")?;
    let svd: f64 = blocks.iter().filter_map(|b| b["seconds"].as_f64()).sum();
    let errs: Vec<f64> = blocks
        .iter()
        .filter_map(|b| b["rel_frobenius_error"].as_f64())
        .collect();
    let mean = errs.iter().sum::<f64>() / errs.len().max(1) as f64;
    let max = errs.iter().copied().fold(0.0, f64::max);
    println!("qwen2.5-0.5b preset, `gkq-pack --dtype bf16`, median of {reps}:");
    println!(
        "| pack | s | ratio | knot bytes | spectral blocks | SVD+encode+check s (sum, 2 at a time) | mean / max rel. error |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    println!(
        "| dense | {dense:.2} | 1.00 | {} | 0 | | |",
        knot_bytes(&dr)
    );
    println!(
        "| `--spectral '{arg}'` | {spec:.2} | {:.2} | {} | {} | {svd:.2} | {mean:.3} / {max:.3} |",
        spec / dense,
        knot_bytes(&sr),
        blocks.len()
    );
    println!(
        "(the fixture's weights are random, so they are not low-rank: the error is what a rank-64 cut of a full-rank 128×896 matrix costs; see the MiniLM table for real weights)"
    );
    Ok(())
}
