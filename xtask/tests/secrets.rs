//! Issue 35, item 6: `cargo xtask upload` never echoes its arguments, so a
//! secret given by mistake (`--endpoint http://KEY:SECRET@host`) is refused
//! without being printed. xtask runs the r2-upload binary itself (cargo's
//! `Running …` line of a `cargo run` would print the argv), and the alias
//! keeps the outer cargo quiet.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/` of the workspace: this test runs from target/debug/deps.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("exe");
    exe.ancestors().nth(3).expect("target").to_path_buf()
}

#[test]
fn upload_prints_no_secret_of_its_arguments() {
    let r2 = target_dir().join("debug/r2-upload");
    assert!(
        r2.is_file(),
        "{} is missing: run the workspace's tests (cargo test --workspace), which build it",
        r2.display()
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("pkg");
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/qwen2-tiny");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(&tiny, &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    let o = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["upload", out.to_str().expect("utf8"), "--bucket", "models"])
        .args(["--endpoint", "http://AKID42:s3cr3t-value@127.0.0.1:9"])
        // the binary is built already: the build step is a no-op here
        .env("CARGO", "true")
        .env("CARGO_TARGET_DIR", target_dir())
        .current_dir(tmp.path())
        .output()
        .expect("run xtask upload");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(1), "{all}");
    assert!(all.contains("credentials in the URL are refused"), "{all}");
    assert!(!all.contains("s3cr3t") && !all.contains("AKID42"), "{all}");
}

#[test]
fn the_alias_keeps_cargo_quiet() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let config = std::fs::read_to_string(root.join(".cargo/config.toml")).expect("config");
    let alias = config
        .lines()
        .find(|l| l.starts_with("xtask = "))
        .expect("the xtask alias");
    assert!(alias.contains("\"--quiet\""), "{alias}");
    let main = std::fs::read_to_string(root.join("xtask/src/tasks.rs")).expect("tasks.rs");
    let upload = &main[main.find("fn upload(").expect("fn upload")..];
    let body = &upload[..upload.find("\n}\n").expect("end")];
    assert!(
        !body.contains("\"run\""),
        "upload must not `cargo run`: {body}"
    );
}
