//! `gkq-inspect`: what a knot holds and how a node would read it
//! (`inspect.rs`: the flags and the output).

use std::process::ExitCode;

mod inspect;

fn main() -> ExitCode {
    gkq_cli::init_logging();
    let started = std::time::Instant::now();
    gkq_cli::exit(
        "gkq-inspect",
        inspect::run(&gkq_cli::parse::<inspect::Args>("gkq-inspect"), started),
    )
}
