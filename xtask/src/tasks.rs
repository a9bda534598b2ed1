//! The tasks of `cargo xtask` that are not the fuzzers or the benches:
//! `demo`, `install`, `upload`, `local-servers`, and `fuzz` (which runs
//! `fuzz/`'s `fuzz-mutate`).

use std::process::Command;

use anyhow::{Context, bail};
use fixtures::workspace::{cargo, root, run, target_dir};

/// The tools a user runs: each crate, the binaries it builds, and the
/// features `cargo xtask install` gives it.
const TOOLS: [(&str, &[&str], &str); 6] = [
    ("crates/gkq-pack", &["gkq-pack"], ""),
    ("crates/gkq-verify", &["gkq-verify"], ""),
    ("crates/gkq-sign", &["gkq-sign"], ""),
    (
        "crates/gkq-node",
        &[
            "gkq-rows",
            "gkq-inspect",
            "gkq-export",
            "gkq-mirror",
            "gkq-report",
        ],
        "s3",
    ),
    ("crates/gkq-decode", &["gkq-decode"], "s3"),
    // the uploader of `cargo xtask upload`, for CI runners without a checkout
    ("crates/r2-upload", &["r2-upload"], ""),
];

/// Every tool's binary name.
fn tool_names() -> Vec<&'static str> {
    TOOLS
        .iter()
        .flat_map(|(_, bins, _)| bins.iter().copied())
        .collect()
}

pub(crate) fn install() -> anyhow::Result<()> {
    for (path, bins, features) in TOOLS {
        eprintln!(
            "install: {} (release build{})",
            bins.join(", "),
            if features.is_empty() {
                String::new()
            } else {
                format!(", features {features}")
            }
        );
        let mut c = cargo();
        c.args(["install", "--locked", "--path", path]);
        if !features.is_empty() {
            c.args(["--features", features]);
        }
        run(&mut c)?;
    }
    eprintln!(
        "install: {} are in ~/.cargo/bin (on PATH with a standard rustup setup); `NAME --version` lists each one's features",
        tool_names().join(", ")
    );
    Ok(())
}

/// The mutation fuzzer of `fuzz/` (`fuzz-mutate`), built and run by cargo.
pub(crate) fn fuzz(seconds: u64, seed: u64) -> anyhow::Result<()> {
    let (seconds, seed) = (seconds.to_string(), seed.to_string());
    Ok(run(cargo()
        .args([
            "run",
            "-q",
            "-p",
            "gkq-fuzz",
            "--bin",
            "fuzz-mutate",
            "--",
            "--seconds",
        ])
        .args([&seconds, "--seed", &seed]))?)
}

/// `cargo xtask bench ARGS`: the gkq-bench binary, release.
pub(crate) fn bench(args: &[std::ffi::OsString]) -> anyhow::Result<()> {
    Ok(run(cargo()
        .args(["run", "-q", "--release", "-p", "gkq-bench", "--"])
        .args(args))?)
}

/// `cargo build` of one binary, cargo's progress shown.
fn build(args: &[&str]) -> anyhow::Result<()> {
    Ok(run(cargo().arg("build").args(args))?)
}

pub(crate) fn demo() -> anyhow::Result<()> {
    let root = root();
    let (model, out) = ("fixtures/models/qwen2-tiny", "target/demo/qwen2-tiny");
    let step = |bin: &str, args: &[&str]| -> anyhow::Result<()> {
        eprintln!("$ {bin} {}", args.join(" "));
        Ok(run(Command::new(root.join("target/debug").join(bin))
            .args(args)
            .current_dir(&root))?)
    };
    // The packer first, without the SVD (faer), so the first result comes
    // after the smallest build; then the gate.
    eprintln!("demo: building gkq-pack (debug, without the spectral feature)");
    build(&[
        "-p",
        "gkq-pack",
        "--no-default-features",
        "--bin",
        "gkq-pack",
    ])?;
    step(
        "gkq-pack",
        &[
            model, "--out", out, "--force", "--dtype", "f32", "--dtype", "bf16",
        ],
    )?;
    eprintln!("demo: building gkq-verify (debug)");
    build(&["-p", "gkq-verify", "--bin", "gkq-verify"])?;
    step("gkq-verify", &[out, "--source", model])?;
    eprintln!("demo: packed {model} into {out} and verified it against the source");
    let bin_dir = root.join("target/debug");
    eprintln!(
        "demo: gkq-pack and gkq-verify are in {}; put them on PATH with\n  export PATH=\"{}:$PATH\"\nor install release builds of all the tools ({}) into ~/.cargo/bin with `cargo xtask install`",
        bin_dir.display(),
        bin_dir.display(),
        tool_names().join(", ")
    );
    Ok(())
}

/// `cargo xtask upload ARGS`: builds the `r2-upload` binary (the AWS SDK
/// is built for this task only), then runs it in the directory it was
/// invoked from, so relative paths mean what they meant to the user. The
/// binary is run directly, not by `cargo run`, whose `Running …` line
/// would echo the arguments (a refused secret among them).
pub(crate) fn upload(args: &[std::ffi::OsString]) -> anyhow::Result<()> {
    let mut build = cargo();
    build
        .arg("build")
        .arg("--manifest-path")
        .arg(root().join("Cargo.toml"))
        .args(["--package", "r2-upload", "--bin", "r2-upload"]);
    let built = build
        .status()
        .with_context(|| format!("running {build:?}"))?;
    if !built.success() {
        bail!("building r2-upload failed");
    }
    let bin = target_dir().join("debug/r2-upload");
    let status = Command::new(&bin)
        .args(args)
        .current_dir(std::env::current_dir()?)
        .status()
        .with_context(|| format!("running {}", bin.display()))?;
    std::process::exit(status.code().unwrap_or(1));
}

/// Fails when something already listens on 127.0.0.1:`port`.
fn port_free(port: u16, what: &str) -> anyhow::Result<()> {
    if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        bail!(
            "127.0.0.1:{port} is already in use, so {what} cannot start there: is another `cargo xtask local-servers` running? (stop it, or find the process with `ss -ltnp 'sport = :{port}'`)"
        );
    }
    Ok(())
}

pub(crate) fn local_servers() -> anyhow::Result<()> {
    use fixtures::servers::{Nginx, NginxOptions, S3_ACCESS_KEY, S3_SECRET_KEY, S3sFs};
    port_free(8014, "s3s-fs")?;
    port_free(8080, "nginx")?;
    let dir = root().join("target/local-servers");
    let s3 = S3sFs::start_on(&dir.join("s3"), 8014)?;
    std::fs::create_dir_all(s3.data().join("models"))?;
    let nginx = Nginx::start(
        s3.data(),
        &dir.join("nginx"),
        &NginxOptions {
            port: Some(8080),
            ..Default::default()
        },
    )?;
    eprintln!(
        "s3s-fs {} (bucket models), access key {S3_ACCESS_KEY}, secret key {S3_SECRET_KEY}",
        s3.url()
    );
    eprintln!(
        "public bucket URL {}/models  (Ctrl-C or SIGTERM to stop)",
        nginx.url()
    );
    eprintln!("in another shell:");
    eprintln!("  export R2_ACCESS_KEY_ID={S3_ACCESS_KEY} R2_SECRET_ACCESS_KEY={S3_SECRET_KEY}");
    eprintln!(
        "  cargo xtask upload target/demo/qwen2-tiny --bucket models --prefix qwen2-tiny/v1 --endpoint {} --public-url {}/models/qwen2-tiny/v1",
        s3.url(),
        nginx.url()
    );
    // Wait for SIGINT or SIGTERM; the servers are stopped when dropped.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("tokio runtime")?;
    let which = rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        anyhow::Ok(tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        })
    })?;
    drop(nginx);
    drop(s3);
    eprintln!("local-servers: {which}: stopped s3s-fs and nginx");
    Ok(())
}
