//! `cargo xtask bench wire`: what a cold node pays on the wire. The
//! qwen2.5-0.5b preset packed with f32 and bf16 rows three times: stored
//! once with the records inline (FORMAT.md 7e, the default: one range per
//! run of rows and their records), with the blocks in the knot too and a
//! runs object (`--knot-holds-blocks`, 7b: the same ranges from another
//! object) and with `--no-runs` (rows and records from two objects: the
//! path before issue 23), served by nginx over TLS (HTTP/2, then HTTP/1.1 only), behind
//! a TCP proxy that delays each direction by 10 ms (20 ms RTT, handshakes
//! included) and counts every byte both ways and every connection. One
//! fresh `gkq-rows` process per workload and package, timed from spawn to
//! exit; the reader, given the base URL, picks the exact bf16 rows.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fixtures::servers::{Nginx, NginxOptions, TestCa, WireProxy};
use serde_json::Value;

use super::common::{PACK, bench_dir, model, pack_args, release_bin};

const ROW: u64 = 896 * 2;
const RTT_MS: f64 = 20.0;
/// The same package without runs objects.
const NO_RUNS: &str = "pack-f32-bf16-noruns";
/// The same package with its blocks in the knot too and a runs object.
const IN_KNOT: &str = "pack-f32-bf16-inknot";
/// The packages compared: (label, directory, flags beyond the dtypes).
const PACKAGES: [(&str, &str, &[&str]); 3] = [
    ("one copy, records inline", PACK, &[]),
    (
        "runs object (--knot-holds-blocks)",
        IN_KNOT,
        &["--knot-holds-blocks"],
    ),
    ("rows + proof (before)", NO_RUNS, &["--no-runs"]),
];

/// The runs the reader fetches for `ids`: distinct rows, sorted, merged
/// when at most one row lies between them, at most 1,024 rows a run (the
/// reader's defaults, README "Rows").
fn runs_of(ids: &[u64]) -> u64 {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    let (mut runs, mut start, mut last) = (0u64, None::<u64>, 0u64);
    for id in v {
        match start {
            Some(s) if id <= last + 2 && id - s < 1024 => last = id,
            _ => {
                runs += 1;
                start = Some(id);
                last = id;
            }
        }
    }
    runs
}

/// The runs of a workload file (one JSON array of ids per line), as
/// `gkq-rows --sessions-file` fetches them: one warm backend, so a session
/// fetches only the rows no earlier session did.
fn workload_runs(name: &str) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(fixtures::sessions::dir().join(format!("{name}.jsonl")))?;
    let mut seen = std::collections::HashSet::new();
    let mut runs = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let ids: Vec<u64> = serde_json::from_str(line)?;
        let fresh: Vec<u64> = ids.into_iter().filter(|i| seen.insert(*i)).collect();
        runs += runs_of(&fresh);
    }
    Ok(runs)
}

/// One transport's settings for the table.
struct Setup<'a> {
    label: &'static str,
    http2: bool,
    header: u64,
    table: u64,
    ca: &'a TestCa,
}

/// What one cold session cost.
struct Session {
    v: Value,
    wire: u64,
    connections: u64,
    wall: f64,
}

impl Setup<'_> {
    fn session(&self, nginx: &Nginx, pack: &str, name: &str) -> anyhow::Result<Session> {
        self.session_with(nginx, pack, name, &["--no-cache"])
    }

    /// A session with `extra` flags (the cache, a trust key).
    fn session_with(
        &self,
        nginx: &Nginx,
        pack: &str,
        name: &str,
        extra: &[&str],
    ) -> anyhow::Result<Session> {
        let proxy = WireProxy::start(nginx.port(), Duration::from_millis(10))?;
        let base = format!("https://127.0.0.1:{}/{pack}", proxy.port());
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
            .args(extra)
            .output()
            .context("running gkq-rows")?;
        let wall = t.elapsed().as_secs_f64() * 1e3;
        if !o.status.success() {
            bail!("gkq-rows failed: {}", String::from_utf8_lossy(&o.stderr));
        }
        let v: Value = serde_json::from_slice(&o.stdout)?;
        let reason = v["resolution"]["reason"].as_str().unwrap_or("");
        if v["resolution"]["path"] != "columnar" || !reason.contains("token_embd.bf16.rows") {
            bail!("not on the columnar path: {}", v["resolution"]);
        }
        let st = proxy.stats();
        Ok(Session {
            v,
            wire: st.total(),
            connections: st.connections,
            wall,
        })
    }

    /// Prints one row; returns (requests, wire, RTTs) for the verdict.
    fn row(&self, variant: &str, name: &str, s: &Session) -> anyhow::Result<(u64, u64, f64)> {
        let u = |k: &str| s.v[k].as_u64().unwrap_or(0);
        let proof = u("proof_bytes");
        let rows = u("payload_bytes") - proof;
        let records = proof.saturating_sub(self.table);
        let requests = u("requests") + s.v["open"]["requests"].as_u64().unwrap_or(0);
        let runs = workload_runs(name)?;
        let target_bytes =
            (1.15 * (rows + records) as f64) as u64 + self.table + self.header + 65536;
        let rtts = s.wall / RTT_MS;
        let yes = |b: bool| if b { "yes" } else { "no" };
        println!(
            "| {} | {variant} | {name} | {} | {runs} | {requests} | {} | {} | {rows} | {records} | {} | {} | {} | {target_bytes} | {} | {} | {:.1} | {rtts:.1} |",
            self.label,
            u("distinct_rows"),
            runs + 3,
            yes(requests <= runs + 3),
            self.table,
            self.header,
            s.wire,
            yes(s.wire <= target_bytes),
            s.connections,
            s.wall,
        );
        Ok((requests, s.wire, rtts))
    }
}

pub(crate) fn run() -> anyhow::Result<()> {
    let m = model()?;
    for (_, dir, flags) in PACKAGES {
        let args = [&["--dtype", "f32", "--dtype", "bf16"][..], flags].concat();
        pack_args(&m, &bench_dir().join(dir), &args)?;
    }
    let knot = std::fs::read(bench_dir().join(PACK).join("model.knot")).context("packed knot")?;
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
        "bench wire: qwen2.5-0.5b preset (bf16 source) packed with f32 and bf16 rows three ways: one copy with the records inline (the default, FORMAT.md 7e), the blocks in the knot too with a runs object (`--knot-holds-blocks`), and neither (`--no-runs`, the path before issue 23); the base URL resolves to the bf16 rows ({ROW} B/row) with Merkle proofs; nginx over TLS on 127.0.0.1, behind a proxy adding 10 ms each way (20 ms RTT; TCP and TLS handshakes pay it too); one cold gkq-rows process per workload and package, no disk cache; knot header {header} B"
    );
    println!(
        "runs: the runs of rows the workload needs (distinct rows, merged across gaps of one row); requests: every request of the process, the knot's included (target: runs + 3: knot, chunk table, resolution); wire: bytes both ways at the proxy (TLS, HTTP framing and headers, everything); wire target: 1.15 × (rows + records) + chunk table + header + 64 KiB"
    );
    println!();
    println!(
        "| transport | package | workload | distinct rows | runs | requests | target | met | row payload B | records B | chunk table B | header B | wire B | wire target B | met | connections | wall ms | RTTs |"
    );
    println!(
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"
    );
    let mut verdict = Vec::new();
    for (label, http2) in [("TLS + HTTP/2", true), ("TLS + HTTP/1.1", false)] {
        let dir = if http2 {
            "nginx-wire-h2"
        } else {
            "nginx-wire-h1"
        };
        let opts = NginxOptions {
            tls: Some(ca.server.clone()),
            http2,
            ..NginxOptions::default()
        };
        let nginx = Nginx::start(&bench_dir(), &bench_dir().join(dir), &opts)?;
        let setup = Setup {
            label,
            http2,
            header,
            table,
            ca: &ca,
        };
        for (name, _) in fixtures::sessions::WORKLOADS {
            for (variant, pack, _) in PACKAGES {
                let s = setup.session(&nginx, pack, name)?;
                let (requests, wire, rtts) = setup.row(variant, name, &s)?;
                if setup.http2 && name == "long_context" {
                    verdict.push(format!(
                        "{variant}: {requests} requests, {wire} B on the wire, {rtts:.1} RTT"
                    ));
                }
            }
        }
    }
    println!();
    println!(
        "long_context, TLS + HTTP/2 (target ≤ 9.5 RTT): {}",
        verdict.join("; ")
    );
    signed(&ca, header, table)
}

/// Signs the default (one-copy) package with a throwaway key made here, as a
/// publisher would make one: (the public key's file, the key).
fn sign_bench_package() -> anyhow::Result<(std::path::PathBuf, gkq_format::sig::PublicKey)> {
    let dir = bench_dir().join(PACK);
    let key = bench_dir().join("bench-signing-key.pem");
    let public = bench_dir().join("bench-signing-key.pub.pem");
    let sec1 = bench_dir().join("bench-signing-key.sec1.pem");
    let openssl = |args: &[&str], files: &[&std::path::Path]| {
        crate::common::run_cmd(Command::new("openssl").args(args).args(files))
    };
    openssl(
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
        ],
        &[&sec1],
    )?;
    crate::common::run_cmd(
        Command::new("openssl")
            .args(["pkcs8", "-topk8", "-nocrypt", "-in"])
            .arg(&sec1)
            .arg("-out")
            .arg(&key),
    )?;
    crate::common::run_cmd(
        Command::new("openssl")
            .args(["ec", "-pubout", "-in"])
            .arg(&sec1)
            .arg("-out")
            .arg(&public),
    )?;
    crate::common::run_cmd(
        Command::new(release_bin("gkq-sign"))
            .arg(&dir)
            .arg("--key")
            .arg(&key),
    )?;
    let k = gkq_format::sig::PublicKey::from_pem(&std::fs::read_to_string(&public)?)?;
    Ok((public, k))
}

/// The price of a trust policy (issue 31): the default package signed
/// with gkq-sign, one workload over TLS + HTTP/2 behind the proxy, opened
/// without a policy, with `--trust-key` cold (an empty disk cache) and
/// warm (the same cache, the signature in it).
fn signed(ca: &TestCa, header: u64, table: u64) -> anyhow::Result<()> {
    let (public, k) = sign_bench_package()?;
    let opts = NginxOptions {
        tls: Some(ca.server.clone()),
        http2: true,
        ..NginxOptions::default()
    };
    let nginx = Nginx::start(&bench_dir(), &bench_dir().join("nginx-wire-signed"), &opts)?;
    let setup = Setup {
        label: "TLS + HTTP/2",
        http2: true,
        header,
        table,
        ca,
    };
    let cache = bench_dir().join("wire-signed-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let c = cache.to_str().context("utf8")?;
    let p = public.to_str().context("utf8")?;
    let name = "long_context";
    let plain_cold = setup.session_with(&nginx, PACK, name, &["--cache-dir", c])?;
    let plain_warm = setup.session_with(&nginx, PACK, name, &["--cache-dir", c])?;
    let _ = std::fs::remove_dir_all(&cache);
    let cold = setup.session_with(&nginx, PACK, name, &["--cache-dir", c, "--trust-key", p])?;
    let warm = setup.session_with(&nginx, PACK, name, &["--cache-dir", c, "--trust-key", p])?;
    let requests = |s: &Session| {
        s.v["requests"].as_u64().unwrap_or(0) + s.v["open"]["requests"].as_u64().unwrap_or(0)
    };
    println!();
    println!(
        "signed package (gkq-sign, key {}), {name}, TLS + HTTP/2, disk cache on: requests of the process and bytes at the proxy",
        k.hint()
    );
    println!();
    println!("| open | trust | requests | wire B | wall ms | added requests | target | met |");
    println!("|---|---|---:|---:|---:|---:|---:|---|");
    for (open, plain, trusted, target) in [
        ("cold", &plain_cold, &cold, 1),
        ("warm", &plain_warm, &warm, 0),
    ] {
        for (label, s) in [("none", plain), ("--trust-key", trusted)] {
            let added = requests(s) as i64 - requests(plain) as i64;
            let met = if label == "none" {
                ""
            } else if added <= target {
                "yes"
            } else {
                "no"
            };
            println!(
                "| {open} | {label} | {} | {} | {:.1} | {added} | ≤ {target} | {met} |",
                requests(s),
                s.wire,
                s.wall
            );
        }
        if trusted.v["open"]["trusted"]["by"] != "signed" {
            bail!(
                "the {open} open was not checked against the signature: {}",
                trusted.v["open"]
            );
        }
    }
    Ok(())
}
