//! The node tools `gkq-rows` and `gkq-inspect` (see `src/bin/`): read rows
//! and look inside a published knot the way a node does. Their flags are the
//! reader's `NodeArgs`/`NetArgs`; what surrounds `main` is `gkq-cli`'s.

/// The `--version` line: the version and this build's features.
pub fn version() -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| gkq_cli::version(gkq_store::FEATURES))
}
