//! `gkq-report PKG_OR_URL --texts FILE...`: what the package costs its
//! nodes on these texts.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use gkq_cli::NetArgs;
use gkq_node::report::{ReportOptions, markdown, report};
use gkq_reader::ReaderConfig;

/// The proposal's bandwidth report for your package and your text: per workload, the tokens, distinct ids and bytes a cold node fetches from each row file of the token embedding, against shipping the dense matrix; then many sessions on one node after a warm-up (the package's warm object, or the top ids of the texts). With --url, the sessions are also fetched and the wire measured.
#[derive(Parser, Debug)]
#[command(
    name = "gkq-report",
    version = gkq_cli::version_line(gkq_store::FEATURES),
    after_help = "\
Examples:
  gkq-report out/qwen/v1 --texts qa.txt chat.jsonl code.txt
  gkq-report https://HOST/qwen/v1/model.knot --texts chat.jsonl --url --json

A text file is one workload named by its stem, its whole text one session; a .jsonl file holds one session per line, {\"text\": …} or {\"messages\": [{\"role\", \"content\"}…]}. Tokenized with the package's tokenizer.json (or --tokenizer), padding off, special tokens as the tokenizer adds them.

Output: Markdown tables on stdout (--json: one JSON object).

Exit status: 0 reported; 1 error; 2 usage error."
)]
struct Args {
    /// The package: a directory, a knot, or its URL.
    package: String,
    /// Workload files (.txt: one session; .jsonl: one per line).
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    texts: Vec<PathBuf>,
    /// A tokenizer.json instead of the package's.
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// Sessions drawn from the mix for the amortisation (at most 10,000,000; computed one at a time).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=MAX_SESSIONS))]
    sessions: u64,
    /// The warm set when the package has no warm object: the top K ids of the texts (reported as warm_ids, which gkq-pack --warm-ids takes).
    #[arg(long = "warm-set", value_name = "K", default_value_t = 100)]
    warm: usize,
    /// Seed of the draw.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also measure on the wire, from the package URL: each workload's first session on a fresh node, and the drawn sessions after the warm-up.
    #[arg(long)]
    url: bool,
    /// One JSON object on stdout.
    #[arg(short, long)]
    json: bool,
    #[command(flatten)]
    net: NetArgs,
}

/// The most sessions a report draws: their time grows with them.
const MAX_SESSIONS: u64 = 10_000_000;

fn run(a: &Args) -> anyhow::Result<()> {
    let config = ReaderConfig::try_from(a.net.clone()).map_err(anyhow::Error::msg)?;
    let o = ReportOptions {
        texts: a.texts.clone(),
        tokenizer: a.tokenizer.clone(),
        sessions: usize::try_from(a.sessions)?,
        warm: a.warm,
        seed: a.seed,
        measure: a.url,
    };
    let r = report(&a.package, config, &o)
        .with_context(|| format!("cannot report on {}", gkq_store::url::redact(&a.package)))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", markdown(&r));
    }
    Ok(())
}

fn main() -> ExitCode {
    gkq_cli::init_logging();
    gkq_cli::exit("gkq-report", run(&gkq_cli::parse::<Args>("gkq-report")))
}
