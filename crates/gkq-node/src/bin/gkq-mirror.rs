//! `gkq-mirror URL DIR`: a verified copy of a published package.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use gkq_cli::NetArgs;
use gkq_reader::ReaderConfig;

/// Copy a published package (its knot's URL or path) into DIR, which any
/// HTTP server can then serve as a mirror; every object verified against
/// the knot, the knot against its id (and the publisher's signature with
/// --trust-key, or the pinned --knot-id).
#[derive(Parser, Debug)]
#[command(
    name = "gkq-mirror",
    version = gkq_cli::version_line(gkq_store::FEATURES),
    after_help = "\
Examples:
  gkq-mirror https://HOST/qwen/v1/model.knot /srv/mirror/qwen/v1 --trust-key publisher.pub.pem
  gkq-mirror https://HOST/qwen/v1/model.knot /srv/mirror/qwen/v1 --knot-id 2e1e52fc…

Every object is staged in DIR/.gkq-mirror and the staged package must pass gkq-verify's local checks before anything takes its name in DIR (row files first, the knot and its signature last): no name in DIR ever holds an unverified byte, and a directory without model.knot is unfinished. Run it again after an interruption: what is staged and checks out is kept. A DIR that holds another package is refused unless --replace.

Output: one line per object on stderr (--json: one JSON object on stdout).

Exit status: 0 mirrored; 1 error; 2 usage error."
)]
struct Args {
    /// The knot: an http(s):// or s3:// URL, or a path.
    knot: String,
    /// The directory to write the package into.
    dir: PathBuf,
    /// Replace DIR whole when it holds another package (another knot, or files this knot does not name); without it such a directory is refused.
    #[arg(long)]
    replace: bool,
    /// Print one JSON object on stdout.
    #[arg(short, long)]
    json: bool,
    #[command(flatten)]
    net: NetArgs,
}

fn run(a: &Args) -> anyhow::Result<()> {
    let mut config = ReaderConfig::try_from(a.net.clone()).map_err(anyhow::Error::msg)?;
    if a.json {
        config.progress = None;
    }
    let opts = gkq_mirror::MirrorOptions { replace: a.replace };
    let r = gkq_mirror::mirror(&a.knot, &a.dir, config, opts).with_context(|| {
        format!(
            "cannot mirror {} into {}",
            gkq_store::url::redact(&a.knot),
            a.dir.display()
        )
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        for o in &r.objects {
            eprintln!("{}\t{}\t{} bytes", o.status, o.name, o.bytes);
        }
        eprintln!(
            "mirrored knot {} into {} ({}; {} bytes fetched)",
            r.knot_id,
            a.dir.display(),
            r.trusted,
            r.fetched_bytes
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    gkq_cli::init_logging();
    gkq_cli::exit("gkq-mirror", run(&gkq_cli::parse::<Args>("gkq-mirror")))
}
