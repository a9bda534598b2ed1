//! `cargo xtask`: project tasks (see `cargo xtask --help`).
//!
//! - `demo`: pack and verify the committed tiny model (the README's first command);
//! - `upload`: publish a packed model to R2 (see `crates/r2-upload`);
//! - `local-servers`: a local S3 server and public URL to try `upload` against;
//! - `fuzz`: a bounded mutation fuzzer for the knot parser on the stable toolchain (`fuzz-mutate` of `fuzz/`);
//! - `afl`: the coverage-guided fuzzer on each target of `fuzz/`;
//! - `bench …`: the performance benchmarks, with same-run references (`crates/gkq-bench`).

mod afl;
mod tasks;

use clap::{Parser, Subcommand};

use tasks::{bench, demo, fuzz, install, local_servers, upload};

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
    /// Install gkq-pack, gkq-verify, gkq-rows, gkq-inspect, gkq-export and gkq-decode into ~/.cargo/bin (release builds; the node tools and gkq-decode with s3:// support).
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
    /// The coverage-guided fuzzer (AFL++ via cargo-afl) on each target of
    /// fuzz/, `--jobs` at a time, with inputs/s, edges reached and findings.
    Afl {
        /// Seconds per target.
        #[arg(long, default_value_t = 600)]
        seconds: u64,
        /// Targets run at once.
        #[arg(long, default_value_t = 2)]
        jobs: usize,
        /// Add the inputs that reached new edges to fuzz/corpus.
        #[arg(long)]
        keep: bool,
        /// Targets (default: all).
        targets: Vec<String>,
    },
    /// Publish a packed model to R2 (S3 API): rows first, knot last, resumable
    /// (`cargo xtask upload --help` for its flags; builds the r2-upload binary).
    #[command(disable_help_flag = true)]
    Upload {
        /// The arguments of r2-upload.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Run s3s-fs on 127.0.0.1:8014 (bucket `models`) and nginx on 127.0.0.1:8080 over its data, until Ctrl-C or SIGTERM.
    ///
    /// Both are installed by `bash scripts/install-test-deps.sh` (nginx-light
    /// from apt, s3s-fs 0.14.1 from crates.io). Refuses to start when either
    /// port is taken (another local-servers, most likely).
    LocalServers,
    /// Benchmarks (release builds, same-run reference timings): runs the
    /// gkq-bench binary (`cargo xtask bench --help` lists them).
    #[command(disable_help_flag = true)]
    Bench {
        /// The benchmark and its flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse().cmd {
        Cmd::Demo => demo(),
        Cmd::Install => install(),
        Cmd::Fuzz { seconds, seed } => fuzz(seconds, seed),
        Cmd::Afl {
            seconds,
            jobs,
            keep,
            targets,
        } => afl::run_all(seconds, jobs, &targets, keep),
        Cmd::Upload { args } => upload(&args),
        Cmd::LocalServers => local_servers(),
        Cmd::Bench { args } => bench(&args),
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
