//! `cargo xtask bench llama-cpp` (issues 44, 45, 47): gkq-decode against
//! llama.cpp, the runtime our operators already run, on the same GGUF, the
//! same prompt ids, the same thread count, interleaved round by round (the
//! machine is noisy): medians of prefill tok/s (gkq-decode's with
//! `--load-first`, as llama.cpp loads before the prompt, and beside the
//! load as it starts by default), generation tok/s, time to the first token
//! from process start and peak RSS, as ratios. llama.cpp is
//! built once from the llama-cpp-python sdist on PyPI (its
//! `vendor/llama.cpp`), and `scripts/llama_driver.cpp` against its
//! libllama runs it greedily from ids. Then two checks against llama.cpp's
//! own tools: a safetensors-born package exported with `gkq-export --gguf`
//! loads and runs in llama.cpp, and `gkq-pack --quant Q4_K_M` stores every
//! tensor of the qwen2.5-0.5b preset in the type llama-quantize picks. For
//! the real models, the cold start over the network too (`llama_cold.rs`).
//!
//! `GKQ_LLAMA_CPP=DIR` uses an llama.cpp tree already built in `DIR/build`;
//! `GKQ_LLAMA_BENCH=tokenizer,smollm2,gemma3,preset` runs only those parts
//! (`cold-only` among them: the real models' cold start alone);
//! `GKQ_LLAMA_THREADS=N` runs both runtimes on N threads instead of 2.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::common::{bench_dir, median, release_bin};
use crate::common::run_cmd;
use fixtures::workspace::root;

/// The sdist's directory (scripts/build-llama-cpp.sh fetches and builds it).
const SDIST_DIR: &str = "llama_cpp_python-0.3.36";
const ROUNDS: usize = 5;
const NEW_TOKENS: &str = "64";

/// Threads for both runtimes: 2, or `GKQ_LLAMA_THREADS` (1 to measure a
/// single thread: issue 53 asks for 1, 2 and the machine's cores).
fn threads() -> String {
    std::env::var("GKQ_LLAMA_THREADS").unwrap_or_else(|_| "2".into())
}

/// The llama.cpp tree, built (libllama, llama-quantize, llama-tokenize) by
/// `scripts/build-llama-cpp.sh`, and the driver.
pub(crate) fn llama_cpp() -> anyhow::Result<(PathBuf, PathBuf)> {
    let top = bench_dir().join("llama-cpp");
    let src = match std::env::var_os("GKQ_LLAMA_CPP") {
        Some(d) => PathBuf::from(d),
        None => top.join(SDIST_DIR).join("vendor/llama.cpp"),
    };
    run_cmd(
        Command::new("bash")
            .arg(root().join("scripts/build-llama-cpp.sh"))
            .arg(&top)
            .arg(&src),
    )?;
    Ok((src.join("build/bin"), src.join("build/gkq_llama_driver")))
}

fn json_of(cmd: &mut Command) -> anyhow::Result<Value> {
    let o = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !o.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    let line = String::from_utf8_lossy(&o.stdout);
    let last = line.lines().last().context("no JSON line")?;
    Ok(serde_json::from_str(last)?)
}

/// The four figures of one run, llama.cpp's and gkq-decode's JSON alike.
fn figures(v: &Value) -> anyhow::Result<[f64; 4]> {
    let f = |k: &str| v[k].as_f64().with_context(|| format!("{k} in {v}"));
    Ok([
        f("prefill_tokens_per_second")?,
        f("tokens_per_second")?,
        f("time_to_first_token_from_start_ms")?,
        f("peak_rss_bytes")? / 1e6,
    ])
}

fn gkq(pkg: &Path, ids: &str, logits: Option<&Path>, more: &[&str]) -> anyhow::Result<Value> {
    let mut cmd = Command::new(release_bin("gkq-decode"));
    if let Some(l) = logits {
        cmd.arg("--logits-out").arg(l);
    }
    cmd.args(more);
    let ours = ["--prompt-ids", ids, "--no-cache", "--json"];
    json_of(cmd.arg(pkg).args(ours).args(run_flags()))
}

/// What both runtimes are given: new tokens, no stop at its end, threads.
fn run_flags() -> [String; 5] {
    ["-n", NEW_TOKENS, "--ignore-eos", "-t", &threads()].map(String::from)
}

fn llama(driver: &Path, gguf: &Path, ids: &str, logits: Option<&Path>) -> anyhow::Result<Value> {
    let mut cmd = Command::new(driver);
    if let Some(l) = logits {
        cmd.arg("--logits-out").arg(l);
    }
    json_of(
        cmd.arg("-m")
            .arg(gguf)
            .args(["--ids", ids])
            .args(run_flags()),
    )
}

/// The prompt ids of a gkq-decode prompt (`--chat TEXT` or `-f FILE`), by
/// the package's own tokenizer (equal to llama.cpp's: the suite checks it).
fn prompt_ids(pkg: &Path, prompt: &[&str]) -> anyhow::Result<String> {
    let v = json_of(
        Command::new(release_bin("gkq-decode"))
            .arg(pkg)
            .args(prompt)
            .args(["-n", "1", "--no-cache", "--json"]),
    )?;
    let ids: Vec<String> = v["prompt_ids"]
        .as_array()
        .context("prompt_ids")?
        .iter()
        .map(|i| i.to_string())
        .collect();
    Ok(ids.join(","))
}

/// The step-0 logits of both runtimes: the same first token (argmax), and
/// their Pearson correlation.
fn logits_agree(gkq: &Path, llama: &Path) -> anyhow::Result<(bool, f64)> {
    let read = |p: &Path| -> anyhow::Result<Vec<f64>> {
        Ok(std::fs::read(p)?
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect())
    };
    let (a, b) = (read(gkq)?, read(llama)?);
    if a.len() != b.len() || a.is_empty() {
        bail!("step-0 logits of {} and {} values", a.len(), b.len());
    }
    let argmax = |v: &[f64]| (0..v.len()).max_by(|&i, &j| v[i].total_cmp(&v[j]));
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(&b) {
        sab += (x - ma) * (y - mb);
        saa += (x - ma) * (x - ma);
        sbb += (y - mb) * (y - mb);
    }
    Ok((argmax(&a) == argmax(&b), sab / (saa * sbb).sqrt()))
}

/// Figures per (prompt, runtime: [`RUNTIMES`]' index), and each prompt's
/// step-0 agreement (written in the first round).
type Runs<'a> = (BTreeMap<(&'a str, usize), Vec<[f64; 4]>>, Vec<(bool, f64)>);

/// The runs of a round: gkq-decode as it starts by default (the prompt
/// beside the load), gkq-decode `--load-first` (the prompt once every
/// weight is in, as llama.cpp runs it: the prefill's own speed), llama.cpp.
const RUNTIMES: [Option<&[&str]>; 3] = [Some(&[]), Some(&["--load-first"]), None];

/// Rounds × prompts, the runtimes taking turns at going first.
fn rounds<'a>(
    name: &str,
    (pkg, gguf): (&Path, &Path),
    driver: &Path,
    prompts: &'a [(&'a str, String)],
) -> anyhow::Result<Runs<'a>> {
    let (mut runs, mut agree) = (BTreeMap::new(), Vec::new());
    let dir = bench_dir().join("llama-cpp");
    for round in 0..ROUNDS {
        for (p, ids) in prompts {
            let (lg, ll) = (dir.join("logits-gkq.f32"), dir.join("logits-llama.f32"));
            let (lg_arg, ll_arg) = match round {
                0 => (Some(lg.as_path()), Some(ll.as_path())),
                _ => (None, None),
            };
            for k in 0..RUNTIMES.len() {
                let rt = (k + round) % RUNTIMES.len();
                let v = match RUNTIMES[rt] {
                    Some(more) => gkq(pkg, ids, lg_arg.filter(|_| rt == 0), more)?,
                    None => llama(driver, gguf, ids, ll_arg)?,
                };
                runs.entry((*p, rt))
                    .or_insert_with(Vec::new)
                    .push(figures(&v)?);
            }
            if round == 0 {
                agree.push(logits_agree(&lg, &ll)?);
            }
        }
        eprintln!("bench: {name}: round {} of {ROUNDS}", round + 1);
    }
    Ok((runs, agree))
}

/// One model: the medians and the ratios, and the step-0 agreement.
fn compare(
    name: &str,
    files: (&Path, &Path),
    driver: &Path,
    prompts: &[(&str, String)],
) -> anyhow::Result<()> {
    let (runs, agree) = rounds(name, files, driver, prompts)?;
    println!(
        "\n{name}: medians over {ROUNDS} rounds, {} threads, {NEW_TOKENS} tokens generated (gkq-decode / llama.cpp = ratio); step 0 against llama.cpp",
        threads()
    );
    println!(
        "| prompt | tokens | prefill tok/s (--load-first) | prefill tok/s beside the load (default) | generation tok/s | time to first token (ms) | peak RSS (MB) | same first token | step-0 logits Pearson r |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|---:|");
    let mut all: [Vec<f64>; 5] = Default::default();
    for ((p, ids), (same, r)) in prompts.iter().zip(&agree) {
        // (runtime, figure) of each column: the prefill of --load-first,
        // then the default run's four; llama.cpp's own figure each time
        let cols = [(1, 0), (0, 0), (0, 1), (0, 2), (0, 3)];
        let mut cells = Vec::new();
        for ((rt, k), col) in cols.into_iter().zip(all.iter_mut()) {
            let of = |rt: usize| median(runs[&(*p, rt)].iter().map(|f| f[k]).collect());
            let (mg, ml) = (of(rt), of(2));
            col.push(mg / ml);
            cells.push(format!("{mg:.1} / {ml:.1} = {:.2}×", mg / ml));
        }
        let same = if *same { "yes" } else { "no" };
        println!(
            "| {p} | {} | {} | {same} | {r:.5} |",
            ids.split(',').count(),
            cells.join(" | ")
        );
    }
    let m: Vec<String> = all
        .into_iter()
        .map(|c| format!("{:.2}×", median(c)))
        .collect();
    println!("| median ratio | | {} | | |", m.join(" | "));
    Ok(())
}

/// A real model's GGUF (`target/real-models`, fetched by
/// scripts/install-test-deps.sh), packed, on a chat, a ~500-token document
/// and code.
fn real_model(name: &str, file: &str, driver: &Path, parts: Parts) -> anyhow::Result<()> {
    let gguf = root().join("target/real-models").join(file);
    if !gguf.exists() {
        bail!("{}: run scripts/install-test-deps.sh", gguf.display());
    }
    let pkg = bench_dir()
        .join("llama-cpp")
        .join(file.trim_end_matches(".gguf"));
    run_cmd(
        Command::new(release_bin("gkq-pack"))
            .arg(&gguf)
            .arg("--out")
            .arg(&pkg)
            .arg("--force")
            .arg("--quiet"),
    )?;
    let texts = root().join("fixtures/texts");
    let doc = texts.join("long_context.txt");
    let code = texts.join("code.txt");
    let chat = [
        "--chat",
        "What is the capital of France? Answer in one sentence.",
    ];
    let prompts = vec![
        ("chat", prompt_ids(&pkg, &chat)?),
        (
            "document",
            prompt_ids(&pkg, &["-f", doc.to_str().context("utf8")?])?,
        ),
        (
            "code",
            prompt_ids(&pkg, &["-f", code.to_str().context("utf8")?])?,
        ),
    ];
    if parts.warm {
        compare(name, (&pkg, &gguf), driver, &prompts)?;
    }
    // the GGUF where nginx serves it, for the cold comparison
    let served = pkg.with_file_name(file);
    if std::fs::hard_link(&gguf, &served).is_err() && !served.exists() {
        std::fs::copy(&gguf, &served)?;
    }
    let chat = &prompts[0].1;
    super::llama_cold::cold(name, (&pkg, &served), driver, chat, (ROUNDS, &threads()))
}

/// Which comparisons of a real model run: the warm one (local files)
/// unless `cold-only`; the cold one always.
#[derive(Clone, Copy)]
struct Parts {
    warm: bool,
}

/// Every tensor's type in a GGUF, by gguf-py.
fn gguf_types(files: &[&Path]) -> anyhow::Result<BTreeMap<String, String>> {
    let o = Command::new("python3")
        .arg(root().join("scripts/gguf_dump.py"))
        .args(files)
        .output()?;
    if !o.status.success() {
        bail!("gguf_dump: {}", String::from_utf8_lossy(&o.stderr));
    }
    let v: Value = serde_json::from_slice(&o.stdout)?;
    let mut m = BTreeMap::new();
    for t in v["tensors"].as_array().context("tensors")? {
        m.insert(
            t["name"].as_str().context("name")?.to_owned(),
            t["type"].as_str().context("type")?.to_owned(),
        );
    }
    Ok(m)
}

/// `gkq-pack --quant Q4_K_M` against llama-quantize on the same weights:
/// the tensors whose types differ.
fn quant_types(
    bin: &Path,
    bf16_gguf: &Path,
    pack: &dyn Fn(&str, &[&str]) -> anyhow::Result<PathBuf>,
    export: &dyn Fn(&Path, &Path) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<String>> {
    let dir = bf16_gguf.parent().context("dir")?;
    let lq = dir.join("llama-quantize-q4_k_m.gguf");
    run_cmd(
        Command::new(bin.join("llama-quantize"))
            .arg(bf16_gguf)
            .arg(&lq)
            .arg("Q4_K_M"),
    )?;
    let ours = pack("q4_k_m", &["--quant", "Q4_K_M"])?;
    let ours_gguf = dir.join("gkq-q4_k_m.gguf");
    export(&ours, &ours_gguf)?;
    let (want, got) = (gguf_types(&[&lq])?, gguf_types(&[&ours_gguf])?);
    let differ: Vec<String> = want
        .iter()
        .filter(|(n, t)| got.get(*n) != Some(t))
        .map(|(n, t)| format!("{n}: llama-quantize {t}, gkq-pack {:?}", got.get(n)))
        .collect();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for t in want.values() {
        *counts.entry(t.as_str()).or_default() += 1;
    }
    println!(
        "--quant Q4_K_M on the preset: {} tensors, llama-quantize's types {counts:?}; {} differ",
        want.len(),
        differ.len()
    );
    for d in &differ {
        println!("  {d}");
    }
    Ok(differ)
}

/// The qwen2.5-0.5b preset: exported to GGUF from its bf16 package (llama.cpp
/// must load it), quantized by llama-quantize and by `gkq-pack --quant`
/// (the types must agree), then the q4_0 package against llama.cpp.
fn preset(bin: &Path, driver: &Path) -> anyhow::Result<()> {
    // with the Qwen2.5 tokenizer beside it: llama.cpp loads no GGUF without one
    let model = super::report::model_with_tokenizer()?;
    let dir = bench_dir().join("llama-cpp/preset");
    std::fs::create_dir_all(&dir)?;
    let pack = |out: &str, args: &[&str]| -> anyhow::Result<PathBuf> {
        let p = dir.join(out);
        run_cmd(
            Command::new(release_bin("gkq-pack"))
                .arg(&model)
                .arg("--out")
                .arg(&p)
                .arg("--force")
                .args(args),
        )?;
        Ok(p)
    };
    let export = |pkg: &Path, gguf: &Path| {
        run_cmd(
            Command::new(release_bin("gkq-export"))
                .arg("--gguf")
                .arg(gguf)
                .arg(pkg)
                .args(["--no-cache", "--force"]),
        )
    };
    // safetensors-born: bf16 package → GGUF → llama-quantize Q4_K_M
    let bf16 = pack("bf16", &["--dtype", "bf16"])?;
    let bf16_gguf = dir.join("bf16.gguf");
    export(&bf16, &bf16_gguf)?;
    let ids: Vec<String> = (0..32u32)
        .map(|i| ((i * 4_729 + 17) % 151_936).to_string())
        .collect();
    let ids = ids.join(",");
    let l = bench_dir().join("llama-cpp");
    let (lg, ll) = (l.join("logits-gkq.f32"), l.join("logits-llama.f32"));
    gkq(&bf16, &ids, Some(&lg), &[])?;
    let ran = llama(driver, &bf16_gguf, &ids, Some(&ll))?;
    let (same, r) = logits_agree(&lg, &ll)?;
    println!(
        "\nqwen2.5-0.5b preset, packed from safetensors at bf16 and exported with gkq-export --gguf: llama.cpp loads it and decodes {} tokens; step 0 against gkq-decode on the package: same first token {same}, logits Pearson r {r:.6}",
        ran["tokens"].as_array().map_or(0, Vec::len)
    );
    let differ = quant_types(bin, &bf16_gguf, &pack, &export)?;
    // the q4_0 package against llama.cpp on its export
    let q4 = pack("q4_0", &["--quant", "Q4_0"])?;
    let q4_gguf = dir.join("q4_0.gguf");
    export(&q4, &q4_gguf)?;
    compare(
        "qwen2.5-0.5b preset Q4_0 (random weights)",
        (&q4, &q4_gguf),
        driver,
        &[("32 ids", ids)],
    )?;
    if !differ.is_empty() {
        bail!(
            "--quant Q4_K_M differs from llama-quantize on {} tensors",
            differ.len()
        );
    }
    Ok(())
}

/// llama-tokenize's ids of each text of `texts` with the model `gguf`.
fn llama_tokenize(
    bin: &Path,
    gguf: &Path,
    texts: &[(String, String, Vec<u32>)],
) -> anyhow::Result<Vec<(String, Vec<u32>)>> {
    let dir = bench_dir().join("llama-cpp/tokenize");
    std::fs::create_dir_all(&dir)?;
    texts
        .iter()
        .map(|(name, text, _)| {
            let file = dir.join(format!("{name}.txt"));
            std::fs::write(&file, text)?;
            let o = Command::new(bin.join("llama-tokenize"))
                .arg("-m")
                .arg(gguf)
                .arg("-f")
                .arg(&file)
                .args(["--no-escape", "--ids", "--log-disable"])
                .output()?;
            let out = String::from_utf8_lossy(&o.stdout);
            let line = out.lines().rev().find(|l| l.starts_with('[')).unwrap_or("");
            let got: Vec<u32> = serde_json::from_str(line).unwrap_or_default();
            Ok((name.clone(), got))
        })
        .collect()
}

/// The committed llama.cpp ids of the tokenizer texts (`fixtures/tokenizer`,
/// which the suite checks gkq's tokenizer against) are llama-tokenize's:
/// the two real models on both text sets, and the variants of SmolLM2's
/// metadata (a metadata-only GGUF each, as `fixtures::tokenizer_variant`
/// edits it). `GKQ_WRITE_TOKENIZER_IDS=1` writes them instead.
fn tokenizer(bin: &Path) -> anyhow::Result<()> {
    let write = std::env::var_os("GKQ_WRITE_TOKENIZER_IDS").is_some();
    let dir = bench_dir().join("llama-cpp/tokenize");
    std::fs::create_dir_all(&dir)?;
    let variants = ["smollm2", "gemma3", "qwen05"]
        .into_iter()
        .chain(fixtures::TOKENIZER_VARIANTS.iter().copied());
    for variant in variants {
        let model = fixtures::tokenizer_model(variant);
        let gguf = if fixtures::TOKENIZER_VARIANTS.contains(&variant) {
            let bytes = std::fs::read(&model)?;
            let mut g = gkq_format::gguf::Gguf::parse(&bytes)?;
            fixtures::tokenizer_variant(variant, &mut g.kv);
            let kv = gkq_format::gguf::encode_kv(&g.kv);
            let meta = gkq_format::gguf::write_gguf(
                g.version,
                (g.kv.len() as u64, &kv),
                &[],
                g.alignment,
            )?;
            let path = dir.join(format!("{variant}.gguf"));
            std::fs::write(&path, meta)?;
            path
        } else {
            model
        };
        for set in ["texts", "edge"] {
            let texts = if write {
                let t = std::fs::read_to_string(
                    root().join(format!("fixtures/tokenizer/{set}.jsonl")),
                )?;
                t.lines()
                    .map(|l| {
                        let v: Value = serde_json::from_str(l)?;
                        let (n, t) = (v["name"].as_str(), v["text"].as_str());
                        Ok((
                            n.unwrap_or("").to_owned(),
                            t.unwrap_or("").to_owned(),
                            Vec::new(),
                        ))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?
            } else {
                fixtures::tokenizer_set_cases(set, variant)
            };
            let got = llama_tokenize(bin, &gguf, &texts)?;
            if write {
                let name = match set {
                    "texts" => format!("llama-cpp-{variant}.json"),
                    _ => format!("llama-cpp-{variant}-{set}.json"),
                };
                let v: Vec<Value> = got
                    .iter()
                    .map(|(n, ids)| json!({"name": n, "ids": ids}))
                    .collect();
                std::fs::write(
                    root().join("fixtures/tokenizer").join(&name),
                    serde_json::to_string(&v)? + "\n",
                )?;
                println!("tokenizer: wrote fixtures/tokenizer/{name}");
                continue;
            }
            for ((name, _, want), (_, got)) in texts.iter().zip(&got) {
                if got != want {
                    bail!(
                        "{variant} {set} {name}: llama-tokenize gives {got:?}, fixtures/tokenizer holds {want:?}"
                    );
                }
            }
            println!(
                "tokenizer: {variant}, {set}: llama-tokenize gives the committed ids on all {} texts",
                texts.len()
            );
        }
    }
    Ok(())
}

/// The committed `llama-cli --help` (the list gkq-decode's flags test
/// walks) against this build's: a stale copy fails, saying how to renew it.
fn cli_help(bin: &Path) -> anyhow::Result<()> {
    let committed = root().join("crates/gkq-decode/tests/data/llama-cli-help.txt");
    let o = Command::new(bin.join("llama-cli")).arg("--help").output()?;
    let built = [o.stdout, o.stderr].concat();
    if std::fs::read(&committed)? != built {
        bail!(
            "{} is not this build's llama-cli --help: write it again ({}/llama-cli --help > FILE 2>&1) and answer its new flags in gkq-decode's run/flags.rs",
            committed.display(),
            bin.display()
        );
    }
    println!("flags: llama-cli --help is the committed one (gkq-decode's flags test walks it)");
    Ok(())
}

pub(crate) fn run() -> anyhow::Result<()> {
    let (bin, driver) = llama_cpp()?;
    let parts = std::env::var("GKQ_LLAMA_BENCH").unwrap_or_default();
    let part = |p: &str| parts.is_empty() || parts.split(',').any(|x| x == p);
    // `cold-only`: the real models' cold comparison without the rest
    let which = Parts {
        warm: !parts.split(',').any(|x| x == "cold-only"),
    };
    if part("flags") {
        cli_help(&bin)?;
    }
    if part("tokenizer") {
        tokenizer(&bin)?;
    }
    if part("smollm2") {
        real_model(
            "SmolLM2-135M-Instruct Q4_1",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            &driver,
            which,
        )?;
    }
    if part("gemma3") {
        real_model(
            "Gemma 3 270M Q4_K_M",
            "gemma-3-270m-q4_k_m.gguf",
            &driver,
            which,
        )?;
    }
    if part("qwen05") {
        real_model(
            "Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            &driver,
            which,
        )?;
    }
    if part("qwen15") {
        real_model(
            "Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            &driver,
            which,
        )?;
    }
    if part("preset") {
        preset(&bin, &driver)?;
    }
    Ok(())
}
