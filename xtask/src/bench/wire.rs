//! `cargo xtask bench wire` (also the last part of `bench reader`): what a
//! cold node pays on the wire. The qwen2.5-0.5b preset packed with f32 and
//! bf16 rows (the reader, given the base URL, picks the exact bf16 rows and
//! verifies each with its Merkle proof), served by nginx over TLS (HTTP/2, then HTTP/1.1 only), behind a
//! TCP proxy that delays each direction by 10 ms (20 ms RTT, handshakes
//! included) and counts every byte both ways and every connection. One
//! fresh `gkq-rows` process per workload, timed from spawn to exit.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fixtures::servers::{Nginx, NginxOptions, TestCa, WireProxy};
use serde_json::Value;

use super::common::PACK;
use super::common::{bench_dir, release_bin};

const ROW: u64 = 896 * 2;
const RTT_MS: f64 = 20.0;

pub(crate) fn run() -> anyhow::Result<()> {
    super::common::packed()?;
    let out = bench_dir().join(PACK);
    let knot = std::fs::read(out.join("model.knot")).context("packed knot")?;
    let parsed = gkq_format::Knot::parse(&knot)?;
    let header = parsed.header().header_end();
    // the chunk table of the bf16 proof object: fetched once per node
    let table = parsed
        .blocks()
        .iter()
        .flat_map(|b| &b.columnar)
        .find(|d| d.object == "token_embd.bf16.rows")
        .and_then(gkq_format::merkle::layout_of)
        .map_or(0, |l| l.table_len());
    let ca = TestCa::generate(&bench_dir().join("tls-ca"))?;

    println!(
        "bench wire: qwen2.5-0.5b preset (bf16 source) packed with f32 and bf16 rows; the base URL resolves to the bf16 rows ({ROW} B/row) with Merkle proofs; nginx over TLS on 127.0.0.1, behind a proxy adding 10 ms each way (20 ms RTT; TCP and TLS handshakes pay it too); one cold gkq-rows process per workload; knot header {header} B"
    );
    println!(
        "wire = bytes both ways at the proxy (TLS, HTTP framing and headers, the knot header, the HEADs, the proofs); target = 1.15 x distinct x {ROW} + {header} + 65536 (set before row proofs existed); 500 KB = 512,000 B, the proposal's cold-session budget for embedding bytes"
    );
    println!();
    println!(
        "| transport | workload | distinct rows | row payload B | path records B | records / rows | chunk table B (once per node) | header B (knot GET) | embedding bytes (rows + records + table) | wire B | wire / rows | target B | met | connections | requests | wall ms | RTTs |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|");
    let mut verdict = String::new();
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
            let line = Setup {
                label,
                http2,
                header,
                table,
                ca: &ca,
            };
            if let Some(v) = line.workload(&nginx, name)? {
                verdict = v;
            }
        }
    }
    println!();
    println!("{verdict}");
    Ok(())
}

/// One transport's settings for the table.
struct Setup<'a> {
    label: &'static str,
    http2: bool,
    header: u64,
    table: u64,
    ca: &'a TestCa,
}

impl Setup<'_> {
    /// One cold gkq-rows process for workload `name` behind a fresh proxy:
    /// prints its row; returns the verdict line for long_context over h2.
    fn workload(&self, nginx: &Nginx, name: &str) -> anyhow::Result<Option<String>> {
        let proxy = WireProxy::start(nginx.port(), Duration::from_millis(10))?;
        let base = format!("https://127.0.0.1:{}/{PACK}", proxy.port());
        let t = Instant::now();
        let o = Command::new(release_bin("gkq-rows"))
            .arg(format!("{base}/model.knot"))
            .arg("--ca-cert")
            .arg(&self.ca.ca)
            .arg("--columnar-embed")
            .arg(format!("{base}/"))
            .arg("--sessions-file")
            .arg(fixtures::sessions::dir().join(format!("{name}.jsonl")))
            .arg("--json")
            .output()
            .context("running gkq-rows")?;
        let wall = t.elapsed().as_secs_f64() * 1e3;
        if !o.status.success() {
            bail!("gkq-rows failed: {}", String::from_utf8_lossy(&o.stderr));
        }
        let v: Value = serde_json::from_slice(&o.stdout)?;
        if v["resolution"]["path"] != "columnar"
            || !v["resolution"]["reason"]
                .as_str()
                .unwrap_or("")
                .contains("token_embd.bf16.rows")
        {
            bail!("not on the columnar path: {}", v["resolution"]);
        }
        let distinct = v["distinct_rows"].as_u64().unwrap_or(0);
        let proof = v["proof_bytes"].as_u64().unwrap_or(0);
        let payload = v["payload_bytes"].as_u64().unwrap_or(0) - proof;
        let head = v["open"]["payload_bytes"].as_u64().unwrap_or(0);
        let requests =
            v["requests"].as_u64().unwrap_or(0) + v["open"]["requests"].as_u64().unwrap_or(0);
        let wire = proxy.stats();
        let mut verdict = None;
        if self.http2 && name == "long_context" {
            let emb = payload + proof;
            let table = self.table;
            verdict = Some(format!(
                "long_context, cold node, TLS + HTTP/2: embedding bytes {emb} B (rows {payload} + path records {} ({:.1} % of the rows; budget 12 %) + chunk table {table}) against the proposal's 500 KB (512,000 B): {}; rows alone: {}; with the knot header GET ({head} B): {} B; on the wire, everything: {} B",
                proof - table,
                (proof - table) as f64 / payload.max(1) as f64 * 100.0,
                if emb < 512_000 { "met" } else { "missed" },
                if payload < 512_000 { "met" } else { "missed" },
                emb + head,
                wire.total()
            ));
        }
        let (header, table, label) = (self.header, self.table, self.label);
        let target = (1.15 * (distinct * ROW) as f64) as u64 + header + 65536;
        println!(
            "| {label} | {name} | {distinct} | {payload} | {} | {:.1}% | {table} | {head} | {} | {} | {:.3} | {target} | {} | {} | {requests} | {wall:.1} | {:.1} |",
            proof - table,
            (proof - table) as f64 / payload.max(1) as f64 * 100.0,
            payload + proof,
            wire.total(),
            wire.total() as f64 / payload.max(1) as f64,
            if wire.total() <= target { "yes" } else { "no" },
            wire.connections,
            wall / RTT_MS
        );
        Ok(verdict)
    }
}
