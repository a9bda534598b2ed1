//! `gkq-decode`: greedy decoding of a knot through gkq-reader.

use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use gkq_decode::{Stage, StageRoles, generate, tokenize};
use gkq_reader::{EmbedArgs, ReaderConfig};

/// Greedy decoding of a Qwen2, Llama or Mistral knot (local path or URL):
/// the token embedding from the row store (each row verified), lm_head
/// resident, every other block from the knot, in f32. The model's
/// hyper-parameters come from the package's config.json, pinned by the knot.
///
/// Exit codes: 0 done; 1 error (bad input, a knot or row that fails its
/// check, a network failure).
#[derive(Parser, Debug)]
#[command(name = "gkq-decode", version)]
struct Args {
    /// The knot: a path or an http(s) URL (…/model.knot).
    knot: String,
    #[command(flatten)]
    embed: EmbedArgs,
    /// The prompt as token ids, comma-separated.
    #[arg(
        long = "prompt-ids",
        value_name = "IDS",
        value_delimiter = ',',
        conflicts_with = "prompt"
    )]
    prompt_ids: Vec<u32>,
    /// The prompt as text, tokenized with --tokenizer (default: the package's tokenizer.json).
    #[arg(long)]
    prompt: Option<String>,
    /// A tokenizer.json file.
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// Tokens to generate.
    #[arg(long = "max-new-tokens", value_name = "N", default_value_t = 16)]
    max_new_tokens: usize,
    /// The roles of this stage: the whole model, or one stage of a pipeline
    /// (input: embedding and the first layers, writes --hidden-out; output:
    /// the last layers and lm_head, reads --hidden-in and prints the next token).
    #[arg(long, value_enum, default_value = "all")]
    roles: RolesArg,
    /// The layers this stage runs, A..B (default: all).
    #[arg(long, value_name = "A..B", value_parser = parse_range)]
    layers: Option<Range<usize>>,
    /// Run as a two-node pipeline in this process: an input node (embedding
    /// and layers 0..L) and an output node (layers L.. and lm_head), each
    /// with its own reader and connections; the report gives each node's bytes.
    #[arg(long, value_name = "L", conflicts_with_all = ["layers", "hidden_in", "hidden_out"])]
    split: Option<usize>,
    /// Input stage: where to write the hidden states (f32 little-endian, [tokens, hidden]).
    #[arg(long = "hidden-out", value_name = "FILE")]
    hidden_out: Option<PathBuf>,
    /// Output stage: the hidden states an input stage wrote.
    #[arg(long = "hidden-in", value_name = "FILE")]
    hidden_in: Option<PathBuf>,
    /// One JSON object on stdout instead of text on stderr.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RolesArg {
    All,
    Input,
    Output,
}

fn parse_range(s: &str) -> Result<Range<usize>, String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("{s:?} is not A..B"))?;
    let a = a.parse().map_err(|_| format!("{s:?} is not A..B"))?;
    let b = b.parse().map_err(|_| format!("{s:?} is not A..B"))?;
    Ok(a..b)
}

fn prompt(a: &Args, stage: &Stage) -> anyhow::Result<Vec<u32>> {
    if let Some(text) = &a.prompt {
        let json = match &a.tokenizer {
            Some(p) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
            None => stage
                .reader()
                .package_file("tokenizer.json")
                .context("no --tokenizer given, and the package's tokenizer.json")?,
        };
        return Ok(tokenize(&json, text)?);
    }
    if a.prompt_ids.is_empty() {
        bail!("give the prompt: --prompt-ids 1,2,3 or --prompt TEXT");
    }
    Ok(a.prompt_ids.clone())
}

fn emit(a: &Args, v: serde_json::Value, text: String) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let r = if a.json {
        writeln!(out, "{v}")
    } else {
        writeln!(out, "{text}")
    };
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

fn run(a: &Args) -> anyhow::Result<()> {
    let config: ReaderConfig = a.embed.clone().into();
    let roles = match a.roles {
        RolesArg::All => StageRoles::All,
        RolesArg::Input => StageRoles::Input,
        RolesArg::Output => StageRoles::Output,
    };
    if let Some(l) = a.split {
        if !matches!(roles, StageRoles::All) {
            bail!("--split makes both stages: use it with --roles all");
        }
        let input = Stage::open(&a.knot, config.clone(), StageRoles::Input, Some(0..l))?;
        let layers = input.config().layers;
        let output = Stage::open(&a.knot, config, StageRoles::Output, Some(l..layers))?;
        let ids = prompt(a, &input)?;
        let mut chain = [input, output];
        return report(a, generate(&mut chain, &ids, a.max_new_tokens)?);
    }
    let mut stage = Stage::open(&a.knot, config, roles, a.layers.clone())?;
    match roles {
        StageRoles::All => {
            let ids = prompt(a, &stage)?;
            let g = generate(std::slice::from_mut(&mut stage), &ids, a.max_new_tokens)?;
            report(a, g)
        }
        StageRoles::Input => {
            let ids = prompt(a, &stage)?;
            let Some(path) = &a.hidden_out else {
                bail!("--roles input writes hidden states: give --hidden-out FILE");
            };
            let x = stage.embed(&ids)?;
            let x = stage.forward(&x)?;
            let v: Vec<f32> = x.flatten_all()?.to_vec1()?;
            let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
            std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
            let b = stage.bytes();
            let j = serde_json::json!({
                "hidden_out": path, "tokens_in": ids.len(), "bytes": b,
                "resolutions": stage.resolutions()?,
            });
            emit(
                a,
                j,
                format!(
                    "wrote {} x {} hidden states to {}; bytes: knot header {}, embedding rows {}, lm_head {}, other blocks {}",
                    ids.len(),
                    stage.config().hidden,
                    path.display(),
                    b.knot_header,
                    b.embedding_rows,
                    b.lm_head,
                    b.other_blocks
                ),
            )
        }
        StageRoles::Output => {
            let Some(path) = &a.hidden_in else {
                bail!("--roles output reads hidden states: give --hidden-in FILE");
            };
            let raw = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let h = stage.config().hidden;
            if raw.len() % (4 * h) != 0 || raw.is_empty() {
                bail!(
                    "{}: {} bytes is not whole rows of {h} f32 values",
                    path.display(),
                    raw.len()
                );
            }
            let v: Vec<f32> = raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let x = candle_core::Tensor::from_vec(
                v,
                (raw.len() / (4 * h), h),
                &candle_core::Device::Cpu,
            )?;
            let x = stage.forward(&x)?;
            let logits = stage.logits(&x)?;
            let next = logits.argmax(0)?.to_scalar::<u32>()?;
            let b = stage.bytes();
            let j = serde_json::json!({
                "tokens": [next], "bytes": b, "resolutions": stage.resolutions()?,
            });
            emit(
                a,
                j,
                format!(
                    "next token {next}; bytes: knot header {}, embedding rows {}, lm_head {}, other blocks {}",
                    b.knot_header, b.embedding_rows, b.lm_head, b.other_blocks
                ),
            )
        }
    }
}

fn report(a: &Args, g: gkq_decode::Generation) -> anyhow::Result<()> {
    let mut text = format!(
        "tokens {:?}\ntime to first token {:.1} ms, {:.2} tokens/s\nbytes: knot header {}, embedding rows {}, lm_head {}, other blocks {} (total {})",
        g.tokens,
        g.time_to_first_token_ms,
        g.tokens_per_second,
        g.bytes.knot_header,
        g.bytes.embedding_rows,
        g.bytes.lm_head,
        g.bytes.other_blocks,
        g.bytes.total()
    );
    if g.stage_bytes.len() > 1 {
        for (i, b) in g.stage_bytes.iter().enumerate() {
            let node = if i == 0 { "input" } else { "output" };
            text.push_str(&format!(
                "\n{node} node: knot header {}, embedding rows {}, lm_head {}, other blocks {} (total {})",
                b.knot_header, b.embedding_rows, b.lm_head, b.other_blocks, b.total()
            ));
        }
    }
    for r in &g.resolutions {
        text.push_str(&format!("\n{}: {}: {}", r.role, r.path, r.reason));
    }
    for (i, d) in g.logits_sha256.iter().enumerate() {
        text.push_str(&format!("\nstep {i} logits sha256 {d}"));
    }
    emit(a, serde_json::to_value(&g)?, text)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gkq-decode: {e:#}");
            ExitCode::from(1)
        }
    }
}
