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

#[test]
fn sig_corpus() {
    replay("sig", gkq_fuzz::sig);
}

/// Requires `target`'s corpus to hold each of `seeds`; `GKQ_BLESS=1`
/// writes the missing ones (`seed-` and their digest).
fn holds_seeds(target: &str, seeds: &[Vec<u8>]) {
    use sha2::{Digest, Sha256};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let committed: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .expect("the corpus")
        .map(|e| std::fs::read(e.expect("entry").path()).expect("read"))
        .collect();
    for s in seeds.iter().filter(|s| !committed.contains(s)) {
        let name = format!("seed-{}", &gkq_format::hex(&Sha256::digest(s))[..16]);
        if std::env::var_os("GKQ_BLESS").is_some() {
            std::fs::write(dir.join(&name), s).expect("write");
        } else {
            panic!("the {target} corpus lacks its seed {name}: GKQ_BLESS=1");
        }
    }
}

/// The knot corpus holds every seed of the mutation fuzzer, so that AFL++
/// starts from every layout a writer writes (versions 3, 4 and 5).
#[test]
fn knot_corpus_holds_a_knot_of_every_version() {
    let seeds = gkq_fuzz::mutate::seeds().expect("the seeds");
    let version = |k: &[u8]| u32::from_le_bytes(k[8..12].try_into().expect("4 bytes"));
    let versions: std::collections::BTreeSet<u32> = seeds.iter().map(|s| version(s)).collect();
    assert_eq!(versions, [3, 4, 5].into(), "a seed of each version");
    holds_seeds("knot", &seeds);
}

/// The signature corpus holds signature objects `open` accepts.
#[test]
fn sig_corpus_holds_signatures_the_test_key_made() {
    let seeds = gkq_fuzz::sig_seeds();
    let trusted = [gkq_format::sig::PublicKey::from_key(
        *gkq_fuzz::test_key().verifying_key(),
    )];
    for s in &seeds {
        assert!(gkq_format::sig::open(s, &trusted).is_ok(), "a seed opens");
    }
    holds_seeds("sig", &seeds);
}
