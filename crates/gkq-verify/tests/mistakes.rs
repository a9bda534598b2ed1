//! The mistakes a new user makes with gkq-verify and gkq-pack, and the
//! message each gets: what went wrong and what to do (issue 25).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn verify(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gkq-verify"))
        .args(args)
        .output()
        .expect("run gkq-verify")
}

fn pack(src: &Path, out: &Path) {
    gkq_pack::pack(&gkq_pack::PackOptions::new(src, out), &gkq_pack::NoProgress).expect("pack");
}

fn model(dir: &Path, preset: &str) -> PathBuf {
    fixtures::write_model(dir, &fixtures::preset(preset).expect("preset")).expect("fixture");
    dir.to_path_buf()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8")
}

#[test]
fn the_wrong_source_is_called_a_different_model() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(&tmp.path().join("qwen"), "qwen2-tiny-f32");
    let other = model(&tmp.path().join("llama"), "llama-tiny-f32");
    let out = tmp.path().join("out");
    pack(&src, &out);
    let o = verify(&[s(&out), "--source", s(&other)]);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    println!("{text}");
    assert!(text.contains("looks like a different model"), "{text}");
    assert!(text.contains("tensors"), "{text}");
}

#[test]
fn a_knot_url_given_as_the_base_url_suggests_the_base() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(&tmp.path().join("src"), "qwen2-tiny-f32");
    let out = tmp.path().join("www/v1");
    pack(&src, &out);
    let nginx = fixtures::servers::Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &fixtures::servers::NginxOptions::default(),
    )
    .expect("nginx");
    let knot_url = format!("{}/v1/model.knot", nginx.url());
    let o = verify(&[s(&out), "--url", &knot_url]);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    println!("{all}");
    assert_ne!(o.status.code(), Some(0), "{all}");
    assert!(
        all.contains(&format!("--url {}/v1", nginx.url())),
        "suggests the base: {all}"
    );
    assert!(
        !all.contains("model.knot/model.knot") || all.contains("base URL"),
        "{all}"
    );
}

#[test]
fn a_model_directory_without_config_json_says_it_is_required() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(&tmp.path().join("src"), "qwen2-tiny-f32");
    std::fs::remove_file(src.join("config.json")).expect("rm");
    let e = gkq_pack::pack(
        &gkq_pack::PackOptions::new(&src, tmp.path().join("out")),
        &gkq_pack::NoProgress,
    )
    .expect_err("no config.json");
    let msg = format!("{e:#}");
    println!("{msg}");
    assert!(
        msg.contains("config.json") && msg.contains("needs its config.json"),
        "{msg}"
    );
}

/// Every tool's help has examples (issue 25): `--help` shows them.
#[test]
fn help_has_examples() {
    fixtures::assert_help_has_examples(env!("CARGO_BIN_EXE_gkq-verify"));
}
