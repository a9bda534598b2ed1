//! `cargo xtask bench coldstart` (issue 20): how soon a cold node can
//! answer. The qwen2.5-0.5b preset packed `--dtype bf16` and `--dtype f32
//! --dtype bf16`, served by nginx over TLS + HTTP/2 with `limit_rate` per
//! response (an object store's per-GET cap), behind a proxy that imitates
//! the node's link: 10 ms each way and one shared downlink (a token-bucket
//! of the link rate over every connection), counting every byte.
//!
//! Each run is a fresh `gkq-decode` process (32 prompt ids, 4 new tokens)
//! under `/usr/bin/time`; the time to first token is from process start.
//! In the same run, as references: the sequential pull (`--max-parallel 1
//! --connections 1`), `curl --parallel` fetching the same byte ranges (the
//! anchor), and a decode of the local files (the compute floor). Then the
//! warm restarts, with and without `--knot-id`.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fixtures::servers::{Link, Nginx, NginxOptions, TestCa, WireProxy, WireStats};
use serde_json::Value;

use super::common::{bench_dir, model, pack_with, release_bin, timed_rss};

const PROMPT_TOKENS: u32 = 32;
const NEW_TOKENS: &str = "4";
const LAYERS: usize = 24;
const SPLIT: usize = 12;
const PART: u64 = 8 << 20;

/// A link and the object store's per-response cap.
#[derive(Clone, Copy)]
pub(super) struct Net {
    per_response: &'static str,
    pub(super) link: u64,
}

pub(super) const SLOW: Net = Net {
    per_response: "25m",
    link: 100_000_000,
};
const FAST: Net = Net {
    per_response: "100m",
    link: 400_000_000,
};

/// One measured process.
pub(super) struct Measured {
    pub(super) wall: f64,
    pub(super) rss_mib: f64,
    pub(super) json: Value,
    pub(super) wire: WireStats,
}

impl Measured {
    pub(super) fn ttft_s(&self) -> f64 {
        self.json["time_to_first_token_from_start_ms"]
            .as_f64()
            .unwrap_or(self.wall * 1e3)
            / 1e3
    }
    fn load_s(&self) -> f64 {
        self.json["load_ms"].as_f64().unwrap_or(0.0) / 1e3
    }
}

/// 32 prompt ids spread over the vocabulary (below 32,000, so that the
/// Llama-shaped preset of `bench quant` takes them too).
pub(super) fn prompt() -> String {
    (0..PROMPT_TOKENS)
        .map(|i| ((i * 4_729 + 17) % 32_000).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs `gkq-decode` on `knot` with `args`, under `/usr/bin/time`.
pub(super) fn decode(
    knot: &str,
    args: &[&str],
    wire: impl Fn() -> WireStats,
) -> anyhow::Result<Measured> {
    let mut all: Vec<&OsStr> = vec![OsStr::new(knot)];
    all.extend(args.iter().map(OsStr::new));
    let (wall, kib, stdout) = timed_rss(&release_bin("gkq-decode"), &all)?;
    let json: Value = if stdout.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&stdout).context("gkq-decode --json")?
    };
    Ok(Measured {
        wall,
        rss_mib: kib as f64 / 1024.0,
        json,
        wire: wire(),
    })
}

/// The servers: nginx over TLS + h2 with `limit_rate`, and the test CA.
pub(super) struct Site {
    pub(super) ca: TestCa,
    pub(super) nginx: Nginx,
}

pub(super) fn site(net: Net) -> anyhow::Result<Site> {
    let ca = TestCa::generate(&bench_dir().join("tls-ca"))?;
    let nginx = Nginx::start(
        &bench_dir(),
        &bench_dir().join(format!("nginx-coldstart-{}", net.per_response)),
        &NginxOptions {
            tls: Some(ca.server.clone()),
            http2: true,
            extra: format!("limit_rate {};", net.per_response),
            ..NginxOptions::default()
        },
    )?;
    Ok(Site { ca, nginx })
}

/// A fresh proxy in front of the site's nginx: a node's link of `net`
/// (20 ms RTT).
pub(super) fn link(site: &Site, net: Net) -> anyhow::Result<WireProxy> {
    Ok(WireProxy::start_link(
        site.nginx.port(),
        Link {
            one_way: Duration::from_millis(10),
            down_rate: Some(net.link),
        },
    )?)
}

/// A remote decode of `pack` through a fresh proxy with `extra` flags.
pub(super) fn remote(
    site: &Site,
    net: Net,
    pack: &str,
    extra: &[&str],
) -> anyhow::Result<Measured> {
    let proxy = link(site, net)?;
    let base = format!("https://127.0.0.1:{}/{pack}", proxy.port());
    let ca = site.ca.ca.display().to_string();
    let columnar = format!("{base}/");
    let prompt = prompt();
    let mut args = vec![
        "--ca-cert",
        &ca,
        "--columnar-embed",
        &columnar,
        "--require-columnar",
        "--max-new-tokens",
        NEW_TOKENS,
        "--json",
    ];
    if !extra.contains(&"--hidden-in") {
        args.extend(["--prompt-ids", &prompt]);
    }
    args.extend(extra);
    decode(&format!("{base}/model.knot"), &args, || proxy.stats())
}

/// A decode of the local files (the compute floor).
fn local(pack: &str, extra: &[&str]) -> anyhow::Result<Measured> {
    let knot = bench_dir().join(pack).join("model.knot");
    let prompt = prompt();
    let mut args = vec!["--no-cache", "--max-new-tokens", NEW_TOKENS, "--json"];
    if !extra.contains(&"--hidden-in") {
        args.extend(["--prompt-ids", &prompt]);
    }
    args.extend(extra);
    decode(&knot.display().to_string(), &args, WireStats::default)
}

/// The byte ranges a whole-model cold node pulls in bulk: every layer
/// block, the final norm and the lm_head's source (the narrowest exact
/// row file when there is one, else its block), as `(object, start, end)`
/// parts of [`PART`] bytes.
fn bulk_ranges(pack: &Path) -> anyhow::Result<Vec<(String, u64, u64)>> {
    let bytes = std::fs::read(pack.join("model.knot"))?;
    let knot = gkq_format::Knot::parse(&bytes)?;
    let h = knot.header().header();
    let mut out = Vec::new();
    let mut push = |object: &str, start: u64, len: u64| {
        let mut off = 0;
        while off < len {
            let n = PART.min(len - off);
            out.push((object.to_owned(), start + off, start + off + n - 1));
            off += n;
        }
    };
    for (i, b) in h.blocks.iter().enumerate() {
        if (b.name.starts_with("model.layers.") || b.name == "model.norm.weight")
            && let Some(p) = knot.header().payload_of(i)
        {
            push("model.knot", p.offset, p.len);
        }
    }
    let lm = h.block_index(
        h.meta_str(gkq_format::keys::ROLE_LM_HEAD)
            .context("lm_head")?,
    );
    let lm = lm.context("lm_head block")?;
    let data = h.resolve(lm).context("lm_head data")?;
    let row = data.dtype.row_bytes(data.shape[1]).unwrap_or(0);
    let narrow = data
        .columnar
        .iter()
        .filter(|d| d.is_block_exact() && d.row_bytes < row)
        .min_by_key(|d| d.row_bytes);
    match narrow {
        Some(d) => push(&d.object, 0, d.byte_len),
        None => match knot.header().home_of(lm) {
            // stored in its row file (FORMAT.md 7e): that file whole
            Some((_, home)) => push(&home.object, 0, home.byte_len),
            None => {
                let p = knot.header().payload_of(lm).context("payload")?;
                push("model.knot", p.offset, p.len);
            }
        },
    }
    Ok(out)
}

/// `curl --parallel` (16 at a time, HTTP/2) over the same ranges, through a
/// fresh proxy: seconds and wire bytes.
fn curl_anchor(site: &Site, net: Net, pack: &str) -> anyhow::Result<(f64, WireStats)> {
    let proxy = link(site, net)?;
    let cfg = bench_dir().join("curl-ranges.cfg");
    // one transfer per block of options, `next` between them: curl's
    // per-transfer options (range, output, the CA) do not carry over
    let ca = site.ca.ca.display();
    let blocks: Vec<String> = bulk_ranges(&bench_dir().join(pack))?
        .into_iter()
        .map(|(object, a, b)| {
            format!(
                "http2\ncacert = \"{ca}\"\nfail\nurl = \"https://127.0.0.1:{}/{pack}/{object}\"\nrange = \"{a}-{b}\"\noutput = \"/dev/null\"\n",
                proxy.port()
            )
        })
        .collect();
    // `next` between transfers, not after the last (an empty one fails)
    std::fs::write(&cfg, blocks.join("next\n"))?;
    let t = Instant::now();
    let st = Command::new("curl")
        .args(["--parallel", "--parallel-max", "16", "--no-progress-meter"])
        .arg("-K")
        .arg(&cfg)
        .status()
        .context("running curl (apt-get install curl)")?;
    if !st.success() {
        bail!("curl --parallel failed: {st}");
    }
    Ok((t.elapsed().as_secs_f64(), proxy.stats()))
}

fn mb(b: u64) -> String {
    format!("{:.1}", b as f64 / 1e6)
}

fn node_bytes(m: &Measured, k: &str) -> u64 {
    m.json["bytes"][k].as_u64().unwrap_or(0)
}

/// One row of the table.
fn row(label: &str, m: &Measured, net: Net, floor: f64) {
    let wire = m.wire.total();
    let link = wire as f64 / net.link as f64;
    let target = 1.25 * link + floor;
    println!(
        "| {label} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.0} |",
        mb(wire),
        mb(node_bytes(m, "lm_head")),
        m.wire.connections,
        link,
        m.load_s(),
        m.ttft_s(),
        m.ttft_s() / (link + floor).max(1e-9),
        target,
        if m.ttft_s() <= target {
            "met"
        } else {
            "missed"
        },
        m.rss_mib
    );
}

fn header() {
    println!(
        "| run | wire MB (proxy) | lm_head MB | connections | link-limit s | load s | TTFT s (from process start) | TTFT / (link + floor) | target s (1.25 × link + floor) | met | peak RSS MiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|");
}

fn pipeline_args(hidden: &Path) -> [Vec<String>; 2] {
    let h = hidden.display().to_string();
    [
        vec![
            "--roles".into(),
            "input".into(),
            "--layers".into(),
            format!("0..{SPLIT}"),
            "--hidden-out".into(),
            h.clone(),
        ],
        vec![
            "--roles".into(),
            "output".into(),
            "--layers".into(),
            format!("{SPLIT}..{LAYERS}"),
            "--hidden-in".into(),
            h,
        ],
    ]
}

/// The whole model, cold and warm, the references, and each stage alone.
fn package(site: &Site, net: Net, pack: &str) -> anyhow::Result<()> {
    let floor_run = local(pack, &[])?;
    let floor = floor_run.ttft_s();
    let cache = bench_dir().join(format!("coldstart-cache-{pack}"));
    let _ = std::fs::remove_dir_all(&cache);
    let c = cache.display().to_string();
    let cold = remote(site, net, pack, &["--cache-dir", &c])?;
    let id = cold.json["knot_id"].as_str().map(str::to_owned);
    header();
    row(
        "whole model, cold (defaults: 16 parts of 8 MiB, 4 connections)",
        &cold,
        net,
        floor,
    );
    let one = remote(site, net, pack, &["--no-cache", "--connections", "1"])?;
    row("whole model, cold, 1 connection", &one, net, floor);
    let seq = remote(
        site,
        net,
        pack,
        &["--no-cache", "--max-parallel", "1", "--connections", "1"],
    )?;
    row(
        "whole model, cold, sequential (--max-parallel 1)",
        &seq,
        net,
        floor,
    );
    let warm = remote(site, net, pack, &["--cache-dir", &c])?;
    row("whole model, warm restart", &warm, net, floor);
    let mut pinned_args = vec!["--cache-dir", c.as_str()];
    if let Some(id) = &id {
        pinned_args.extend(["--knot-id", id.as_str()]);
    }
    let pinned = remote(site, net, pack, &pinned_args)?;
    row("whole model, warm restart, --knot-id", &pinned, net, floor);
    let (curl_s, curl_wire) = curl_anchor(site, net, pack)?;
    println!(
        "| curl --parallel, the same bulk ranges (anchor) | {} | | {} | {:.2} | {curl_s:.2} | | | | | |",
        mb(curl_wire.total()),
        curl_wire.connections,
        curl_wire.total() as f64 / net.link as f64
    );
    println!(
        "| local files (compute floor) | 0 | | 0 | 0 | {:.2} | {floor:.2} | | | | {:.0} |",
        floor_run.load_s(),
        floor_run.rss_mib
    );
    stages(site, net, pack)?;
    println!();
    println!(
        "{pack}: cold TTFT {:.2} s against target {:.2} s; warm restart {} B on the wire (target <= 131072), TTFT {:.2} s = {:.2} × the local {floor:.2} s (target 1.2); pinned {} B; the sequential pull {:.2} s = {:.2} × the parallel one; curl --parallel moves the same bulk in {curl_s:.2} s",
        cold.ttft_s(),
        1.25 * cold.wire.total() as f64 / net.link as f64 + floor,
        warm.wire.total(),
        warm.ttft_s(),
        warm.ttft_s() / floor,
        pinned.wire.total(),
        seq.ttft_s(),
        seq.ttft_s() / cold.ttft_s(),
    );
    Ok(())
}

/// Each pipeline stage alone (cold), against its own local-file floor.
fn stages(site: &Site, net: Net, pack: &str) -> anyhow::Result<()> {
    let hidden = bench_dir().join("coldstart-hidden.f32");
    for (i, args) in pipeline_args(&hidden).iter().enumerate() {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let floor = local(pack, &args)?;
        let mut cold_args = vec!["--no-cache"];
        cold_args.extend(&args);
        let cold = remote(site, net, pack, &cold_args)?;
        let label = if i == 0 {
            format!("input stage (rows, layers 0..{SPLIT}), cold")
        } else {
            format!("output stage (layers {SPLIT}..{LAYERS}, lm_head), cold")
        };
        // a stage's answer is the process end: its time is the wall time
        let cold = Measured {
            json: serde_json::json!({"bytes": cold.json["bytes"], "time_to_first_token_from_start_ms": cold.wall * 1e3}),
            ..cold
        };
        row(&label, &cold, net, floor.wall);
    }
    Ok(())
}

pub(crate) fn run() -> anyhow::Result<()> {
    if !Path::new("/usr/bin/time").exists() {
        bail!("bench coldstart needs /usr/bin/time (apt-get install time) for peak RSS");
    }
    let model = model()?;
    pack_with(&model, &bench_dir().join("pack-bf16"), &["bf16"])?;
    super::common::packed()?;
    let packs: [(&str, &str); 2] = [
        (
            "pack-bf16",
            "--dtype bf16 (tied lm_head = the bf16 embedding block)",
        ),
        (
            super::common::PACK,
            "--dtype f32 --dtype bf16 (f32 blocks; the exact bf16 rows serve the lm_head)",
        ),
    ];
    for net in [SLOW, FAST] {
        let site = site(net)?;
        println!(
            "bench coldstart: qwen2.5-0.5b preset (24 layers, vocab 151,936, tied); nginx TLS + HTTP/2 with limit_rate {} per response; a proxy with 20 ms RTT and a {} MB/s link shared by every connection; gkq-decode, {PROMPT_TOKENS} prompt ids, {NEW_TOKENS} new tokens, f32 compute on this machine's cores",
            net.per_response,
            net.link / 1_000_000
        );
        for (pack, what) in packs {
            println!();
            println!("package {pack}: {what}");
            println!();
            package(&site, net, pack)?;
        }
        println!();
    }
    let _ = std::fs::remove_file(bench_dir().join("curl-ranges.cfg"));
    Ok(())
}
