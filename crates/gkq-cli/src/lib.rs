//! What the gkq binaries share around `main` (the libraries print nothing;
//! this is where printing is decided): the progress bar on a terminal, the
//! `--version` line with the build's features, the subscriber that shows
//! the libraries' `tracing` events, and the exit on error.

mod failure;
#[cfg(feature = "node")]
mod node;

use std::io::IsTerminal;
use std::process::ExitCode;

use gkq_format::progress::Progress;
use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar on stderr, or nothing (see [`Bar::new`]).
#[derive(Debug)]
pub struct Bar(ProgressBar);

impl Bar {
    /// A bar labelled `label` when `shown` and stderr is a terminal; a
    /// hidden one otherwise (`--json`, `--quiet`, a pipe).
    pub fn new(label: &str, shown: bool) -> Bar {
        if !shown || !std::io::stderr().is_terminal() {
            return Bar(ProgressBar::hidden());
        }
        let b = ProgressBar::new(0);
        let template =
            format!("{label}{{bar:40}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}} eta {{eta}}");
        if let Ok(style) = ProgressStyle::with_template(&template) {
            b.set_style(style);
        }
        Bar(b)
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.0.finish_and_clear();
    }
}

impl Progress for Bar {
    /// A new phase (a copy, then its checks): the bar starts again.
    fn start(&self, total: u64) {
        self.0.reset();
        self.0.set_length(total);
    }
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
        // a pull's bar goes once its last byte is verified
        if self.0.length().is_some_and(|n| self.0.position() >= n) {
            self.0.finish_and_clear();
        }
    }
}

/// `0.1.0 (features: s3)`: the version and the optional features this
/// build has (`none` when it has none of them), for `--version`.
pub fn version(features: &[&str]) -> String {
    format!(
        "{} (features: {})",
        env!("CARGO_PKG_VERSION"),
        if features.is_empty() {
            "none".to_owned()
        } else {
            features.join(", ")
        }
    )
}

/// [`version`] for clap's `#[command(version = ...)]`, computed once: the
/// features of one binary never change while it runs.
pub fn version_line(features: &[&str]) -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| version(features))
}

/// Sends the libraries' `tracing` events to stderr: warnings by default
/// (a dense fallback, retries, cache entries that failed verification),
/// more with `GKQ_LOG=info` or `GKQ_LOG=debug`.
pub fn init_logging() {
    let level = std::env::var("GKQ_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing_subscriber::filter::LevelFilter>().ok())
        .unwrap_or(tracing_subscriber::filter::LevelFilter::WARN);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// The reader of stdout went away (`| head`): not a failure.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes `line` and a newline to stdout; a closed stdout is
/// [`StdoutClosed`], which [`exit`] takes for success (a broken pipe of a
/// network connection is an error like any other).
pub fn print_line(line: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    use std::io::Write as _;
    match writeln!(std::io::stdout().lock(), "{line}") {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        r => Ok(r?),
    }
}

/// Exit 0 on success and when the reader of stdout went away
/// ([`StdoutClosed`]); otherwise print the error chain on one line as
/// `NAME: error: …` and exit 1. Never silent: an error whose chain says
/// nothing is printed by its debug form.
pub fn exit(name: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<StdoutClosed>().is_some() => ExitCode::SUCCESS,
        Err(e) => fail(name, 1, e.as_ref()),
    }
}

pub use failure::{json_asked, json_failure};
#[cfg(feature = "node")]
pub use node::{NetArgs, NodeArgs, parse_bytes};

/// Reports `error` of tool `name` on stderr (one JSON object when the
/// command line has `--json`, else `NAME: error: …`) and returns `code`.
pub fn fail(name: &str, code: u8, error: &(dyn std::error::Error + 'static)) -> ExitCode {
    if json_asked() {
        eprintln!("{}", json_failure(name, None, error));
    } else {
        let mut text = gkq_format::error_chain(error);
        if text.trim().is_empty() {
            text = format!("{error:?}");
        }
        eprintln!("{name}: error: {text}");
    }
    ExitCode::from(code)
}

/// Parses the command line as clap does, except that with `--json` a usage
/// error is one JSON object on stderr (`kind` `usage`), exit 2 as always.
pub fn parse<A: clap::Parser>(name: &str) -> A {
    match A::try_parse() {
        Ok(a) => a,
        Err(e) if json_asked() && e.use_stderr() => {
            let text = e.render().to_string();
            let msg = text
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ")
                .to_owned();
            let io = std::io::Error::other(msg);
            eprintln!("{}", json_failure(name, Some("usage"), &io));
            std::process::exit(2)
        }
        Err(e) => e.exit(),
    }
}

/// The number after `key` in this process's `/proc/self/status`.
fn status_field(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Peak resident set size of this process (Linux `VmHWM`), when known.
pub fn peak_rss_bytes() -> Option<u64> {
    Some(status_field("VmHWM:")? * 1024)
}

/// The threads this process runs now (Linux `Threads`), when known.
pub fn thread_count() -> Option<u64> {
    status_field("Threads:")
}
