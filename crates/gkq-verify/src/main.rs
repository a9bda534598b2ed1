//! `gkq-verify`: flags in, checks out (the output and the exit status are
//! EXAMPLES' last lines).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use gkq_verify::{VerifyOptions, VerifyReport};

const EXAMPLES: &str = "\
Examples:
  gkq-verify out/                                   the package alone (knot, rows, proofs, companions)
  gkq-verify out/ --source ./Qwen2.5-0.5B           and every tensor against the source model
  gkq-verify out/ --url https://models.example/qwen/v1 --timeout 5
                                                    and the published objects over HTTP(S)
  gkq-verify out/ --trust-key publisher.pub.pem     and its signature (model.sig), file by file
  gkq-verify https://models.example/qwen/v1/model.knot --trust-key publisher.pub.pem
                                                    a published package in place, with no local copy

Output: one tab-separated line per check, CHECK<TAB>PASS|FAIL|NOTE<TAB>detail (a check's first 8 NOTE lines, all with --verbose), then result<TAB>PASS|FAIL; --json prints one object.

Exit status: 0 every check passed (NOTE lines are information, such as a lossy cast); 1 a check failed; 2 the checks could not run.";

/// Verify a packed GKQ model before release: the knot, every row file and
/// proof object, the companion files; with --source every tensor against
/// the source model; with --url the published objects.
#[derive(Parser, Debug)]
#[command(
    name = "gkq-verify",
    version = gkq_cli::version_line(&[]),
    after_help = EXAMPLES
)]
struct Args {
    /// A gkq-pack output directory, the knot file, or the http(s) URL of a published package (https://…/v1/model.knot or https://…/v1/): every object it names is fetched into a temporary directory, checked there, and the published objects checked as --url checks them.
    target: PathBuf,
    /// The original the package was packed from, a Hugging Face model directory or a GGUF (.gguf file or directory of shards): check every tensor against it.
    #[arg(short, long, value_name = "MODEL_DIR")]
    source: Option<PathBuf>,
    /// Base URL of the published objects: check Content-Length, Range
    /// behaviour and sampled rows.
    #[arg(short, long, value_name = "BASE_URL", help_heading = "Remote (--url)")]
    url: Option<String>,
    /// Random rows fetched per row file with --url (besides the first and last).
    #[arg(
        long,
        default_value_t = gkq_verify::DEFAULT_SAMPLE_ROWS,
        value_name = "N",
        help_heading = "Remote (--url)"
    )]
    sample_rows: u64,
    /// Seed of the sampled rows.
    #[arg(long, default_value_t = gkq_verify::DEFAULT_SEED, help_heading = "Remote (--url)")]
    seed: u64,
    /// A PEM file of CA certificates to trust for --url besides the system
    /// store (repeatable; SSL_CERT_FILE replaces the system store).
    #[arg(long = "ca-cert", value_name = "FILE", help_heading = "Remote (--url)")]
    ca_certs: Vec<PathBuf>,
    /// Seconds to connect, and the floor of each request's deadline (a
    /// request for N bytes must finish within TIMEOUT + N / --min-throughput).
    #[arg(
        long,
        default_value_t = gkq_store::DEFAULT_TIMEOUT.as_secs_f64(),
        value_name = "SECONDS",
        help_heading = "Remote (--url)"
    )]
    timeout: f64,
    /// Bytes per second a response must keep up: a server that stalls or
    /// drips slower is cut off (0: only the timeout).
    #[arg(
        long = "min-throughput",
        value_name = "BYTES_PER_S",
        default_value_t = gkq_store::DEFAULT_MIN_THROUGHPUT,
        help_heading = "Remote (--url)"
    )]
    min_throughput: u64,
    /// Check the package's model.sig (and, with --url, the published one) against this ECDSA P-256 public key (PEM; repeatable: any one of them). Accepts signatures made by gkq-sign and by `model_signing sign key`.
    #[arg(long = "trust-key", value_name = "PUB.pem", help_heading = "Signature")]
    trust_keys: Vec<PathBuf>,
    /// The package asked for (MODEL/VERSION, as gkq-sign --name signed it): a signature naming another package fails [default: the path the package is published under (the URL's, or --url's), else its directory, which must end with the signed name].
    #[arg(long = "package", value_name = "NAME", value_parser = parse_package, help_heading = "Signature")]
    package: Option<String>,
    /// Print one JSON object.
    #[arg(long, help_heading = "Output")]
    json: bool,
    /// Print only failures (and no progress bar).
    #[arg(short, long, help_heading = "Output")]
    quiet: bool,
    /// Every NOTE line (a check shows its first 8 and counts the rest).
    #[arg(short, long, help_heading = "Output", conflicts_with = "quiet")]
    verbose: bool,
}

/// NOTE lines a check shows without --verbose.
const NOTES_SHOWN: usize = 8;

/// `--package`: a package name as FORMAT.md 7c spells one.
fn parse_package(s: &str) -> Result<String, String> {
    gkq_format::sig::check_package_name(s).map(|()| s.to_owned())
}

fn print_lines(
    out: &mut impl Write,
    r: &VerifyReport,
    (quiet, verbose): (bool, bool),
) -> std::io::Result<()> {
    for c in &r.checks {
        if !quiet || !c.passed {
            writeln!(
                out,
                "{}\t{}\t{} ({} bytes, {:.3}s)",
                c.name,
                if c.passed { "PASS" } else { "FAIL" },
                c.summary,
                c.bytes,
                c.seconds
            )?;
        }
        for f in &c.failures {
            writeln!(out, "{}\tFAIL\t{}: {}", c.name, f.object, f.message)?;
        }
        let shown = if verbose { c.notes.len() } else { NOTES_SHOWN };
        for n in c.notes.iter().take(shown).filter(|_| !quiet) {
            writeln!(out, "{}\tNOTE\t{}: {}", c.name, n.object, n.message)?;
        }
        if !quiet && c.notes.len() > shown {
            let more = c.notes.len() - shown;
            writeln!(
                out,
                "{}\tNOTE\t{more} more notes (--verbose lists them)",
                c.name
            )?;
        }
    }
    if !quiet || !r.passed {
        writeln!(
            out,
            "result\t{}\t{} bytes checked in {:.3}s",
            if r.passed { "PASS" } else { "FAIL" },
            r.bytes,
            r.seconds
        )?;
    }
    out.flush()
}

/// Writes the report; a reader that went away (`| head -1`) is not an error.
fn emit(report: &VerifyReport, json: bool, detail: (bool, bool)) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    let written = if json {
        let s = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
        writeln!(out, "{s}").and_then(|()| out.flush())
    } else {
        print_lines(&mut out, report, detail)
    };
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.to_string()),
        _ => Ok(()),
    }
}

fn main() -> ExitCode {
    let args = gkq_cli::parse::<Args>("gkq-verify");
    if !(args.timeout > 0.0 && args.timeout.is_finite()) {
        let e = std::io::Error::other("--timeout must be a positive number of seconds");
        return gkq_cli::fail("gkq-verify", 2, &e);
    }
    let opts = VerifyOptions {
        target: args.target,
        source: args.source,
        url: args.url,
        sample_rows: args.sample_rows,
        seed: args.seed,
        timeout: Duration::from_secs_f64(args.timeout),
        min_throughput: args.min_throughput,
        ca_certs: args.ca_certs,
        trust_keys: args.trust_keys,
        package: args.package,
    };
    let bar = gkq_cli::Bar::new("verify ", !args.json && !args.quiet);
    let result = gkq_verify::verify_with(&opts, &bar);
    bar.finish();
    match result {
        Ok(report) => {
            if let Err(e) = emit(&report, args.json, (args.quiet, args.verbose)) {
                eprintln!("gkq-verify: error: writing the report: {e}");
                return ExitCode::from(2);
            }
            if report.passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => gkq_cli::fail("gkq-verify", 2, &e),
    }
}
