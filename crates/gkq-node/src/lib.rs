//! What the node tools (`gkq-rows`, `gkq-inspect`) and `gkq-decode` share
//! around `main`: the version line with the build's features, the
//! diagnostics subscriber, and the exit codes.

use std::process::ExitCode;

/// `gkq-rows 0.1.0 (features: s3)`: the line `--version` prints, naming the
/// features this build has (an `s3://` URL needs `s3`).
pub fn version() -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        let f = gkq_store::FEATURES;
        format!(
            "{} (features: {})",
            env!("CARGO_PKG_VERSION"),
            if f.is_empty() {
                "none; no s3:// URLs".to_owned()
            } else {
                f.join(", ")
            }
        )
    })
}

/// Sends the library's `tracing` events to stderr: warnings by default
/// (the dense fallback, retries, cache entries that failed verification),
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

/// Exit 0 on success and when the reader of stdout went away (`| head`);
/// otherwise print the error chain on one line as `NAME: error: …` and exit 1.
pub fn exit(name: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{name}: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
