//! `gkq-pack`: flags in (`cli.rs`), report out. The work is in the library.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
mod cli;

use cli::Args;

fn run(args: Args) -> anyhow::Result<()> {
    if args.analyze {
        let report = gkq_pack::analyze(&args.model_dir, &gkq_pack::NoProgress)?;
        let text = if args.json {
            serde_json::to_string_pretty(&report)? + "\n"
        } else {
            gkq_pack::analysis_text(&report)
        };
        let mut out = std::io::stdout().lock();
        return match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            // a closed pipe (`| head`) is not an error
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => Ok(other.context("writing the analysis to stdout")?),
        };
    }
    let out = args.out.clone().context("--out is required")?;
    let opts = args.options(out)?;
    let bar = gkq_cli::Bar::new("", !args.quiet && !args.json);
    let report = gkq_pack::pack(&opts, &bar)?;
    bar.finish();
    if args.json {
        let mut out = std::io::stdout().lock();
        let written = writeln!(out, "{}", serde_json::to_string_pretty(&report)?);
        match written.and_then(|()| out.flush()) {
            // a closed pipe (`| head`) is not an error: the package is written
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other.context("writing the report to stdout")?,
        }
    } else if !args.quiet {
        eprint!("{}", gkq_pack::text(&report));
    }
    Ok(())
}

fn main() -> ExitCode {
    gkq_cli::exit("gkq-pack", run(gkq_cli::parse::<Args>("gkq-pack")))
}
