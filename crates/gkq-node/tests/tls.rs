//! The reader over HTTPS against a real nginx with TLS: HTTP/2 multiplexed
//! over one connection, the HTTP/1.1 fallback, a private CA given with
//! --ca-cert or SSL_CERT_FILE, a wrong CA refused, and a Range-ignoring
//! TLS server. The CA and certificate are made by the test (openssl).

use std::path::{Path, PathBuf};

use fixtures::servers::{Nginx, NginxOptions, TestCa};
use gkq_format::DType;
use gkq_reader::{PathKind, Reader, ReaderConfig, Serve};

struct Site {
    _tmp: tempfile::TempDir,
    nginx: Nginx,
    ca: TestCa,
    out: PathBuf,
}

/// The llama-tiny bf16 preset packed with bf16 and f32 rows, served over TLS.
fn site(http2: bool, ignore_ranges: bool) -> Site {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    fixtures::write_model(&src, &fixtures::preset("llama-tiny-bf16").expect("preset"))
        .expect("fixture");
    let out = tmp.path().join("www/m");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    opts.dtypes = vec![DType::BF16, DType::F32];
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let ca = TestCa::generate(&tmp.path().join("ca")).expect("openssl test CA");
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions {
            tls: Some(ca.server.clone()),
            http2,
            ignore_ranges,
            ..NginxOptions::default()
        },
    )
    .expect("nginx with ssl (scripts/install-test-deps.sh)");
    Site {
        _tmp: tmp,
        nginx,
        ca,
        out,
    }
}

fn config(ca: Option<&Path>, columnar: Option<String>) -> ReaderConfig {
    let mut c = ReaderConfig {
        columnar_embed: columnar,
        ..ReaderConfig::default()
    };
    c.store.ca_certs = ca.map(Path::to_path_buf).into_iter().collect();
    c
}

/// The dense rows of `ids`, from the local knot, widened to f32.
fn dense(out: &Path, ids: &[u64]) -> Vec<f32> {
    let r = Reader::open(
        out.join("model.knot").to_str().expect("utf8"),
        ReaderConfig::default(),
        Serve::INPUT,
    )
    .expect("local");
    r.embedding()
        .expect("input")
        .rows(ids)
        .expect("rows")
        .to_f32()
        .expect("f32")
}

const IDS: [u64; 6] = [1, 17, 42, 43, 300, 511];

/// Opens the remote knot with columnar rows and checks them; returns the
/// reader's connection count and the protocol nginx logged.
fn read_rows(s: &Site) -> (u64, String) {
    let base = format!("{}/m", s.nginx.url());
    let r = Reader::open(
        &format!("{base}/model.knot"),
        config(Some(&s.ca.ca), Some(format!("{base}/token_embd.bf16.rows"))),
        Serve::INPUT,
    )
    .expect("open over TLS with --ca-cert");
    let e = r.embedding().expect("input");
    assert_eq!(
        e.resolution().kind(),
        PathKind::Columnar,
        "{}",
        e.resolution().reason()
    );
    let got = e.rows(&IDS).expect("rows").to_f32().expect("f32");
    assert_eq!(
        got,
        dense(&s.out, &IDS),
        "rows over TLS equal the dense block"
    );
    let log = s.nginx.access_log();
    let proto = if log.contains("HTTP/2.0\"") {
        "h2"
    } else if log.contains("HTTP/1.1\"") {
        "http/1.1"
    } else {
        "?"
    };
    (r.net_stats().connections, proto.to_owned())
}

#[test]
fn rows_over_h2_share_one_connection() {
    let s = site(true, false);
    let (connections, proto) = read_rows(&s);
    assert_eq!(proto, "h2", "{}", s.nginx.access_log());
    assert_eq!(
        connections, 1,
        "HEAD, header range and every row run over one connection"
    );
}

#[test]
fn http1_fallback_when_h2_is_not_offered() {
    let s = site(false, false);
    let (connections, proto) = read_rows(&s);
    assert_eq!(proto, "http/1.1", "{}", s.nginx.access_log());
    assert!(connections >= 1);
}

#[test]
fn wrong_ca_is_refused_and_named() {
    let s = site(true, false);
    let url = format!("{}/m/model.knot", s.nginx.url());
    // no --ca-cert: the system store does not know the test CA
    let e = Reader::open(&url, config(None, None), Serve::INPUT).expect_err("unknown issuer");
    let msg = e.to_string();
    assert!(
        msg.contains("TLS certificate problem")
            && msg.contains("a CA this client does not trust")
            && msg.contains("--ca-cert"),
        "{msg}"
    );
    // another CA: refused too
    let other = TestCa::generate(&s._tmp.path().join("other")).expect("openssl");
    let e = Reader::open(&url, config(Some(&other.ca), None), Serve::INPUT)
        .expect_err("signed by another CA");
    assert!(e.to_string().contains("TLS certificate problem"), "{e}");
    // a file that is not a certificate
    let junk = s._tmp.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").expect("write");
    let e = Reader::open(&url, config(Some(&junk), None), Serve::INPUT).expect_err("junk");
    // the flag in the message, the PEM reader's finding as its cause
    let chain: Vec<String> =
        std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
            .map(ToString::to_string)
            .collect();
    assert!(chain[0].contains("--ca-cert"), "{chain:?}");
    assert!(
        chain.last().expect("cause").contains("no PEM certificate"),
        "{chain:?}"
    );
}

#[test]
fn range_ignoring_tls_server_falls_back_to_dense() {
    // the knot from a good server; the rows from one that ignores Range
    let s = site(true, false);
    let ignoring = Nginx::start(
        &s._tmp.path().join("www"),
        &s._tmp.path().join("nginx-ignoring"),
        &NginxOptions {
            tls: Some(s.ca.server.clone()),
            http2: true,
            ignore_ranges: true,
            ..NginxOptions::default()
        },
    )
    .expect("nginx");
    let r = Reader::open(
        &format!("{}/m/model.knot", s.nginx.url()),
        config(Some(&s.ca.ca), Some(format!("{}/m/", ignoring.url()))),
        Serve::INPUT,
    )
    .expect("open");
    let e = r.embedding().expect("input");
    assert_eq!(e.resolution().kind(), PathKind::Columnar);
    let got = e.rows(&IDS).expect("rows via the dense fallback");
    assert_eq!(got.to_f32().expect("f32"), dense(&s.out, &IDS));
    let res = e.resolution();
    assert_eq!(res.kind(), PathKind::Dense);
    assert!(res.reason().contains("ignored Range"), "{}", res.reason());
    // the 200 body (the whole row file) was not read
    let row_file = std::fs::metadata(s.out.join("token_embd.bf16.rows"))
        .expect("rows")
        .len();
    assert!(
        r.net_stats().payload_bytes < row_file + 1_000_000,
        "{} payload bytes",
        r.net_stats().payload_bytes
    );
    // and a server that ignores Range cannot serve the knot at all
    let e = Reader::open(
        &format!("{}/m/model.knot", ignoring.url()),
        config(Some(&s.ca.ca), None),
        Serve::INPUT,
    )
    .expect_err("the header range is refused");
    assert!(e.to_string().contains("ignored Range"), "{e}");
}

#[test]
fn gkq_rows_with_ca_cert_flag_and_ssl_cert_file() {
    let s = site(true, false);
    let knot = format!("{}/m/model.knot", s.nginx.url());
    let rows = format!("{}/m", s.nginx.url());
    let run = |extra: &[&str], env: Option<&Path>| {
        let mut c = fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"));
        c.args([
            &knot,
            "--columnar-embed",
            &rows,
            "--tokens",
            "1,2,3",
            "--json",
        ])
        .args(extra);
        if let Some(f) = env {
            c.env("SSL_CERT_FILE", f);
        }
        c.output().expect("run gkq-rows")
    };
    let ca = s.ca.ca.to_str().expect("utf8");
    for o in [run(&["--ca-cert", ca], None), run(&[], Some(&s.ca.ca))] {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        assert_eq!(v["resolution"]["path"], "columnar");
    }
    let o = run(&[], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("TLS certificate problem"));
    // gkq-inspect takes --ca-cert too
    let o = fixtures::tool(env!("CARGO_BIN_EXE_gkq-inspect"))
        .args([&knot, "--ca-cert", ca])
        .output()
        .expect("run gkq-inspect");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Counted at a TCP proxy (what a node pays, TLS and framing included):
/// over h2 the whole session is one connection, and every round trip pays
/// the proxy's delay.
#[test]
fn wire_bytes_and_connections_at_a_delaying_proxy() {
    use fixtures::servers::WireProxy;
    use std::time::{Duration, Instant};
    let s = site(true, false);
    let proxy = WireProxy::start(s.nginx.port(), Duration::from_millis(10)).expect("proxy");
    let base = format!("https://127.0.0.1:{}/m", proxy.port());
    let t = Instant::now();
    let r = Reader::open(
        &format!("{base}/model.knot"),
        config(Some(&s.ca.ca), Some(format!("{base}/token_embd.bf16.rows"))),
        Serve::INPUT,
    )
    .expect("open through the proxy");
    let rows = r.embedding().expect("input").rows(&IDS).expect("rows");
    let elapsed = t.elapsed();
    assert_eq!(rows.to_f32().expect("f32"), dense(&s.out, &IDS));
    let wire = proxy.stats();
    let net = r.net_stats();
    assert_eq!(wire.connections, 1, "{wire:?}");
    assert_eq!(net.connections, 1);
    assert!(
        wire.total() > net.payload_bytes,
        "the wire carries more than the payload: {wire:?} vs {net:?}"
    );
    // TCP + TLS + HEAD + header range + row-file HEAD + rows: at least 4 round trips of 20 ms
    assert!(elapsed >= Duration::from_millis(80), "{elapsed:?}");
}

/// `HTTPS_PROXY` sends the TLS connection through a CONNECT tunnel;
/// `NO_PROXY` bypasses it.
#[test]
fn https_proxy_and_no_proxy_are_honoured() {
    use fixtures::servers::ConnectProxy;
    let s = site(true, false);
    let proxy = ConnectProxy::start().expect("proxy");
    let knot = format!("{}/m/model.knot", s.nginx.url());
    let run = |no_proxy: Option<&str>| {
        let mut c = fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"));
        c.args([&knot, "--tokens", "1,2", "--ca-cert"])
            .arg(&s.ca.ca)
            .env("HTTPS_PROXY", proxy.url())
            .env_remove("https_proxy")
            .env_remove("ALL_PROXY")
            .env_remove("all_proxy");
        match no_proxy {
            Some(v) => c.env("NO_PROXY", v),
            None => c.env_remove("NO_PROXY").env_remove("no_proxy"),
        };
        c.output().expect("run gkq-rows")
    };
    let o = run(None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(proxy.tunnels() >= 1, "the request went through the proxy");
    let before = proxy.tunnels();
    let o = run(Some("127.0.0.1"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(proxy.tunnels(), before, "NO_PROXY bypasses the proxy");
}

/// A dead `HTTPS_PROXY` is named, not blamed on the server (issue 22,
/// item 9): the message says which variable points where, and that the
/// server was not contacted.
#[test]
fn a_dead_https_proxy_is_named() {
    let s = site(true, false);
    let dead = format!(
        "http://127.0.0.1:{}",
        fixtures::servers::free_port().expect("port")
    );
    let knot = format!("{}/m/model.knot", s.nginx.url());
    let o = fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"))
        .args([&knot, "--tokens", "1", "--timeout", "2", "--ca-cert"])
        .arg(&s.ca.ca)
        .env("HTTPS_PROXY", &dead)
        .env_remove("https_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy")
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output()
        .expect("run gkq-rows");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot connect to the proxy HTTPS_PROXY={dead}"))
            && err.contains("the server itself was not contacted"),
        "{err}"
    );
    assert!(!err.contains("is the server running"), "{err}");
}
