//! `gkq-pack`: flags in, report out. The work is in the library.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use gkq_format::DType;
use gkq_pack::{PackOptions, PackReport, Progress};
use indicatif::{ProgressBar, ProgressStyle};

/// Pack a Hugging Face model directory into a GKQ v2 knot and columnar row files.
#[derive(Parser, Debug)]
#[command(name = "gkq-pack", version)]
struct Args {
    /// Model directory: config.json plus model.safetensors or shards with model.safetensors.index.json.
    model_dir: PathBuf,
    /// Output directory (must not exist unless --force).
    #[arg(long)]
    out: PathBuf,
    /// Row file dtype, repeatable; the first is also the dtype of the embedding's dense block.
    #[arg(long = "dtype", value_parser = parse_dtype)]
    dtypes: Vec<DType>,
    /// Name of the token-embedding tensor (default: from config.json).
    #[arg(long)]
    embed_tensor: Option<String>,
    /// Name of the lm_head tensor (default: from config.json).
    #[arg(long)]
    lm_head_tensor: Option<String>,
    /// Replace the contents of an existing output directory.
    #[arg(long)]
    force: bool,
    /// Accept narrowing casts that turn finite values into infinities.
    #[arg(long)]
    allow_lossy: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// No human output and no progress bar.
    #[arg(long)]
    quiet: bool,
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    match s.parse::<DType>()? {
        d if d.is_castable_float() => Ok(d),
        d => Err(format!("{d} is not one of f32, f16, bf16")),
    }
}

struct Bar(ProgressBar);

impl Progress for Bar {
    fn start(&self, total: u64) {
        self.0.set_length(total);
    }
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
}

fn human(r: &PackReport) {
    eprintln!(
        "packed {} tensors ({} source bytes) in {:.2}s{}",
        r.tensors,
        r.source_bytes,
        r.seconds,
        if r.tied {
            ", lm_head tied to the embedding"
        } else {
            ""
        }
    );
    eprintln!(
        "  {}  {} bytes  sha256 {}",
        r.knot.path.display(),
        r.knot.bytes,
        r.knot.sha256
    );
    for c in &r.columnar {
        eprintln!(
            "  {}  {} rows x {} bytes ({} {})  sha256 {}",
            c.path.display(),
            c.rows,
            c.row_bytes,
            c.role,
            c.dtype,
            c.sha256
        );
    }
    for c in &r.casts {
        eprintln!(
            "  cast {} {} -> {}: max abs error {:e}",
            c.tensor, c.from, c.to, c.max_abs_error
        );
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let opts = PackOptions {
        model_dir: args.model_dir,
        out_dir: args.out,
        dtypes: if args.dtypes.is_empty() {
            vec![DType::F32]
        } else {
            args.dtypes
        },
        embed_tensor: args.embed_tensor,
        lm_head_tensor: args.lm_head_tensor,
        force: args.force,
        allow_lossy: args.allow_lossy,
    };
    let show_bar = !args.quiet && !args.json && std::io::stderr().is_terminal();
    let bar = if show_bar {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .context("progress template")?,
        );
        Bar(b)
    } else {
        Bar(ProgressBar::hidden())
    };
    let report = gkq_pack::pack(&opts, &bar)?;
    bar.0.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if !args.quiet {
        human(&report);
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gkq-pack: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
