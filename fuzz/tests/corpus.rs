//! Every committed corpus input through its target: the fuzzer's findings
//! and the inputs that reached new code stay regression tests, run by
//! `cargo test` in CI (the AFL++ runs themselves are `cargo xtask afl`).

use std::path::Path;

fn replay(target: &str, f: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("entry").path();
        let data = std::fs::read(&p).expect("read");
        let r = std::panic::catch_unwind(|| f(&data));
        assert!(r.is_ok(), "{target}: {} panics", p.display());
        n += 1;
    }
    assert!(n > 0, "{target}: empty corpus");
}

#[test]
fn knot_corpus() {
    replay("knot", gkq_fuzz::knot);
}

#[test]
fn merkle_corpus() {
    replay("merkle", gkq_fuzz::merkle);
}

#[test]
fn runs_corpus() {
    replay("runs", gkq_fuzz::runs);
}

#[test]
fn config_corpus() {
    replay("config", gkq_fuzz::config);
}

#[test]
fn safetensors_corpus() {
    replay("safetensors", gkq_fuzz::safetensors);
}

#[test]
fn spectral_corpus() {
    replay("spectral", gkq_fuzz::spectral);
}

#[test]
fn quant_corpus() {
    replay("quant", gkq_fuzz::quant);
}

#[test]
fn gguf_corpus() {
    replay("gguf", gkq_fuzz::gguf);
}
