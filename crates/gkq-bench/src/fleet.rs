//! `cargo xtask bench fleet` (issue 32): 8 node processes boot the
//! qwen2.5-0.5b preset (bf16) at the same moment, each pulling and
//! verifying every block (`gkq-inspect --pull`, no compute: 8 decoders
//! cannot run at once on 2 cores).
//!
//! The origin (nginx) sits behind one shared uplink proxy: 100 MB/s, 20 ms
//! RTT, counting every byte (the origin's egress). The site tier is local:
//! an nginx slice cache (`proxy_cache` + `slice`, 1 MiB slices, cache lock)
//! or a mirror made with `gkq-mirror`; each node reaches it through its own
//! proxy capped at 100 MB/s. Scenarios, in one run: (a) every node straight
//! to the origin; (b) through the cache tier; (c) from the regional mirror;
//! (d) as (b) plus one hostile mirror (`--mirror`) that flips bytes. The
//! references are a lone node on the same path, measured in the same run.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use fixtures::servers::{Link, Nginx, NginxOptions, WireProxy};
use serde_json::Value;

use super::common::{bench_dir, model, pack_args, release_bin};

const NODES: usize = 8;
const RATE: u64 = 100_000_000;
const PKG: &str = "fleet-bf16";

/// What one node reported.
struct Boot {
    ready_s: f64,
    bytes: u64,
    json: Value,
}

fn spawn(knot: &str, extra: &[String]) -> anyhow::Result<Child> {
    Command::new(release_bin("gkq-inspect"))
        .arg(knot)
        .args(["--pull", "--json", "--no-cache"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("gkq-inspect")
}

/// Boots one node per entry at once; waits for all.
fn boot(nodes: &[(String, Vec<String>)]) -> anyhow::Result<Vec<Boot>> {
    let children: Vec<Child> = nodes
        .iter()
        .map(|(k, e)| spawn(k, e))
        .collect::<anyhow::Result<_>>()?;
    let mut out = Vec::new();
    for c in children {
        let o = c.wait_with_output()?;
        if !o.status.success() {
            bail!("a node failed: {}", String::from_utf8_lossy(&o.stderr));
        }
        let json: Value = serde_json::from_slice(&o.stdout)?;
        let p = &json["pull"];
        out.push(Boot {
            ready_s: p["ready_ms"].as_f64().unwrap_or(0.0) / 1e3,
            bytes: p["bytes"].as_u64().unwrap_or(0),
            json,
        });
    }
    Ok(out)
}

/// A proxy per node in front of `port`, capped at the node link's rate.
fn links(port: u16, n: usize) -> anyhow::Result<Vec<WireProxy>> {
    let link = Link {
        one_way: Duration::from_millis(1),
        down_rate: Some(RATE),
    };
    (0..n)
        .map(|_| Ok(WireProxy::start_link(port, link)?))
        .collect()
}

fn knot_at(port: u16) -> String {
    format!("http://127.0.0.1:{port}/{PKG}/model.knot")
}

struct Row {
    scenario: &'static str,
    egress: u64,
    boots: Vec<Boot>,
    lone: f64,
}

fn slowest(b: &[Boot]) -> f64 {
    b.iter().map(|b| b.ready_s).fold(0.0, f64::max)
}

fn print(rows: &[Row], one_pull: u64) {
    println!(
        "| scenario | origin egress MB | × one pull | lone node s | slowest of {NODES} s | median s | slowest / lone | mirrors dropped |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let mut t: Vec<f64> = r.boots.iter().map(|b| b.ready_s).collect();
        t.sort_by(f64::total_cmp);
        let dropped = r
            .boots
            .iter()
            .filter(|b| {
                b.json["pull"]["sources"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|s| !s["dropped"].is_null()))
            })
            .count();
        println!(
            "| {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {dropped} of {} nodes |",
            r.scenario,
            r.egress as f64 / 1e6,
            r.egress as f64 / one_pull as f64,
            r.lone,
            slowest(&r.boots),
            t.get(t.len() / 2).copied().unwrap_or(0.0),
            slowest(&r.boots) / r.lone,
            r.boots.len()
        );
    }
}

/// A slice cache in front of the uplink, with a fresh cache directory.
fn tier(uplink: &WireProxy, name: &str) -> anyhow::Result<Nginx> {
    let cache = bench_dir().join(format!("{name}-slices"));
    let _ = std::fs::remove_dir_all(&cache);
    let root = bench_dir().join(format!("{name}-root"));
    std::fs::create_dir_all(&root)?;
    let opts = NginxOptions::slice_cache(uplink.port(), &cache);
    Ok(Nginx::start(
        &root,
        &bench_dir().join(format!("nginx-{name}")),
        &opts,
    )?)
}

/// A copy of the package whose knot has a byte flipped every 64 MiB of
/// its payloads, served by its own nginx: the hostile mirror.
fn hostile() -> anyhow::Result<(Nginx, String)> {
    let root = bench_dir().join("fleet-hostile");
    let dir = root.join(PKG);
    std::fs::create_dir_all(&dir)?;
    let mut knot = std::fs::read(bench_dir().join(PKG).join("model.knot"))?;
    let mut at = 1 << 20;
    while at < knot.len() {
        knot[at] ^= 0x5a;
        at += 64 << 20;
    }
    std::fs::write(dir.join("model.knot"), knot)?;
    let nginx = Nginx::start(
        &root,
        &bench_dir().join("nginx-fleet-hostile"),
        &NginxOptions::default(),
    )?;
    let base = format!("{}/{PKG}/", nginx.url());
    Ok((nginx, base))
}

/// Node commands: (knot URL, extra flags).
type Nodes = Vec<(String, Vec<String>)>;

/// The origin behind its uplink, and the package's id.
struct Fleet {
    uplink: WireProxy,
    id: String,
}

impl Fleet {
    /// Boots `nodes`, with the bytes that crossed the uplink meanwhile.
    fn measured(&self, nodes: &Nodes) -> anyhow::Result<(u64, Vec<Boot>)> {
        let before = self.uplink.stats().down_bytes;
        let b = boot(nodes)?;
        Ok((self.uplink.stats().down_bytes - before, b))
    }

    /// `n` nodes, each behind its own link to `port`, with `extra` flags.
    fn via(
        &self,
        port: u16,
        n: usize,
        extra: &[String],
    ) -> anyhow::Result<(Vec<WireProxy>, Nodes)> {
        let l = links(port, n)?;
        let nodes = l
            .iter()
            .map(|p| (knot_at(p.port()), extra.to_vec()))
            .collect();
        Ok((l, nodes))
    }

    /// (a): a lone node, then the fleet, straight to the origin.
    fn direct(&self) -> anyhow::Result<(u64, Row)> {
        let nodes = |n: usize| -> Nodes {
            (0..n)
                .map(|_| (knot_at(self.uplink.port()), vec![]))
                .collect()
        };
        let (one_pull, lone) = self.measured(&nodes(1))?;
        let (egress, boots) = self.measured(&nodes(NODES))?;
        let lone = slowest(&lone);
        Ok((
            one_pull,
            Row {
                scenario: "(a) every node to the origin",
                egress,
                lone,
                boots,
            },
        ))
    }

    /// (b), and (d) with `--mirror` of a hostile copy: a lone node on a
    /// cold tier, then the fleet on another cold tier.
    fn cached(
        &self,
        extra: &[String],
        scenario: &'static str,
        lone: Option<f64>,
    ) -> anyhow::Result<Row> {
        let lone = match lone {
            Some(l) => l,
            None => {
                let t = tier(&self.uplink, "fleet-tier-lone")?;
                let (_links, n) = self.via(t.port(), 1, extra)?;
                slowest(&self.measured(&n)?.1)
            }
        };
        let t = tier(&self.uplink, &format!("fleet-tier-{}", extra.len()))?;
        let (_links, n) = self.via(t.port(), NODES, extra)?;
        let (egress, boots) = self.measured(&n)?;
        Ok(Row {
            scenario,
            egress,
            lone,
            boots,
        })
    }

    /// (c): a gkq-mirror copy of the package served by a site nginx, the
    /// nodes pinned to the knot id; with what the copy took from the origin.
    fn mirrored(&self) -> anyhow::Result<(u64, Row)> {
        let root = bench_dir().join("fleet-mirror");
        let _ = std::fs::remove_dir_all(&root);
        let before = self.uplink.stats().down_bytes;
        crate::common::run_cmd(
            Command::new(release_bin("gkq-mirror"))
                .arg(knot_at(self.uplink.port()))
                .arg(root.join(PKG))
                .args(["--no-cache", "--knot-id", &self.id]),
        )?;
        let copied = self.uplink.stats().down_bytes - before;
        let site = Nginx::start(
            &root,
            &bench_dir().join("nginx-fleet-mirror"),
            &NginxOptions::default(),
        )?;
        let pin = ["--knot-id".to_owned(), self.id.clone()];
        let (_l1, one) = self.via(site.port(), 1, &pin)?;
        let lone = slowest(&self.measured(&one)?.1);
        let (_l2, all) = self.via(site.port(), NODES, &pin)?;
        let (egress, boots) = self.measured(&all)?;
        Ok((
            copied,
            Row {
                scenario: "(c) from a gkq-mirror copy",
                egress,
                lone,
                boots,
            },
        ))
    }
}

pub(crate) fn run() -> anyhow::Result<()> {
    let m = model()?;
    pack_args(&m, &bench_dir().join(PKG), &["--dtype", "bf16"])?;
    let knot = std::fs::read(bench_dir().join(PKG).join("model.knot"))?;
    let id = gkq_format::Knot::parse(&knot)?.header().id().to_string();
    drop(knot);
    let origin = Nginx::start(
        &bench_dir(),
        &bench_dir().join("nginx-fleet-origin"),
        &NginxOptions::default(),
    )?;
    let link = Link {
        one_way: Duration::from_millis(10),
        down_rate: Some(RATE),
    };
    let f = Fleet {
        uplink: WireProxy::start_link(origin.port(), link)?,
        id,
    };
    let (one_pull, a) = f.direct()?;
    let b = f.cached(&[], "(b) through the slice cache", None)?;
    let (copied, c) = f.mirrored()?;
    let (_h, bad) = hostile()?;
    let extra = [
        "--mirror".to_owned(),
        bad,
        "--knot-id".to_owned(),
        f.id.clone(),
    ];
    let d = f.cached(&extra, "(d) (b) + a hostile mirror", Some(b.lone))?;
    let rows = [a, b, c, d];
    println!(
        "bench fleet: qwen2.5-0.5b preset (bf16), {NODES} gkq-inspect --pull processes at once, each pulling and verifying every block ({:.1} MB); origin behind one 100 MB/s uplink with 20 ms RTT (bytes counted there); each node's link 100 MB/s; the gkq-mirror copy took {:.1} MB from the origin (every object, row files included) before its scenario",
        one_pull as f64 / 1e6,
        copied as f64 / 1e6
    );
    println!();
    print(&rows, one_pull);
    let want = rows[0].boots[0].bytes;
    let same = rows.iter().flat_map(|r| &r.boots).all(|b| b.bytes == want);
    println!();
    println!(
        "every node pulled the same {want} verified bytes: {}",
        if same { "yes" } else { "no" }
    );
    Ok(())
}
