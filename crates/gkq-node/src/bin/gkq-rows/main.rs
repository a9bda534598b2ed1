//! `gkq-rows`: the rows of token ids as a node fetches them (`rows.rs`:
//! the flags, the lookups through the reader, the output).

use std::process::ExitCode;

mod rows;

fn main() -> ExitCode {
    gkq_cli::init_logging();
    gkq_cli::exit(
        "gkq-rows",
        rows::run(gkq_cli::parse::<rows::Args>("gkq-rows")),
    )
}
