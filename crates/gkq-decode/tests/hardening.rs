//! Issue 57 on gkq-decode: hostile chat templates end fast with an error
//! naming the limit, within a bounded memory; `-t` is clamped to the
//! cores; NaN sampling flags are refused; `-f` reads a file whose length
//! the file system does not know; a run's threads are bounded, and many
//! runs at once end without a crash.

use std::path::{Path, PathBuf};
use std::process::Output;

fn decode(args: &[&str]) -> Output {
    fixtures::tool(env!("CARGO_BIN_EXE_gkq-decode"))
        .args(args)
        .output()
        .expect("run gkq-decode")
}

/// The committed tiny model packed with a word-level tokenizer.json and,
/// when given, a tokenizer_config.json holding `template`.
fn packed(dir: &Path, template: Option<&str>) -> PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    for e in std::fs::read_dir(fixtures::committed_tiny()).expect("committed") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, src.join(p.file_name().expect("name"))).expect("copy");
    }
    std::fs::write(
        src.join("tokenizer.json"),
        r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":5,"world":17,"cat":300},"unk_token":"[UNK]"}}"#,
    )
    .expect("write");
    if let Some(t) = template {
        let cfg = serde_json::json!({ "chat_template": t });
        std::fs::write(src.join("tokenizer_config.json"), cfg.to_string()).expect("write");
    }
    let out = dir.join("pkg");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(&src, &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    out
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Issue 57: each template probe ends within 5 s and 256 MB, exit 1, with
/// an error naming the limit it hit.
#[test]
fn hostile_chat_templates_end_fast_in_bounded_memory() {
    let probes = [
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "fuel of 2000000 instructions",
        ),
        ("{{ 'x' | indent(4000000000) }}", "over the limit of"),
        (
            "{% for i in range(100) %}{{ 'a' * 100000000 }}{% endfor %}",
            "the limit of a rendered prompt",
        ),
    ];
    for (i, (template, want)) in probes.iter().enumerate() {
        let tmp = tempfile::tempdir().expect("tmp");
        let pkg = packed(&tmp.path().join(i.to_string()), Some(template));
        let mut cmd = fixtures::tool(env!("CARGO_BIN_EXE_gkq-decode"));
        cmd.arg(&pkg).args(["--chat", "hello", "-n", "1"]);
        let start = std::time::Instant::now();
        let (o, rss) = fixtures::output_and_peak_rss(&cmd, 60);
        let took = start.elapsed();
        let e = err(&o);
        println!("{template}: {took:?}, {} MB: {e}", rss >> 20);
        assert_eq!(o.status.code(), Some(1), "{template}: {e}");
        assert!(e.contains(want), "{template}: {want:?} missing from {e}");
        assert!(took.as_secs() < 5, "{template}: {took:?}");
        assert!(rss < 256 << 20, "{template}: peak RSS {rss}");
    }
}

/// Issue 57: `-t 100000` does not start 100,000 threads: the cores are
/// used, with a note saying so.
#[test]
fn threads_beyond_the_cores_are_clamped_with_a_note() {
    let tmp = tempfile::tempdir().expect("tmp");
    let pkg = packed(tmp.path(), None);
    let p = pkg.to_str().expect("utf8");
    let o = decode(&[
        p,
        "--prompt-ids",
        "5,17",
        "-n",
        "2",
        "-t",
        "100000",
        "--json",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    assert_eq!(v["threads"], cores, "{v}");
    assert!(
        err(&o).contains("100000 threads asked for; this machine has"),
        "{}",
        err(&o)
    );
}

/// Issue 57, J12: `--temp nan` and `--top-p nan` are refused (NaN always
/// picked the least likely token, and was ignored as top-p).
#[test]
fn nan_sampling_flags_are_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let pkg = packed(tmp.path(), None);
    let p = pkg.to_str().expect("utf8");
    for flags in [
        &["--temp", "nan"][..],
        &["--top-p", "nan"],
        &["--temp", "inf"],
        &["--top-p", "1.5"],
    ] {
        let mut args = vec![p, "--prompt-ids", "5"];
        args.extend_from_slice(flags);
        let o = decode(&args);
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {}", err(&o));
        assert!(err(&o).contains(flags[0]), "{flags:?}: {}", err(&o));
    }
}

/// Issue 57, J11: `-f` reads a file to its end within the bound, also one
/// whose length the file system reports as 0 (`/proc/self/status`).
#[test]
fn a_prompt_file_of_unknown_length_is_read_to_its_end() {
    let tmp = tempfile::tempdir().expect("tmp");
    let pkg = packed(tmp.path(), None);
    let p = pkg.to_str().expect("utf8");
    let o = decode(&[p, "-f", "/proc/self/status", "-n", "1", "--json"]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let ids = v["prompt_ids"].as_array().expect("ids").len();
    assert!(
        ids > 10,
        "the status file's words, not an empty prompt: {v}"
    );
}

/// Issue 57: many decodes of a local package, two at a time, each with a
/// bounded number of threads (the blocking pool was unbounded: about 300
/// threads for SmolLM2), and none ends in a crash (its exit at shutdown
/// detached threads while they exited; `cargo xtask bench stress` runs 500
/// decodes of SmolLM2 under load).
#[test]
fn many_decodes_end_cleanly_with_bounded_threads() {
    let tmp = tempfile::tempdir().expect("tmp");
    let pkg = packed(tmp.path(), None);
    let p = pkg.to_str().expect("utf8");
    let run = || {
        (0..40)
            .map(|_| decode(&[p, "--prompt-ids", "5,17,300", "-n", "4", "--json"]))
            .collect::<Vec<_>>()
    };
    let all = std::thread::scope(|s| {
        let a = s.spawn(run);
        let mut v = run();
        v.extend(a.join().expect("runs"));
        v
    });
    for o in &all {
        assert_eq!(o.status.code(), Some(0), "{}", err(o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        let threads = v["process_threads"].as_u64().expect("process_threads");
        // main, the compute threads, 2 I/O workers, at most 8 blocking
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as u64;
        assert!(threads <= 1 + cores + 2 + 8 + 2, "{threads} threads: {v}");
    }
}

/// Issue 57, J3: the prompt goes through the layers `ubatch` tokens at a
/// time, and attention in tiles of queries; the last position's logits are
/// those of one pass and of token-by-token prefill, within f32 rounding,
/// whatever the micro-batch (300 tokens: several attention tiles).
#[test]
fn micro_batched_prefill_equals_one_pass() {
    let tmp = tempfile::tempdir().expect("tmp");
    let pkg = packed(tmp.path(), None);
    let knot = pkg.join("model.knot");
    let prompt: Vec<u32> = (0..300).map(|i| (i * 37 + 11) % 1000).collect();
    let logits = |ubatch: usize| {
        let config = gkq_reader::ReaderConfig::default();
        let mut stage = gkq_decode::Stage::open(
            knot.to_str().expect("utf8"),
            config,
            gkq_decode::StageRoles::All,
            None,
        )
        .expect("open");
        let opts = gkq_decode::GenOptions {
            max_new: Some(1),
            ubatch,
            ..Default::default()
        };
        let g = gkq_decode::generate_with(
            std::slice::from_mut(&mut stage),
            &prompt,
            &opts,
            &mut |_| Ok(false),
        )
        .expect("generate");
        g.first_logits
    };
    let one = logits(512);
    let big = one.iter().fold(0f32, |m, x| m.max(x.abs()));
    for ubatch in [1, 7, 64, 100] {
        let other = logits(ubatch);
        let diff = one
            .iter()
            .zip(&other)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff <= 1e-5 * big, "ubatch {ubatch}: {diff} of {big}");
    }
}

/// Issue 57, J3: a long prompt's attention never holds `heads × tokens ×
/// tokens` scores: 6,000 tokens through the tiny model (4 heads) peak far
/// below the 576 MB one layer's scores took (the prompt in one pass, the
/// scores and the mask whole: SmolLM2 with 4,000 tokens peaked at 2.15 GB;
/// `cargo xtask bench memory` measures it).
#[test]
fn a_long_prompt_holds_no_tokens_squared_scores() {
    let tmp = tempfile::tempdir().expect("tmp");
    let pkg = packed(tmp.path(), None);
    let ids: Vec<String> = (0..6000)
        .map(|i| ((i * 37 + 11) % 1000).to_string())
        .collect();
    let mut cmd = fixtures::tool(env!("CARGO_BIN_EXE_gkq-decode"));
    cmd.arg(&pkg).args([
        "--prompt-ids",
        &ids.join(","),
        "-n",
        "1",
        "-c",
        "0",
        "--json",
    ]);
    let (o, rss) = fixtures::output_and_peak_rss(&cmd, 300);
    assert!(o.status.success(), "{}", err(&o));
    println!("6,000 tokens: peak RSS {} MB", rss >> 20);
    assert!(rss < 150 << 20, "peak RSS {rss}");
}
