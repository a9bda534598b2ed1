//! `bench llama-cpp`'s cold part (issue 45): a node that starts cold
//! against what a llama.cpp user does today, over `bench coldstart`'s
//! network (nginx TLS + HTTP/2, 25 MB/s per response, a 100 MB/s link, 20
//! ms RTT). gkq-decode from the package URL to its first token, against
//! one-stream `curl` of the GGUF through the same kind of proxy (as
//! llama.cpp's `--model-url` downloader does) followed by llama.cpp to its
//! first token. Interleaved, a fresh proxy and an empty cache each run.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

use super::coldstart::{SLOW, Site, link, site};
use super::common::{bench_dir, median, release_bin};

/// gkq-decode's time to its first token from process start, cold: the
/// package `url` (under the bench directory nginx serves), `ids`, and the
/// flags `more`.
fn gkq(
    site: &Site,
    pkg: &str,
    ids: &str,
    (threads, more): (&str, &[&str]),
) -> anyhow::Result<(f64, u64)> {
    let proxy = link(site, SLOW)?;
    let url = format!("https://127.0.0.1:{}/{pkg}/model.knot", proxy.port());
    let o = Command::new(release_bin("gkq-decode"))
        .arg(&url)
        .arg("--ca-cert")
        .arg(&site.ca.ca)
        .args(["--no-cache", "--prompt-ids", ids, "-n", "1", "-t", threads])
        .args(more)
        .arg("--json")
        .output()?;
    if !o.status.success() {
        bail!("gkq-decode {url}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let ms = v["time_to_first_token_from_start_ms"]
        .as_f64()
        .context("time_to_first_token_from_start_ms")?;
    if std::env::var_os("GKQ_BENCH_VERBOSE").is_some() {
        eprintln!(
            "gkq-decode cold: first token {ms:.0} ms, load {:.0} ms, prefill {:.0} ms ({:.0} waiting)",
            v["load_ms"].as_f64().unwrap_or(0.0),
            v["prefill_ms"].as_f64().unwrap_or(0.0),
            v["prefill_wait_ms"].as_f64().unwrap_or(0.0)
        );
    }
    Ok((ms / 1e3, proxy.stats().total()))
}

/// One-stream curl of the GGUF, then llama.cpp to its first token: the
/// download's seconds and the total.
fn llama(
    site: &Site,
    gguf: &str,
    driver: &Path,
    ids: &str,
    threads: &str,
) -> anyhow::Result<(f64, f64)> {
    let proxy = link(site, SLOW)?;
    let out = bench_dir().join("llama-cold.gguf");
    let _ = std::fs::remove_file(&out);
    let t = Instant::now();
    let st = Command::new("curl")
        .args(["--http2", "--fail", "--no-progress-meter", "--cacert"])
        .arg(&site.ca.ca)
        .arg("-o")
        .arg(&out)
        .arg(format!("https://127.0.0.1:{}/{gguf}", proxy.port()))
        .status()
        .context("running curl (apt-get install curl)")?;
    if !st.success() {
        bail!("curl of {gguf} failed: {st}");
    }
    let download = t.elapsed().as_secs_f64();
    let o = Command::new(driver)
        .arg("-m")
        .arg(&out)
        .args(["-t", threads, "-n", "1", "--ids", ids])
        .output()?;
    if !o.status.success() {
        bail!(
            "llama.cpp on {gguf}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let ms = v["time_to_first_token_from_start_ms"]
        .as_f64()
        .context("time_to_first_token_from_start_ms")?;
    let _ = std::fs::remove_file(&out);
    Ok((download, download + ms / 1e3))
}

/// The cold comparison of `name`: `pkg` and `gguf` under the bench
/// directory, `rounds` interleaved rounds.
pub(super) fn cold(
    name: &str,
    (pkg, gguf): (&Path, &Path),
    driver: &Path,
    ids: &str,
    (rounds, threads): (usize, &str),
) -> anyhow::Result<()> {
    let rel = |p: &Path| -> anyhow::Result<String> {
        Ok(p.strip_prefix(bench_dir())
            .context("under the bench directory")?
            .to_str()
            .context("utf8")?
            .to_owned())
    };
    let (pkg, gguf) = (rel(pkg)?, rel(gguf)?);
    let site = site(SLOW)?;
    let (mut ours, mut theirs, mut downloads, mut wire) = (vec![], vec![], vec![], 0);
    // the prompt once every weight is in, as llama.cpp runs it
    let mut first = vec![];
    for _ in 0..rounds {
        let (t, w) = gkq(&site, &pkg, ids, (threads, &[]))?;
        first.push(gkq(&site, &pkg, ids, (threads, &["--load-first"]))?.0);
        let (d, l) = llama(&site, &gguf, driver, ids, threads)?;
        ours.push(t);
        theirs.push(l);
        downloads.push(d);
        wire = w;
    }
    let (o, l) = (median(ours), median(theirs));
    println!(
        "\n{name}, cold over TLS + HTTP/2 (25 MB/s per response, 100 MB/s link, 20 ms RTT), {} prompt ids, {threads} threads, medians of {rounds} interleaved rounds:",
        ids.split(',').count()
    );
    println!("| | time to first token from process start | bytes on the wire |");
    println!("|---|---:|---:|");
    println!("| gkq-decode from the package URL, no cache | {o:.2} s | {wire} |");
    let f = median(first);
    println!("| the same with --load-first (the prompt after the load) | {f:.2} s | |");
    println!(
        "| curl of the GGUF (one stream, {:.2} s) + llama.cpp | {l:.2} s | {} |",
        median(downloads),
        std::fs::metadata(bench_dir().join(&gguf))?.len()
    );
    println!(
        "| ratio (issue 53: ≤ 0.30 on SmolLM2 and the 0.5B) | {:.2}× | |",
        o / l
    );
    Ok(())
}
