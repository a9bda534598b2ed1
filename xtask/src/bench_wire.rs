//! `cargo xtask bench wire` (also the last part of `bench reader`): what a
//! cold node pays on the wire. The qwen2.5-0.5b preset packed with bf16
//! rows, served by nginx over TLS (HTTP/2, then HTTP/1.1 only), behind a
//! TCP proxy that delays each direction by 10 ms (20 ms RTT, handshakes
//! included) and counts every byte both ways and every connection. One
//! fresh `gkq-rows` process per workload, timed from spawn to exit.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fixtures::servers::{Nginx, NginxOptions, TestCa, WireProxy};
use serde_json::Value;

use crate::bench::{bench_dir, model, pack_once, release_bin};

const ROW: u64 = 896 * 2;
const RTT_MS: f64 = 20.0;

pub(crate) fn run() -> anyhow::Result<()> {
    let model = model()?;
    let out = bench_dir().join("pack-bf16");
    if !out.join("model.knot").exists() {
        pack_once(&model, &out, "bf16")?;
    }
    let knot = std::fs::read(out.join("model.knot")).context("packed knot")?;
    let header = gkq_format::Knot::parse(&knot)?.header().header_end();
    let ca = TestCa::generate(&bench_dir().join("tls-ca"))?;
    let sessions = fixtures::sessions::dir();
    println!(
        "bench wire: qwen2.5-0.5b preset, bf16 rows ({ROW} B/row), nginx over TLS on 127.0.0.1, behind a proxy adding 10 ms each way (20 ms RTT; TCP and TLS handshakes pay it too); one cold gkq-rows process per workload; knot header {header} B"
    );
    println!(
        "wire = bytes both ways at the proxy (TLS, HTTP framing and headers, the knot header, the HEADs); target = 1.15 x distinct x {ROW} + {header} + 65536"
    );
    println!();
    println!(
        "| transport | workload | distinct rows | row payload B | wire B | wire / payload | target B | met | connections | requests | wall ms | RTTs |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|");
    for (label, http2) in [("TLS + HTTP/2", true), ("TLS + HTTP/1.1", false)] {
        let nginx = Nginx::start(
            &bench_dir(),
            &bench_dir().join(if http2 {
                "nginx-wire-h2"
            } else {
                "nginx-wire-h1"
            }),
            &NginxOptions {
                tls: Some(ca.server.clone()),
                http2,
                ..NginxOptions::default()
            },
        )?;
        for (name, _) in fixtures::sessions::WORKLOADS {
            let proxy = WireProxy::start(nginx.port(), Duration::from_millis(10))?;
            let base = format!("https://127.0.0.1:{}/pack-bf16", proxy.port());
            let t = Instant::now();
            let o = Command::new(release_bin("gkq-rows"))
                .arg(format!("{base}/model.knot"))
                .arg("--ca-cert")
                .arg(&ca.ca)
                .arg("--columnar-embed")
                .arg(format!("{base}/token_embd.bf16.rows"))
                .arg("--sessions-file")
                .arg(sessions.join(format!("{name}.jsonl")))
                .arg("--json")
                .output()
                .context("running gkq-rows")?;
            let wall = t.elapsed().as_secs_f64() * 1e3;
            if !o.status.success() {
                bail!("gkq-rows failed: {}", String::from_utf8_lossy(&o.stderr));
            }
            let v: Value = serde_json::from_slice(&o.stdout)?;
            if v["resolution"]["path"] != "columnar" {
                bail!("not on the columnar path: {}", v["resolution"]);
            }
            let distinct = v["distinct_rows"].as_u64().unwrap_or(0);
            let payload = v["payload_bytes"].as_u64().unwrap_or(0);
            let requests =
                v["requests"].as_u64().unwrap_or(0) + v["open"]["requests"].as_u64().unwrap_or(0);
            let wire = proxy.stats();
            let target = (1.15 * (distinct * ROW) as f64) as u64 + header + 65536;
            println!(
                "| {label} | {name} | {distinct} | {payload} | {} | {:.3} | {target} | {} | {} | {requests} | {wall:.1} | {:.1} |",
                wire.total(),
                wire.total() as f64 / payload.max(1) as f64,
                if wire.total() <= target { "yes" } else { "no" },
                wire.connections,
                wall / RTT_MS
            );
        }
    }
    Ok(())
}
