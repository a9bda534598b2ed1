//! `cargo xtask`: project tasks (see `cargo xtask --help`).
//!
//! - `demo`: pack and verify the committed tiny model (the README's first command);
//! - `upload`: publish a packed model to R2 (see `crates/r2-upload`);
//! - `local-servers`: a local S3 server and public URL to try `upload` against;
//! - `fuzz`: a bounded mutation fuzzer for the knot parser on the stable toolchain;
//! - `bench pack|verify|big|reader|wire|decode|spectral`: the performance benchmarks, with same-run references.

mod bench;
mod fuzz;
mod upload;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Pack the committed tiny model and verify it against its source.
    Demo,
    /// Install gkq-pack, gkq-verify, gkq-rows and gkq-inspect into ~/.cargo/bin (release builds).
    Install,
    /// Fuzz the knot parser for a bounded time.
    Fuzz {
        /// How long to run.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Seed of the mutation stream.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Publish a packed model to R2 (S3 API): rows first, knot last, resumable.
    Upload(upload::UploadArgs),
    /// Run s3s-fs on 127.0.0.1:8014 (bucket `models`) and nginx on 127.0.0.1:8080 over its data, until Ctrl-C or SIGTERM.
    ///
    /// Both are installed by `bash scripts/install-test-deps.sh` (nginx-light
    /// from apt, s3s-fs 0.14.1 from crates.io). Refuses to start when either
    /// port is taken (another local-servers, most likely).
    LocalServers,
    /// Benchmarks (release builds, same-run reference timings).
    Bench {
        #[command(subcommand)]
        which: bench::Which,
        /// Repetitions per measurement (the median is reported).
        #[arg(long, default_value_t = 3, global = true)]
        reps: usize,
    },
}

/// The workspace root.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is in the workspace")
        .to_path_buf()
}

/// `$CARGO`, or `cargo`.
pub(crate) fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root());
    c
}

/// Runs a command, failing with its name if it fails.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// The binaries a user runs, and the crate that builds each.
const BINARIES: [(&str, &str); 4] = [
    ("gkq-pack", "crates/gkq-pack"),
    ("gkq-verify", "crates/gkq-verify"),
    ("gkq-rows", "crates/gkq-reader"),
    ("gkq-inspect", "crates/gkq-reader"),
];

fn install() -> anyhow::Result<()> {
    for path in ["crates/gkq-pack", "crates/gkq-verify", "crates/gkq-reader"] {
        run(cargo().args(["install", "--locked", "--path", path]))?;
    }
    let names: Vec<&str> = BINARIES.iter().map(|(b, _)| *b).collect();
    eprintln!(
        "install: {} are in ~/.cargo/bin (on PATH with a standard rustup setup)",
        names.join(", ")
    );
    Ok(())
}

fn demo() -> anyhow::Result<()> {
    run(cargo().args([
        "build",
        "--quiet",
        "-p",
        "gkq-pack",
        "-p",
        "gkq-verify",
        "-p",
        "gkq-reader",
        "--bins",
    ]))?;
    let root = root();
    let (model, out) = ("fixtures/models/qwen2-tiny", "target/demo/qwen2-tiny");
    let step = |bin: &str, args: &[&str]| -> anyhow::Result<()> {
        eprintln!("$ {bin} {}", args.join(" "));
        run(Command::new(root.join("target/debug").join(bin))
            .args(args)
            .current_dir(&root))
    };
    step(
        "gkq-pack",
        &[
            model, "--out", out, "--force", "--dtype", "f32", "--dtype", "bf16",
        ],
    )?;
    step("gkq-verify", &[out, "--source", model])?;
    eprintln!("demo: packed {model} into {out} and verified it against the source");
    let bin_dir = root.join("target/debug");
    eprintln!(
        "demo: the binaries are in {} ({}); put them on PATH with\n  export PATH=\"{}:$PATH\"\nor install release builds into ~/.cargo/bin with `cargo xtask install`",
        bin_dir.display(),
        BINARIES.map(|(b, _)| b).join(", "),
        bin_dir.display()
    );
    Ok(())
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

fn local_servers() -> anyhow::Result<()> {
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

fn main() -> std::process::ExitCode {
    let result = match Cli::parse().cmd {
        Cmd::Demo => demo(),
        Cmd::Install => install(),
        Cmd::Fuzz { seconds, seed } => fuzz::run(seconds, seed),
        Cmd::Upload(a) => upload::run(a),
        Cmd::LocalServers => local_servers(),
        Cmd::Bench { which, reps } => bench::run(which, reps.max(1)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}`: the cause chain on one line, never a backtrace, even
            // with RUST_BACKTRACE=1 (a user error is not a crash).
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
