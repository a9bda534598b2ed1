//! `gkq-export`: a knot, local or remote, written as a GGUF for llama.cpp.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use gkq_cli::NetArgs;
use gkq_reader::{Reader, ReaderConfig, Serve};

/// Write a knot (path, package directory or URL) as a GGUF file that
/// llama.cpp, ollama and LM Studio load; every byte verified on the way.
#[derive(Parser, Debug)]
#[command(
    name = "gkq-export",
    version = gkq_cli::version_line(gkq_store::FEATURES),
    after_help = "\
Examples:
  gkq-export --gguf model.gguf out/qwen                     a local package
  gkq-export --gguf model.gguf https://HOST/qwen/v1/model.knot --knot-id 2e1e52fc…
      a verified download into GGUF (the disk cache serves what it holds)

A knot packed from a GGUF gives back its metadata, tensor names, types and bytes (a canonically written GGUF comes back byte for byte; the split.* keys of shards are dropped). A knot packed from safetensors (llama, qwen2) gets llama.cpp's tensor names, Llama's q/k rows in llama.cpp's rotary layout and the hyper-parameters of its config.json; it has no GGUF tokenizer.

Output: the report on stderr (--json: one JSON object on stdout). The file is written beside OUT and renamed into place: on error nothing is left behind.

Exit status: 0 written; 1 error; 2 usage error."
)]
struct Args {
    /// The knot: a path, a package directory, or an http(s):// or s3:// URL.
    knot: String,
    /// The GGUF file to write.
    #[arg(long, value_name = "OUT.gguf")]
    gguf: PathBuf,
    /// Replace OUT.gguf if it exists.
    #[arg(short, long)]
    force: bool,
    /// Print one JSON object on stdout.
    #[arg(short, long)]
    json: bool,
    #[command(flatten)]
    net: NetArgs,
}

fn run(a: &Args) -> anyhow::Result<()> {
    if a.gguf.exists() && !a.force {
        anyhow::bail!(
            "{} already exists (pass --force to replace it)",
            a.gguf.display()
        );
    }
    let config = ReaderConfig::try_from(a.net.clone()).map_err(anyhow::Error::msg)?;
    let reader = Reader::open(&a.knot, config, Serve::NONE)
        .with_context(|| format!("cannot open {}", gkq_store::url::redact(&a.knot)))?;
    let r = gkq_node::export::export_gguf(&reader, &a.gguf).with_context(|| {
        format!(
            "cannot export {} to {}",
            gkq_store::url::redact(&a.knot),
            a.gguf.display()
        )
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        eprintln!(
            "wrote {} ({} bytes): {} tensors, {} metadata keys ({}), knot id {}",
            r.path.display(),
            r.bytes,
            r.tensors,
            r.metadata_keys,
            r.metadata_from,
            r.knot_id
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    gkq_cli::init_logging();
    gkq_cli::exit("gkq-export", run(&gkq_cli::parse::<Args>("gkq-export")))
}
