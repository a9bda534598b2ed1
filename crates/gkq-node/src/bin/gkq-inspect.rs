//! `gkq-inspect`: flags in, [`gkq_node::tools::inspect`] does the work.

use std::process::ExitCode;

fn main() -> ExitCode {
    gkq_cli::init_logging();
    let started = std::time::Instant::now();
    gkq_cli::exit(
        "gkq-inspect",
        gkq_node::tools::inspect::run(
            &gkq_cli::parse::<gkq_node::tools::inspect::Args>("gkq-inspect"),
            started,
        ),
    )
}
