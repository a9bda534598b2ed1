//! The mistakes a new user makes with gkq-decode, and the message each
//! gets: what went wrong and what to do (issue 25).

use std::path::{Path, PathBuf};
use std::process::Output;

fn decode(args: &[&str]) -> Output {
    fixtures::tool(env!("CARGO_BIN_EXE_gkq-decode"))
        .args(args)
        .output()
        .expect("run gkq-decode")
}

fn pack(dir: &Path, preset: &str) -> PathBuf {
    let src = dir.join("src");
    fixtures::write_model(&src, &fixtures::preset(preset).expect("preset")).expect("fixture");
    let out = dir.join("pkg");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(&src, &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    out
}

/// Exit `code`, and stderr holds every needle.
fn says(o: &Output, code: i32, needles: &[&str]) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    println!("{err}"); // shown with --nocapture: the message as a user sees it
    assert_eq!(o.status.code(), Some(code), "{err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} missing from: {err}");
    }
    err
}

#[test]
fn an_unsupported_architecture_is_named_with_the_supported_ones() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(tmp.path(), "gpt2-tiny-f32");
    let err = says(
        &decode(&[out.to_str().expect("utf8"), "--prompt-ids", "1"]),
        1,
        &["gpt2", "qwen2", "llama", "mistral"],
    );
    assert!(!err.contains("missing field"), "{err}");
}

#[test]
fn an_encoder_only_model_has_no_lm_head() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(tmp.path(), "bert-tiny-f32");
    let err = says(
        &decode(&[out.to_str().expect("utf8"), "--prompt-ids", "1"]),
        1,
        &["bert", "encoder-only model has no LM head"],
    );
    assert!(!err.contains("missing field"), "{err}");
}

#[test]
fn a_package_without_its_config_says_what_is_missing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(tmp.path(), "qwen2-tiny-f32");
    std::fs::remove_file(out.join("config.json")).expect("rm");
    let www = tmp.path();
    let nginx = fixtures::servers::Nginx::start(
        www,
        &tmp.path().join("nginx"),
        &fixtures::servers::NginxOptions::default(),
    )
    .expect("nginx");
    for knot in [
        out.to_str().expect("utf8").to_owned(),
        format!("{}/pkg/model.knot", nginx.url()),
    ] {
        let err = says(&decode(&[&knot, "--prompt-ids", "1"]), 1, &["config.json"]);
        assert!(
            err.contains("missing") || err.contains("not found") || err.contains("404"),
            "{err}"
        );
        assert!(!err.contains("for HEAD"), "{knot}: {err}");
    }
}

#[test]
fn a_split_beyond_the_layers_names_the_layer_count() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(tmp.path(), "qwen2-tiny-f32");
    let err = says(
        &decode(&[
            out.to_str().expect("utf8"),
            "--prompt-ids",
            "1",
            "--split",
            "5",
        ]),
        2,
        &["--split 5", "layers"],
    );
    assert!(!err.contains("--layers"), "{err}");
}

/// Every tool's help has examples (issue 25): `--help` shows them.
#[test]
fn help_has_examples() {
    fixtures::assert_help_has_examples(env!("CARGO_BIN_EXE_gkq-decode"));
}

/// Issue 58: a GGUF given where a knot goes is named as a GGUF: a `.gguf`
/// runs as it is (packed on the fly: a broken one is named with what the
/// packer says), any other name gets the command that makes a package.
#[test]
fn a_gguf_is_named_as_one_with_how_to_pack_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let gguf = tmp.path().join("model.gguf");
    let mut bytes = b"GGUF\x03\0\0\0".to_vec();
    bytes.resize(4096, 0);
    std::fs::write(&gguf, &bytes).expect("write");
    let o = decode(&["-m", gguf.to_str().expect("utf-8"), "-p", "hi"]);
    says(
        &o,
        1,
        &[
            "model.gguf",
            "is a model, not a GKQ package",
            "packing it failed",
        ],
    );
    let renamed = tmp.path().join("model.bin");
    std::fs::write(&renamed, &bytes).expect("write");
    let o = decode(&["-m", renamed.to_str().expect("utf-8"), "-p", "hi"]);
    says(
        &o,
        1,
        &[
            "model.bin",
            "it is a GGUF file",
            "gkq-pack MODEL.gguf --out DIR",
        ],
    );
}

/// Issue 58: a server that stops in the middle of a pull. The run ends
/// (the retry policy's bounded wait), exit 1, naming the network failure
/// and the URL, not the tokenizer; one WARN line for its one source, not
/// one per attempt.
#[test]
fn a_server_stopped_mid_pull_is_named_as_the_network() {
    let tmp = tempfile::tempdir().expect("tmp");
    let pkg = pack(tmp.path(), "llama-tiny-k");
    let www = tmp.path().join("www");
    std::fs::create_dir_all(&www).expect("mkdir");
    std::fs::rename(&pkg, www.join("m")).expect("move");
    // the knot's header at once, then 16 KiB/s a connection: a pull of
    // seconds, stopped after one
    let opts = fixtures::servers::NginxOptions {
        extra: "limit_rate_after 64k; limit_rate 16k;".into(),
        ..Default::default()
    };
    let nginx =
        fixtures::servers::Nginx::start(&www, &tmp.path().join("nginx"), &opts).expect("nginx");
    let url = format!("{}/m/model.knot", nginx.url());
    let mut c = fixtures::tool(env!("CARGO_BIN_EXE_gkq-decode"));
    c.args([&url, "--prompt-ids", "1,2,3", "-n", "2", "--no-cache"]);
    let stop = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(1));
        drop(nginx);
    });
    let started = std::time::Instant::now();
    let o = fixtures::output_within(&mut c, 120);
    stop.join().expect("stopped");
    assert!(
        started.elapsed().as_secs_f64() > 1.0,
        "the pull outlived the server"
    );
    let err = says(&o, 1, &["127.0.0.1", "onnect"]);
    assert!(!err.contains("tokenizer"), "{err}");
    let warns = err.lines().filter(|l| l.contains("WARN")).count();
    assert!(warns <= 1, "{warns} WARN lines: {err}");
}
