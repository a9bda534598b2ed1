//! `gkq-rows`: flags in, [`gkq_node::tools::rows`] does the work.

use std::process::ExitCode;

fn main() -> ExitCode {
    gkq_cli::init_logging();
    gkq_cli::exit(
        "gkq-rows",
        gkq_node::tools::rows::run(gkq_cli::parse::<gkq_node::tools::rows::Args>("gkq-rows")),
    )
}
