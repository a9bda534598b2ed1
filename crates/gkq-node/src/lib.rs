//! The node tools `gkq-rows` and `gkq-inspect` (see `src/bin/`): read rows
//! and look inside a published knot the way a node does. Their flags are the
//! reader's `NodeArgs`/`NetArgs`; what surrounds `main` is `gkq-cli`'s.

/// The `--version` line: the version and this build's features.
pub fn version() -> &'static str {
    gkq_cli::version_line(gkq_store::FEATURES)
}
