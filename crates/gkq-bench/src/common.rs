//! What the benchmarks share: where they write, the release binaries they
//! run, the presets they generate and pack, and how they time a command.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

use fixtures::workspace::{cargo, root};

pub(crate) fn bench_dir() -> PathBuf {
    root().join("target/bench")
}

pub(crate) fn release_bin(name: &str) -> PathBuf {
    root().join("target/release").join(name)
}

/// Generates a fixture preset under `target/bench` once (release build of
/// the generator; a `.complete` stamp marks a finished one).
pub(crate) fn preset(name: &str) -> anyhow::Result<PathBuf> {
    let dir = bench_dir().join(name);
    let stamp = dir.join(".complete");
    if !stamp.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("bench: generating the {name} preset in {}", dir.display());
        run_cmd(
            Command::new(release_bin("gkq-fixtures"))
                .arg(name)
                .arg(&dir),
        )?;
        std::fs::write(&stamp, "")?;
    }
    Ok(dir)
}

/// The qwen2.5-0.5b preset (vocab 151936, hidden 896, 24 layers, bf16).
pub(crate) fn model() -> anyhow::Result<PathBuf> {
    preset("qwen2.5-0.5b")
}

pub(crate) fn build() -> anyhow::Result<()> {
    run_cmd(cargo().args([
        "build",
        "--release",
        "--quiet",
        "-p",
        "gkq-pack",
        "-p",
        "gkq-verify",
        "-p",
        "gkq-sign",
        "-p",
        "fixtures",
        "-p",
        "gkq-node",
        "-p",
        "gkq-decode",
    ]))
}

pub(crate) fn sync() {
    let _ = Command::new("sync").status();
}

/// Wall time of a command (after a `sync`, so earlier writeback does not
/// land in this measurement), and its stdout.
pub(crate) fn timed(cmd: &mut Command) -> anyhow::Result<(f64, Vec<u8>)> {
    sync();
    let t = Instant::now();
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok((secs, out.stdout))
}

/// Wall time of `program` with `args` under `/usr/bin/time -f FORMAT`,
/// the last line `time` wrote, and the program's stdout.
fn timed_by(
    program: &Path,
    args: &[&std::ffi::OsStr],
    format: &str,
) -> anyhow::Result<(f64, String, Vec<u8>)> {
    let out_file = bench_dir().join("time.txt");
    let (secs, stdout) = timed(
        Command::new("/usr/bin/time")
            .args(["-f", format, "-o"])
            .arg(&out_file)
            .arg(program)
            .args(args),
    )?;
    let text = std::fs::read_to_string(&out_file)?;
    let last = text.trim().lines().last().unwrap_or_default().to_owned();
    Ok((secs, last, stdout))
}

/// Wall time and peak RSS (KiB, from `/usr/bin/time -f %M`) of `program`
/// with `args`, and its stdout.
pub(crate) fn timed_rss(
    program: &Path,
    args: &[&std::ffi::OsStr],
) -> anyhow::Result<(f64, u64, Vec<u8>)> {
    let (secs, last, stdout) = timed_by(program, args, "%M")?;
    let kib = last
        .trim()
        .parse()
        .ok()
        .context("peak RSS from /usr/bin/time")?;
    Ok((secs, kib, stdout))
}

/// Wall time and CPU time (user + system, from `/usr/bin/time -f`) of
/// `program` with `args`.
pub(crate) fn timed_cpu(program: &Path, args: &[&std::ffi::OsStr]) -> anyhow::Result<(f64, f64)> {
    let (secs, last, _) = timed_by(program, args, "%U %S")?;
    let times: Vec<f64> = last
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    if times.len() != 2 {
        bail!("user and system time from /usr/bin/time: {last:?}");
    }
    Ok((secs, times.iter().sum()))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let m = e?.metadata()?;
        if m.is_file() {
            n += m.len();
        }
    }
    Ok(n)
}

pub(crate) fn pack_once(
    model: &Path,
    out: &Path,
    dtype: &str,
) -> anyhow::Result<(f64, serde_json::Value)> {
    pack_with(model, out, &[dtype])
}

/// Packs `model` into `out` (replacing it) with one `--dtype` per entry.
pub(crate) fn pack_with(
    model: &Path,
    out: &Path,
    dtypes: &[&str],
) -> anyhow::Result<(f64, serde_json::Value)> {
    let mut cmd = Command::new(release_bin("gkq-pack"));
    cmd.arg(model)
        .arg("--out")
        .arg(out)
        .args(["--json", "--force"]);
    for d in dtypes {
        cmd.args(["--dtype", d]);
    }
    let (secs, stdout) = timed(&mut cmd)?;
    Ok((secs, serde_json::from_slice(&stdout)?))
}

/// Packs `model` into `out` (replacing it) with these gkq-pack flags.
pub(crate) fn pack_args(model: &Path, out: &Path, args: &[&str]) -> anyhow::Result<f64> {
    let mut cmd = Command::new(release_bin("gkq-pack"));
    cmd.arg(model)
        .arg("--out")
        .arg(out)
        .args(["--json", "--force"])
        .args(args);
    Ok(timed(&mut cmd)?.0)
}

/// Single-core SHA-256 rate of this machine, bytes per second, from
/// `openssl speed -evp sha256` on 16 KiB blocks.
pub(crate) fn openssl_sha256_rate() -> anyhow::Result<f64> {
    let o = Command::new("openssl")
        .args([
            "speed", "-evp", "sha256", "-seconds", "2", "-bytes", "16384",
        ])
        .output()
        .context("running openssl speed")?;
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with("sha256"))
        .context("no sha256 line in openssl speed's output")?;
    let k: f64 = line
        .split_whitespace()
        .last()
        .and_then(|v| v.trim_end_matches('k').parse().ok())
        .context("openssl speed's rate")?;
    Ok(k * 1000.0)
}

/// The pack the reader benches read: f32 blocks, f32 and bf16 row files.
pub(crate) const PACK: &str = "pack-f32-bf16";

/// Packs the preset as [`PACK`] (always: the format may have changed).
pub(crate) fn packed() -> anyhow::Result<()> {
    let model = model()?;
    pack_with(&model, &bench_dir().join(PACK), &["f32", "bf16"])?;
    Ok(())
}

/// Runs a command, failing with its name if it fails.
pub(crate) fn run_cmd(cmd: &mut std::process::Command) -> anyhow::Result<()> {
    Ok(fixtures::workspace::run(cmd)?)
}
