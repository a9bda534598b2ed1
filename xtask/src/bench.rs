//! Benchmarks. Each prints its figures next to a reference measured in the
//! same run on the same files (`cp -r`, `sha256sum`), because these machines
//! are noisy; the ratio is the number to compare with the targets.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Subcommand;

use crate::{cargo, root, run as run_cmd};

#[derive(Subcommand, Clone, Copy)]
pub(crate) enum Which {
    /// Pack the qwen2.5-0.5b preset (bf16, f32, both) against `cp -r` and the Python reference converter.
    Pack,
    /// Pack and verify a Llama-3-70B-shaped embedding and untied lm_head (128256 x 8192, bf16, 4.2 GB): peak RSS and the same ratios.
    Big,
    /// Verify the packed qwen2.5-0.5b preset with --source against `sha256sum`.
    Verify,
    /// Replay token sessions through gkq-rows against nginx (and a 20 ms proxy), then `wire`.
    Reader,
    /// Cold sessions over TLS (HTTP/2 and HTTP/1.1) behind a 20 ms RTT proxy that counts wire bytes.
    Wire,
    /// A cold node decoding 32 + 32 tokens over TLS behind the 20 ms RTT proxy, columnar against dense embedding.
    Decode,
    /// `--analyze` and `--spectral` times on the qwen2.5-0.5b shapes, and the preset with spectral k_proj against dense.
    Spectral,
    /// A cold node ready at link speed: decode from a package behind a 100 MB/s link with 25 MB/s per response, against the sequential pull, curl --parallel and a local-file decode; warm restarts.
    Coldstart,
}

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

fn build() -> anyhow::Result<()> {
    run_cmd(cargo().args([
        "build",
        "--release",
        "--quiet",
        "-p",
        "gkq-pack",
        "-p",
        "gkq-verify",
        "-p",
        "fixtures",
        "-p",
        "gkq-node",
        "-p",
        "gkq-decode",
    ]))
}

fn sync() {
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

/// Wall time and peak RSS (KiB, from `/usr/bin/time -f %M`) of `program`
/// with `args`, and its stdout.
pub(crate) fn timed_rss(
    program: &Path,
    args: &[&std::ffi::OsStr],
) -> anyhow::Result<(f64, u64, Vec<u8>)> {
    let rss_file = bench_dir().join("rss.txt");
    let (secs, stdout) = timed(
        Command::new("/usr/bin/time")
            .arg("-f")
            .arg("%M")
            .arg("-o")
            .arg(&rss_file)
            .arg(program)
            .args(args),
    )?;
    let kib: u64 = std::fs::read_to_string(&rss_file)?
        .trim()
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .context("peak RSS from /usr/bin/time")?;
    Ok((secs, kib, stdout))
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

/// Median times of `reps` runs: `cp -r`, `cp -r && sync`, and the pack.
struct PackTimes {
    pack: f64,
    cp: f64,
    cp_sync: f64,
    rss: u64,
    out_bytes: u64,
}

fn time_pack(model: &Path, dtypes: &[&str], reps: usize) -> anyhow::Result<PackTimes> {
    let copy = bench_dir().join("cp-copy");
    let out = bench_dir().join(format!("pack-{}", dtypes.join("-")));
    let (mut packs, mut cps, mut cpss, mut rss, mut out_bytes) =
        (Vec::new(), Vec::new(), Vec::new(), 0u64, 0u64);
    for _ in 0..reps {
        let _ = std::fs::remove_dir_all(&copy);
        let (c, _) = timed(Command::new("cp").arg("-r").arg(model).arg(&copy))?;
        cps.push(c);
        let _ = std::fs::remove_dir_all(&copy);
        let (cs, _) = timed(Command::new("sh").arg("-c").arg(format!(
            "cp -r '{}' '{}' && sync",
            model.display(),
            copy.display()
        )))?;
        cpss.push(cs);
        let _ = std::fs::remove_dir_all(&copy);
        let _ = std::fs::remove_dir_all(&out);
        let (p, report) = pack_with(model, &out, dtypes)?;
        packs.push(p);
        rss = rss.max(report["peak_rss_bytes"].as_u64().unwrap_or(0));
        out_bytes = dir_bytes(&out)?;
    }
    Ok(PackTimes {
        pack: median(packs),
        cp: median(cps),
        cp_sync: median(cpss),
        rss,
        out_bytes,
    })
}

/// `scripts/reference_pack.py` on `model` with `dtypes` (median of `reps`),
/// after checking that it writes the same files as gkq-pack did in `ours`.
fn time_reference(model: &Path, dtypes: &[&str], ours: &Path, reps: usize) -> anyhow::Result<f64> {
    let out = bench_dir().join("pack-reference");
    let mut times = Vec::new();
    for _ in 0..reps {
        let _ = std::fs::remove_dir_all(&out);
        let mut cmd = Command::new("python3");
        cmd.arg(root().join("scripts/reference_pack.py"))
            .arg(model)
            .arg(&out)
            .args(["--tool", &format!("gkq-pack {}", env!("CARGO_PKG_VERSION"))]);
        for d in dtypes {
            cmd.args(["--dtype", d]);
        }
        times.push(timed(&mut cmd)?.0);
    }
    for e in std::fs::read_dir(ours)? {
        let name = e?.file_name();
        let same = Command::new("cmp")
            .arg("-s")
            .arg(ours.join(&name))
            .arg(out.join(&name))
            .status()?
            .success();
        if !same {
            bail!("reference_pack.py wrote a different {name:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(median(times))
}

fn bench_pack(reps: usize) -> anyhow::Result<()> {
    let model = model()?;
    let input = dir_bytes(&model)?;
    println!(
        "bench pack: qwen2.5-0.5b preset, {:.1} MB of bf16 safetensors, {reps} runs each, medians",
        input as f64 / 1e6
    );
    println!(
        "gkq-pack syncs its output to disk before the atomic rename; `cp -r` does not, so `cp -r && sync` is shown too. The Python reference is scripts/reference_pack.py (numpy + hashlib, fsync), checked here to write the same files."
    );
    println!(
        "| --dtype | pack s | input MB/s | peak RSS MiB | output MB | cp -r s | cp -r && sync s | pack/(cp+sync) (goal 1.5) | Python reference s | pack/Python (goal 0.2) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for dtypes in [&["bf16"][..], &["f32"], &["f32", "bf16"]] {
        let t = time_pack(&model, dtypes, reps)?;
        let (py, ratio) = if dtypes.len() == 2 {
            let ours = bench_dir().join(format!("pack-{}", dtypes.join("-")));
            let py = time_reference(&model, dtypes, &ours, reps)?;
            (format!("{py:.2}"), format!("{:.2}", t.pack / py))
        } else {
            (String::new(), String::new())
        };
        println!(
            "| {} | {:.2} | {:.0} | {:.0} | {:.1} | {:.2} | {:.2} | {:.2} | {py} | {ratio} |",
            dtypes.join(" + "),
            t.pack,
            input as f64 / 1e6 / t.pack,
            t.rss as f64 / (1 << 20) as f64,
            t.out_bytes as f64 / 1e6,
            t.cp,
            t.cp_sync,
            t.pack / t.cp_sync,
        );
    }
    Ok(())
}

fn bench_verify(reps: usize) -> anyhow::Result<()> {
    let model = model()?;
    let out = bench_dir().join("pack-f32");
    // always repack: a package of an older format would not verify
    pack_once(&model, &out, "f32")?;
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in [&out, &model] {
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            if p.is_file()
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
                && p.extension().is_none_or(|x| x != "json")
            {
                files.push(p);
            }
        }
    }
    files.sort();
    let total: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    // warm the page cache so both sides read from memory
    timed(
        Command::new("cat")
            .args(&files)
            .stdout(std::process::Stdio::null()),
    )?;
    let (mut vs, mut ss) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let (v, stdout) = timed(
            Command::new(release_bin("gkq-verify"))
                .arg(&out)
                .arg("--source")
                .arg(&model)
                .arg("--json"),
        )?;
        let report: serde_json::Value = serde_json::from_slice(&stdout)?;
        if report["passed"] != true {
            bail!("verification failed: {report}");
        }
        vs.push(v);
        let (s, _) = timed(Command::new("sha256sum").args(&files))?;
        ss.push(s);
    }
    let (v, s) = (median(vs), median(ss));
    let rate = openssl_sha256_rate()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let limit = total as f64 / (cores * rate);
    println!(
        "bench verify: packed qwen2.5-0.5b (f32 rows) with --source; {} files (knot, row files, proof objects, source), {:.1} MB; {reps} runs, medians; page cache warm",
        files.len(),
        total as f64 / 1e6
    );
    println!(
        "SHA-256 limit: the bytes ÷ ({cores} cores × `openssl speed -evp sha256` single-core rate {:.0} MB/s, 16 KiB blocks, measured in this run) = {limit:.2} s",
        rate / 1e6
    );
    println!(
        "| gkq-verify s | sha256sum s (same files, one core) | verify/sha256sum | 2-core SHA-256 limit s | verify/limit | target verify/limit |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {v:.2} | {s:.2} | {:.2} | {limit:.2} | {:.2} | <= 1.3 |",
        v / s,
        v / limit
    );
    Ok(())
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

pub(crate) fn run(which: Which, reps: usize) -> anyhow::Result<()> {
    build()?;
    std::fs::create_dir_all(bench_dir())?;
    match which {
        Which::Pack => bench_pack(reps),
        Which::Verify => bench_verify(reps),
        Which::Reader => {
            crate::bench_reader::run()?;
            println!();
            crate::bench_wire::run()
        }
        Which::Wire => crate::bench_wire::run(),
        Which::Decode => crate::bench_decode::run(),
        Which::Spectral => crate::bench_spectral::run(reps),
        Which::Big => crate::bench_big::run(),
        Which::Coldstart => crate::bench_coldstart::run(),
    }
}
