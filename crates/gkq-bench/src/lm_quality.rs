//! What a narrower lm_head costs, measured as llama-perplexity measures
//! it, by both tools (issue 54): a base run of the file's own lm_head
//! writes its log-probabilities (`--kl-divergence-base`), and each
//! requantized lm_head is compared with it (`--kl-divergence`): perplexity,
//! mean KL divergence, the same top token. gkq-decode runs the packages
//! gkq-pack makes with `--output-tensor-type T --allow-requantize`;
//! llama-perplexity runs the GGUFs llama-quantize makes with the same two
//! flags (every other tensor pinned to its own type, so that only the
//! lm_head changes). The two tools also read each other's base files: the
//! node against llama.cpp on the file itself.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

use super::common::{bench_dir, release_bin};

/// The chunk of the perplexity runs: 6 chunks of the text.
pub(crate) const PPL_CTX: &str = "128";

/// What one tool measured for one lm_head.
#[derive(Clone, Copy, Default)]
pub(crate) struct Quality {
    pub(crate) ppl: f64,
    /// Mean KL divergence from the base (0 for the base itself).
    pub(crate) kld: f64,
    /// Same top token as the base (a fraction).
    pub(crate) same_top: f64,
}

/// The text perplexity is measured on: the workloads' single-session
/// files but the short question (long_context, prose, code), about 770
/// tokens.
fn ppl_text() -> anyhow::Result<PathBuf> {
    let mut text = String::new();
    for p in fixtures::texts::workloads() {
        if p.extension().is_some_and(|e| e == "txt") && !p.ends_with("qa_short.txt") {
            text.push_str(&std::fs::read_to_string(&p)?);
        }
    }
    let out = bench_dir().join("qwen/ppl.txt");
    std::fs::write(&out, text)?;
    Ok(out)
}

/// `gkq-decode --json` on the local package at `rel` with `args`.
fn ours(rel: &str, args: &[&str]) -> anyhow::Result<Value> {
    let o = Command::new(release_bin("gkq-decode"))
        .arg(bench_dir().join(rel).join("model.knot"))
        .args(["--no-cache", "--json"])
        .args(args)
        .output()?;
    if !o.status.success() {
        bail!(
            "gkq-decode {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(serde_json::from_slice(&o.stdout)?)
}

fn ours_kld(rel: &str, base: &Path) -> anyhow::Result<Quality> {
    let b = base.to_str().context("utf-8")?;
    let v = ours(rel, &["--kl-divergence", "--kl-divergence-base", b])?;
    let f = |k: &str| v[k].as_f64().with_context(|| format!("{k} in {v}"));
    Ok(Quality {
        ppl: f("perplexity")?,
        kld: f("kld")?,
        same_top: f("same_top")?,
    })
}

/// `llama-perplexity -m gguf -t 2` with `args`: its stdout and stderr.
fn llama(gguf: &Path, args: &[&str]) -> anyhow::Result<String> {
    let (bin, _) = super::llama_cpp::llama_cpp()?;
    let o = Command::new(bin.join("llama-perplexity"))
        .arg("-m")
        .arg(gguf)
        .args(["-t", "2"])
        .args(args)
        .output()?;
    let all = String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        bail!("llama-perplexity {args:?}: {all}");
    }
    Ok(all)
}

/// The number after `label` on its line of llama-perplexity's output.
fn after(all: &str, label: &str) -> anyhow::Result<f64> {
    let line = all
        .lines()
        .find(|l| l.starts_with(label) || l.contains(label))
        .with_context(|| format!("llama-perplexity printed no {label:?}: {all}"))?;
    let rest = &line[line.find(label).unwrap_or(0) + label.len()..];
    let v = rest
        .trim_start_matches([' ', ':', '='])
        .split_whitespace()
        .next();
    Ok(v.context("a number")?.parse()?)
}

fn llama_kld(gguf: &Path, base: &Path) -> anyhow::Result<Quality> {
    let b = base.to_str().context("utf-8")?;
    let all = llama(gguf, &["--kl-divergence-base", b, "--kl-divergence"])?;
    Ok(Quality {
        ppl: after(&all, "Mean PPL(Q)")?,
        kld: after(&all, "Mean    KLD:")?,
        same_top: after(&all, "Same top p:")? / 100.0,
    })
}

/// A GGUF's tensors, by gguf-py: (name, type, sha256 of its bytes).
fn tensors(gguf: &Path) -> anyhow::Result<Vec<(String, String, String)>> {
    let script = fixtures::workspace::root().join("scripts/gguf_dump.py");
    let o = Command::new("python3").arg(script).arg(gguf).output()?;
    if !o.status.success() {
        bail!("gguf_dump.py: {}", String::from_utf8_lossy(&o.stderr));
    }
    let v: Value = serde_json::from_slice(&o.stdout)?;
    let s = |t: &Value, k: &str| t[k].as_str().unwrap_or_default().to_owned();
    Ok(v["tensors"]
        .as_array()
        .context("tensors")?
        .iter()
        .map(|t| (s(t, "name"), s(t, "type"), s(t, "sha256")))
        .collect())
}

/// `llama-quantize --allow-requantize --output-tensor-type t`, every other
/// tensor pinned to its own type (`--tensor-type-file`), so that it is
/// copied, not requantized.
fn llama_requantize(gguf: &Path, t: &str, out: &Path) -> anyhow::Result<()> {
    let (bin, _) = super::llama_cpp::llama_cpp()?;
    let keep = out.with_extension("types");
    let lines: Vec<String> = tensors(gguf)?
        .into_iter()
        .filter(|(name, ..)| name != "output.weight")
        .map(|(name, ty, _)| format!("^{}$={}", name.replace('.', "\\."), ty.to_lowercase()))
        .collect();
    std::fs::write(&keep, lines.join("\n"))?;
    // its log is a line a tensor: shown only when it fails
    let o = Command::new(bin.join("llama-quantize"))
        .args(["--allow-requantize", "--output-tensor-type", t])
        .arg("--tensor-type-file")
        .arg(&keep)
        .arg(gguf)
        .arg(out)
        .args(["Q4_K_M", "2"])
        .output()?;
    if !o.status.success() {
        bail!(
            "llama-quantize --output-tensor-type {t}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(())
}

/// The lm_head's SHA-256 in the package at `rel` (its knot's block).
fn package_lm_head(rel: &str) -> anyhow::Result<String> {
    let o = Command::new(release_bin("gkq-inspect"))
        .arg(bench_dir().join(rel).join("model.knot"))
        .arg("--json")
        .output()?;
    let v: Value = serde_json::from_slice(&o.stdout).context("gkq-inspect --json")?;
    let block = v["blocks"]
        .as_array()
        .context("blocks")?
        .iter()
        .find(|b| b["name"] == "output.weight")
        .context("no output.weight block")?;
    Ok(block["sha256"].as_str().unwrap_or_default().to_owned())
}

/// One lm_head type's row: gkq-decode's and llama.cpp's figures, and
/// whether gkq-pack wrote the bytes llama-quantize wrote.
pub(crate) struct Row {
    pub(crate) ours: Quality,
    pub(crate) llama: Quality,
    pub(crate) same_bytes: bool,
}

/// Rows for `packs` (the file's own lm_head first) of the GGUF `gguf`
/// with the types `types`, and a line on how far the node is from
/// llama.cpp on the file itself, each tool reading the other's base.
pub(crate) fn rows(
    gguf: &Path,
    packs: &[String],
    types: &[&str],
) -> anyhow::Result<(Vec<Row>, String)> {
    let text = ppl_text()?;
    let t = text.to_str().context("utf-8")?;
    let dir = bench_dir().join("qwen");
    let (our_base, llama_base) = (dir.join("gkq.kld"), dir.join("llama.kld"));
    let ob = our_base.to_str().context("utf-8")?;
    let lb = llama_base.to_str().context("utf-8")?;
    let base = ours(
        &packs[0],
        &[
            "--perplexity",
            "-c",
            PPL_CTX,
            "-f",
            t,
            "--kl-divergence-base",
            ob,
        ],
    )?;
    let own_ppl = base["perplexity"].as_f64().context("perplexity")?;
    let all = llama(gguf, &["-f", t, "-c", PPL_CTX, "--kl-divergence-base", lb])?;
    let llama_ppl = after(&all, "Final estimate: PPL =")?;
    let own_sha = tensors(gguf)?
        .into_iter()
        .find(|(n, ..)| n == "output.weight")
        .map(|(.., s)| s);
    let mut rows = vec![Row {
        ours: Quality {
            ppl: own_ppl,
            kld: 0.0,
            same_top: 1.0,
        },
        llama: Quality {
            ppl: llama_ppl,
            kld: 0.0,
            same_top: 1.0,
        },
        same_bytes: own_sha == Some(package_lm_head(&packs[0])?),
    }];
    for (t, rel) in types.iter().zip(packs).skip(1) {
        let req = dir.join(format!("lm-{t}.gguf"));
        llama_requantize(gguf, t, &req)?;
        let sha = tensors(&req)?
            .into_iter()
            .find(|(n, ..)| n == "output.weight")
            .map(|(.., s)| s);
        rows.push(Row {
            ours: ours_kld(rel, &our_base)?,
            llama: llama_kld(&req, &llama_base)?,
            same_bytes: sha == Some(package_lm_head(rel)?),
        });
        std::fs::remove_file(&req)?;
    }
    let node_vs_llama = ours_kld(&packs[0], &llama_base)?;
    let llama_vs_node = llama_kld(gguf, &our_base)?;
    let summary = format!(
        "\nthe file itself, each tool reading the other's base (-c {PPL_CTX}, ~770 tokens): perplexity gkq-decode {own_ppl:.4}, llama-perplexity {llama_ppl:.4}: {:.3} % apart (target: within 0.5 %); KL divergence of the node from llama.cpp {:.5} (same top token {:.1} %), of llama.cpp from the node {:.5} ({:.1} %)",
        (own_ppl / llama_ppl - 1.0).abs() * 100.0,
        node_vs_llama.kld,
        node_vs_llama.same_top * 100.0,
        llama_vs_node.kld,
        llama_vs_node.same_top * 100.0,
    );
    Ok((rows, summary))
}
