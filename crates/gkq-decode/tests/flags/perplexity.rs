//! llama-perplexity's flags: `--perplexity` (chunks of -c, the second half
//! of each scored) and `--kl-divergence-base FILE` with `--kl-divergence`,
//! in llama-perplexity's file format (`cargo xtask bench qwen` reads
//! llama-perplexity's files with gkq-decode and checks both against it).

use super::{decode, json, packed, packed_with, usage};

/// Issue 54: `--perplexity` as llama-perplexity computes it (chunks of -c,
/// the second half of each scored; `cargo xtask bench qwen` checks it
/// against llama-perplexity): its counts, a chunking that does not change
/// with the micro-batch, and a text too short for two chunks named.
#[test]
fn perplexity_scores_the_second_half_of_each_chunk() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (knot, tok) = packed(tmp.path());
    let f = text(tmp.path());
    let run = |extra: &[&str]| {
        let mut args = vec![knot.as_str(), "--tokenizer", &tok, "--perplexity", "-f", &f];
        args.extend_from_slice(extra);
        json(&decode(&args))
    };
    let v = run(&["-c", "8", "--json"]);
    assert_eq!(
        (v["tokens"].as_u64(), v["chunks"].as_u64()),
        (Some(42), Some(5)),
        "{v}"
    );
    assert_eq!(v["scored"], 5 * 3, "positions 4..7 predict the next token");
    let ppl = v["perplexity"].as_f64().expect("ppl");
    assert!(ppl.is_finite() && ppl >= 1.0, "{v}");
    let small = run(&["-c", "8", "--json", "-ub", "3"]);
    let other = small["perplexity"].as_f64().expect("ppl");
    assert!(
        (other / ppl - 1.0).abs() < 1e-4,
        "{ppl} against {other} in micro-batches of 3"
    );
    let short = decode(&[
        &knot,
        "--tokenizer",
        &tok,
        "--perplexity",
        "-f",
        &f,
        "-c",
        "64",
    ]);
    usage(&short, &["needs at least 128 tokens, and the text has 42"]);
}

/// A perplexity text may be a test set larger than a prompt's 1 MiB
/// (wikitext-2's is 1.3 MB): `-f` reads it whole with `--perplexity`.
#[test]
fn a_perplexity_text_may_be_larger_than_a_prompt() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (knot, tok) = packed(tmp.path());
    let text = tmp.path().join("big.txt");
    std::fs::write(&text, "hello ".repeat(200_000)).expect("write");
    let f = text.to_str().expect("utf-8");
    let prompt = decode(&[&knot, "--tokenizer", &tok, "-f", f, "-n", "1"]);
    usage(&prompt, &["1200000 bytes"]);
    let ppl = decode(&[
        &knot,
        "--tokenizer",
        &tok,
        "--perplexity",
        "-f",
        f,
        "-c",
        "1",
    ]);
    usage(
        &ppl,
        &["a context of 1 (-c) needs at least 4 tokens, and the text has 200000"],
    );
}

/// The tiny model's text of 42 tokens (word-level: 5, 17, 300, …), written.
fn text(dir: &std::path::Path) -> String {
    let text = dir.join("text.txt");
    std::fs::write(&text, "hello world cat cat world hello ".repeat(7)).expect("write");
    text.display().to_string()
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Issue 54: a base run writes llama-perplexity's file (its header, the
/// whole chunks' tokens, 16-bit log-probabilities per scored position);
/// the same package against it gives its own perplexity and no divergence;
/// a Q4_0 pack of the same model gives a divergence, over the file's tokens
/// with no text given.
#[test]
fn a_base_file_compares_two_packages_as_llama_perplexity_does() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (knot, tok) = packed(&tmp.path().join("a"));
    let f = text(tmp.path());
    let base = tmp.path().join("base.kld");
    let b = base.to_str().expect("utf-8");
    let common = ["--tokenizer", &tok, "-c", "8", "--json"];
    let mut args = vec![
        knot.as_str(),
        "--perplexity",
        "-f",
        &f,
        "--kl-divergence-base",
        b,
    ];
    args.extend_from_slice(&common);
    let ppl = json(&decode(&args))["perplexity"].as_f64().expect("ppl");
    let bytes = std::fs::read(&base).expect("base written");
    assert_eq!(&bytes[..8], b"_logits_");
    let (n_ctx, vocab, chunks) = (le32(&bytes, 8), le32(&bytes, 12), le32(&bytes, 16));
    assert_eq!((n_ctx, vocab, chunks), (8, 1024, 5));
    let nv = 2 * vocab.div_ceil(2) as usize + 4;
    assert_eq!(bytes.len(), 20 + 5 * 8 * 4 + 5 * 3 * nv * 2);
    let first: Vec<u32> = (0..6).map(|i| le32(&bytes, 20 + 4 * i)).collect();
    assert_eq!(first, [5, 17, 300, 300, 17, 5], "the text's tokens");
    let against = |knot: &str| {
        let mut args = vec![knot, "--kl-divergence", "--kl-divergence-base", b];
        args.extend_from_slice(&common);
        json(&decode(&args))
    };
    let same = against(&knot);
    assert_eq!(
        (same["chunks"].as_u64(), same["scored"].as_u64()),
        (Some(5), Some(15))
    );
    let rel = |a: &serde_json::Value, b: f64| (a.as_f64().expect("f64") / b - 1.0).abs();
    assert!(rel(&same["perplexity"], ppl) < 1e-9, "{same} against {ppl}");
    assert!(rel(&same["perplexity_base"], ppl) < 1e-3, "{same}");
    assert!(same["kld"].as_f64().expect("kld").abs() < 1e-4, "{same}");
    assert_eq!(same["same_top"], 1.0);
    let (q4, _) = packed_with(&tmp.path().join("b"), |o| {
        o.quant.weights = Some(gkq_pack::parse_quant("q4_0").expect("q4_0").0);
    });
    let other = against(&q4);
    let kld = other["kld"].as_f64().expect("kld");
    assert!(kld > 1e-4 && kld.is_finite(), "{other}");
    assert!(rel(&other["perplexity_base"], ppl) < 1e-3, "{other}");
    assert!(
        other["kld_max"].as_f64() >= other["kld_median"].as_f64(),
        "{other}"
    );
    let text_out = decode(&[
        &q4,
        "--kl-divergence",
        "--kl-divergence-base",
        b,
        "--tokenizer",
        &tok,
    ]);
    let text_out = String::from_utf8_lossy(&text_out.stdout);
    for line in [
        "Mean PPL(Q)",
        "Mean PPL(base)",
        "Mean    KLD:",
        "Same top p:",
    ] {
        assert!(text_out.contains(line), "{line:?} in {text_out}");
    }
}

/// Issue 54: base files that are not whole are refused naming the file,
/// before anything is allocated for what they claim (exit 2); a base run
/// that fails leaves no file; `--kl-divergence-base` alone says what it is
/// for.
#[test]
fn a_base_file_that_is_not_whole_is_refused_and_a_failed_run_leaves_none() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (knot, tok) = packed(tmp.path());
    let f = text(tmp.path());
    let good = tmp.path().join("good.kld");
    let g = good.to_str().expect("utf-8");
    let args = [knot.as_str(), "--tokenizer", &tok, "--perplexity", "-f", &f];
    let mut write = args.to_vec();
    write.extend_from_slice(&["-c", "8", "--kl-divergence-base", g]);
    json(&decode(&[write.as_slice(), &["--json"]].concat()));
    let bytes = std::fs::read(&good).expect("base");
    let mut huge = bytes.clone();
    huge[16..20].copy_from_slice(&i32::MAX.to_le_bytes());
    let mut vocab = bytes.clone();
    vocab[12..16].copy_from_slice(&151_936i32.to_le_bytes());
    let mut token = bytes.clone();
    token[24..28].copy_from_slice(&5000u32.to_le_bytes());
    let cases: [(&str, Vec<u8>, &str); 5] = [
        (
            "magic",
            [b"_notits_", &bytes[8..]].concat(),
            "not a llama-perplexity",
        ),
        (
            "short",
            bytes[..bytes.len() - 1].to_vec(),
            "truncated or not a base file",
        ),
        ("huge", huge, "2147483647 chunks of 8 tokens"),
        (
            "vocab",
            vocab,
            "a vocabulary of 151936 tokens, and this model has 1024",
        ),
        (
            "token",
            token,
            "token 1 is 5000, outside the vocabulary of 1024",
        ),
    ];
    for (name, b, needle) in cases {
        let path = tmp.path().join(format!("{name}.kld"));
        std::fs::write(&path, b).expect("write");
        let p = path.to_str().expect("utf-8");
        let o = decode(&[
            &knot,
            "--tokenizer",
            &tok,
            "--kl-divergence",
            "--kl-divergence-base",
            p,
        ]);
        usage(&o, &[p, needle]);
    }
    // a text too short for two chunks of 64: no file, no temporary left
    let lost = tmp.path().join("out/lost.kld");
    std::fs::create_dir_all(lost.parent().expect("dir")).expect("mkdir");
    let mut short = args.to_vec();
    short.extend_from_slice(&[
        "-c",
        "64",
        "--kl-divergence-base",
        lost.to_str().expect("utf-8"),
    ]);
    usage(&decode(&short), &["needs at least 128 tokens"]);
    let left = std::fs::read_dir(tmp.path().join("out"))
        .expect("dir")
        .count();
    assert_eq!(left, 0, "nothing written");
    let alone = decode(&[
        &knot,
        "--tokenizer",
        &tok,
        "-f",
        &f,
        "--kl-divergence-base",
        g,
    ]);
    usage(
        &alone,
        &["written by --perplexity and read by --kl-divergence"],
    );
}
