//! The node tools `gkq-rows`, `gkq-inspect` and `gkq-export` (see
//! `src/bin/`): read rows, look inside a published knot, and write it as a
//! GGUF (`export`), the way a node does. Their flags are the reader's
//! `NodeArgs`/`NetArgs`; what surrounds `main` is `gkq-cli`'s.

mod error;
pub mod export;
pub mod report;
pub mod tools;

pub use error::NodeError;

/// The `--version` line: the version and this build's features.
pub fn version() -> &'static str {
    gkq_cli::version_line(gkq_store::FEATURES)
}
