//! `gkq-decode`: greedy decoding of a knot through gkq-reader.

use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use gkq_decode::{DecodeError, Generation, Stage, StageRoles, generate, tokenize};
use gkq_reader::{NodeArgs, ReaderConfig};

const EXAMPLES: &str = "Examples:
  # the whole model, embedding rows verified from the package's narrowest exact row file
  gkq-decode https://HOST/qwen2.5-0.5b/v1/model.knot --columnar-embed https://HOST/qwen2.5-0.5b/v1/ \\
      --prompt-ids 9707,11,1879 --max-new-tokens 8

  # a text prompt, tokenized with the package's tokenizer.json; one JSON object on stdout
  gkq-decode out/qwen2-tiny --prompt 'hello world' --json

  # a two-node pipeline in one process: bytes per node in the report
  gkq-decode https://HOST/m/v1/model.knot --columnar-embed https://HOST/m/v1/ --prompt-ids 1,2,3 --split 12

Output: the report goes to stdout (text, or one JSON object with --json);
warnings (a dense fallback, retries) go to stderr. Time to first token is
measured from the moment the reader opens the knot: the load it waits for
is part of it. The blocks load in the background in first-use order, and
the first layer runs as soon as its blocks are verified.

Exit status: 0 done; 1 error (bad input, a knot or row that fails its check,
a network failure); 2 usage error (flags, or a request the model cannot hold).";

/// Greedy decoding of a Qwen2, Llama or Mistral knot (local path or URL):
/// the token embedding from the row store (each row verified), lm_head
/// resident, every other block from the knot, in f32. The model's
/// hyper-parameters come from the package's config.json, pinned by the knot.
#[derive(Parser, Debug)]
#[command(
    name = "gkq-decode",
    version = version(),
    override_usage = "gkq-decode <KNOT> (--prompt-ids <IDS> | --prompt <TEXT>) [OPTIONS]\n       gkq-decode <KNOT> --roles output --hidden-in <FILE> [OPTIONS]",
    after_long_help = EXAMPLES,
    after_help = "Run with --help for examples, where the output goes, and the exit codes."
)]
struct Args {
    /// The knot: a path, a package directory, or an http(s):// or s3:// URL (…/model.knot).
    knot: String,
    /// The prompt as token ids, separated by commas or spaces.
    #[arg(
        long = "prompt-ids",
        short = 'i',
        value_name = "IDS",
        value_parser = parse_ids,
        required_unless_present_any = ["prompt", "hidden_in"],
        conflicts_with = "prompt"
    )]
    prompt_ids: Option<Ids>,
    /// The prompt as text, tokenized with --tokenizer (default: the package's tokenizer.json).
    #[arg(long, short = 'p', value_name = "TEXT")]
    prompt: Option<String>,
    /// A tokenizer.json file.
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// Tokens to generate (prompt and new tokens must fit the model's max_position_embeddings).
    #[arg(
        long = "max-new-tokens",
        short = 'n',
        value_name = "N",
        default_value_t = 16
    )]
    max_new_tokens: usize,
    /// The roles of this stage: the whole model, or one stage of a pipeline
    /// (input: embedding and the first layers, writes --hidden-out; output:
    /// the last layers and lm_head, reads --hidden-in and prints the next token).
    #[arg(long, value_enum, default_value = "all", help_heading = "Pipeline")]
    roles: RolesArg,
    /// The layers this stage runs, A..B (default: all).
    #[arg(long, value_name = "A..B", value_parser = parse_range, help_heading = "Pipeline")]
    layers: Option<Range<usize>>,
    /// Run as a two-node pipeline in this process: an input node (embedding
    /// and layers 0..L) and an output node (layers L.. and lm_head), each
    /// with its own reader and connections; the report gives each node's bytes.
    #[arg(long, value_name = "L", conflicts_with_all = ["layers", "hidden_in", "hidden_out"], help_heading = "Pipeline")]
    split: Option<usize>,
    /// Input stage: where to write the hidden states (f32 little-endian, [tokens, hidden]).
    #[arg(long = "hidden-out", value_name = "FILE", help_heading = "Pipeline")]
    hidden_out: Option<PathBuf>,
    /// Output stage: the hidden states an input stage wrote.
    #[arg(long = "hidden-in", value_name = "FILE", help_heading = "Pipeline")]
    hidden_in: Option<PathBuf>,
    /// One JSON object on stdout instead of text.
    #[arg(long, short = 'j')]
    json: bool,
    /// Write the first step's logits (after the prompt; f32 little-endian,
    /// one per vocabulary entry) to FILE, to compare two packages' outputs.
    #[arg(long = "logits-out", value_name = "FILE")]
    logits_out: Option<PathBuf>,
    #[command(flatten)]
    node: NodeArgs,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RolesArg {
    All,
    Input,
    Output,
}

#[derive(Clone, Debug)]
struct Ids(Vec<u32>);

fn parse_ids(s: &str) -> Result<Ids, String> {
    let ids: Result<Vec<u32>, String> = s
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .map_err(|_| format!("{t:?} is not a token id"))
        })
        .collect();
    match ids? {
        v if v.is_empty() => Err("no token ids".into()),
        v => Ok(Ids(v)),
    }
}

fn parse_range(s: &str) -> Result<Range<usize>, String> {
    let bad = || format!("{s:?} is not A..B");
    let (a, b) = s.split_once("..").ok_or_else(bad)?;
    Ok(a.trim().parse().map_err(|_| bad())?..b.trim().parse().map_err(|_| bad())?)
}

fn prompt(a: &Args, stage: &Stage) -> anyhow::Result<Vec<u32>> {
    if let Some(text) = &a.prompt {
        let json = match &a.tokenizer {
            Some(p) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
            None => stage
                .reader()
                .package_file("tokenizer.json")
                .context("no --tokenizer given, and the package's tokenizer.json")?
                .to_vec(),
        };
        let vocab = stage.reader().embedding()?.vocab();
        return Ok(tokenize(&json, vocab, text)?);
    }
    match &a.prompt_ids {
        Some(ids) => Ok(ids.0.clone()),
        None => bail!("give the prompt: --prompt-ids 1,2,3 or --prompt TEXT"),
    }
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

fn bytes_line(b: gkq_decode::RoleBytes) -> String {
    format!(
        "knot header {}, embedding rows {}, lm_head {}, other blocks {}",
        b.knot_header, b.embedding_rows, b.lm_head, b.other_blocks
    )
}

fn split(a: &Args, config: ReaderConfig, l: usize) -> anyhow::Result<()> {
    let beyond = |layers: usize| {
        DecodeError::Usage(format!(
            "--split {l}: the model has {layers} layers; split at 1 to {}",
            layers.saturating_sub(1)
        ))
    };
    let input = match Stage::open(&a.knot, config.clone(), StageRoles::Input, Some(0..l)) {
        Err(DecodeError::Layers { layers, .. }) => return Err(beyond(layers).into()),
        other => other?,
    };
    let layers = input.config().layers;
    if l == 0 || l >= layers {
        return Err(beyond(layers).into());
    }
    let output = Stage::open(&a.knot, config, StageRoles::Output, Some(l..layers))?;
    let ids = prompt(a, &input)?;
    let mut chain = [input, output];
    report(a, generate(&mut chain, &ids, a.max_new_tokens)?)
}

fn input_stage(a: &Args, mut stage: Stage) -> anyhow::Result<()> {
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
    let text = format!(
        "wrote {} x {} hidden states to {}; bytes: {}",
        ids.len(),
        stage.config().hidden,
        path.display(),
        bytes_line(b)
    );
    emit(a, j, text)
}

fn output_stage(a: &Args, mut stage: Stage) -> anyhow::Result<()> {
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
    let x = candle_core::Tensor::from_vec(v, (raw.len() / (4 * h), h), &candle_core::Device::Cpu)?;
    let x = stage.forward(&x)?;
    let logits = stage.logits(&x)?;
    let next = logits.argmax(0)?.to_scalar::<u32>()?;
    let b = stage.bytes();
    let j = serde_json::json!({
        "tokens": [next], "bytes": b, "resolutions": stage.resolutions()?,
    });
    emit(a, j, format!("next token {next}; bytes: {}", bytes_line(b)))
}

fn run(a: &Args) -> anyhow::Result<()> {
    let config = ReaderConfig::try_from(a.node.clone()).map_err(DecodeError::Usage)?;
    let roles = match a.roles {
        RolesArg::All => StageRoles::All,
        RolesArg::Input => StageRoles::Input,
        RolesArg::Output => StageRoles::Output,
    };
    if let Some(l) = a.split {
        if !matches!(roles, StageRoles::All) {
            return Err(DecodeError::Usage(
                "--split makes both stages: use it with --roles all".into(),
            )
            .into());
        }
        return split(a, config, l);
    }
    let mut stage = Stage::open(&a.knot, config, roles, a.layers.clone())?;
    match roles {
        StageRoles::All => {
            let ids = prompt(a, &stage)?;
            let g = generate(std::slice::from_mut(&mut stage), &ids, a.max_new_tokens)?;
            report(a, g)
        }
        StageRoles::Input => input_stage(a, stage),
        StageRoles::Output => output_stage(a, stage),
    }
}

/// The `--version` line: the version and this build's features.
fn version() -> &'static str {
    gkq_cli::version_line(gkq_store::FEATURES)
}

/// When this process started (for the time to first token from process start).
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

fn report(a: &Args, g: Generation) -> anyhow::Result<()> {
    let started = *STARTED.get_or_init(std::time::Instant::now);
    let from_start =
        g.time_to_first_token_ms + g.opened.saturating_duration_since(started).as_secs_f64() * 1e3;
    let mut text = format!(
        "tokens {:?}\ntime to first token {from_start:.1} ms from process start, {:.1} ms from open (load {:.1} ms, prefill {:.1} ms), {:.2} tokens/s\nbytes: {} (total {})",
        g.tokens,
        g.time_to_first_token_ms,
        g.load_ms,
        g.prefill_ms,
        g.tokens_per_second,
        bytes_line(g.bytes),
        g.bytes.total()
    );
    if g.stage_bytes.len() > 1 {
        for (i, b) in g.stage_bytes.iter().enumerate() {
            let node = if i == 0 { "input" } else { "output" };
            text.push_str(&format!(
                "\n{node} node: {} (total {})",
                bytes_line(*b),
                b.total()
            ));
        }
    }
    for r in &g.resolutions {
        text.push_str(&format!("\n{}: {}: {}", r.role, r.path, r.reason));
    }
    if let Some(w) = &g.warm {
        text.push_str(&match &w.unused {
            None => format!(
                "\nwarm: {} of {} warm rows seeded in {} requests, {} bytes",
                w.seeded, w.listed, w.requests, w.bytes
            ),
            Some(why) => format!("\nwarm: the warm object is not used: {why}"),
        });
    }
    for (i, d) in g.logits_sha256.iter().enumerate() {
        text.push_str(&format!("\nstep {i} logits sha256 {d}"));
    }
    if let Some(path) = &a.logits_out {
        let bytes: Vec<u8> = g
            .first_logits
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    let mut v = serde_json::to_value(&g)?;
    v["time_to_first_token_from_start_ms"] = serde_json::json!(from_start);
    v["peak_rss_bytes"] = serde_json::json!(gkq_cli::peak_rss_bytes());
    emit(a, v, text)
}

fn main() -> ExitCode {
    STARTED.get_or_init(std::time::Instant::now);
    gkq_cli::init_logging();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if matches!(e.downcast_ref::<DecodeError>(), Some(DecodeError::Usage(_))) => {
            eprintln!("gkq-decode: usage: {e:#}");
            ExitCode::from(2)
        }
        Err(e) => gkq_cli::exit("gkq-decode", Err(e)),
    }
}
