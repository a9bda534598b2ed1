//! The mistakes a new user makes with gkq-rows and gkq-inspect, and the
//! message each gets: what went wrong and what to do (issue 25).

use std::path::PathBuf;
use std::process::Output;

use fixtures::servers::{Nginx, NginxOptions, TestCa};

/// The committed tiny model packed into `www/pkg/v1` of a temporary
/// directory: `(tmp, package dir)`.
fn packed() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("www/pkg/v1");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(fixtures::committed_tiny(), &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    (tmp, out)
}

fn tool(bin: &str, args: &[&str]) -> Output {
    fixtures::tool(bin).args(args).output().expect("run")
}

fn rows(args: &[&str]) -> Output {
    tool(env!("CARGO_BIN_EXE_gkq-rows"), args)
}

fn inspect(args: &[&str]) -> Output {
    tool(env!("CARGO_BIN_EXE_gkq-inspect"), args)
}

/// Exit 1, and stderr holds every needle.
fn says(o: &Output, needles: &[&str]) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    println!("{err}"); // shown with --nocapture: the message as a user sees it
    assert_eq!(o.status.code(), Some(1), "{err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} missing from: {err}");
    }
    err
}

#[test]
fn a_package_directory_url_is_read_as_its_knot() {
    let (tmp, _out) = packed();
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    // a package's directory URL is read as its knot (issue 58), with or
    // without the slash, as gkq-verify takes it
    for base in [
        format!("{}/pkg/v1/", nginx.url()),
        format!("{}/pkg/v1", nginx.url()),
    ] {
        let o = rows(&[&base, "--tokens", "1,2", "--json"]);
        assert!(
            o.status.success(),
            "{base}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let o = inspect(&[&base]);
        assert!(
            o.status.success(),
            "{base}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn a_package_directory_is_read_as_its_knot() {
    let (_tmp, out) = packed();
    let dir = out.to_str().expect("utf8");
    let o = rows(&[dir, "--tokens", "1, 2", "--json", "--f32"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("No such device"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(
        v["rows"].as_array().expect("rows").len(),
        2,
        "'1, 2' is two ids"
    );
    let o = inspect(&[dir]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // a directory without a knot says what it looked for
    let empty = tempfile::tempdir().expect("tmp");
    says(
        &rows(&[empty.path().to_str().expect("utf8"), "--tokens", "1"]),
        &["model.knot"],
    );
}

/// http:// to a TLS port, and a self-signed leaf given as the CA.
#[test]
fn tls_mistakes_say_what_to_do() {
    let (tmp, _out) = packed();
    let ca = TestCa::generate(&tmp.path().join("ca")).expect("openssl test CA");
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions {
            tls: Some(ca.server.clone()),
            ..NginxOptions::default()
        },
    )
    .expect("nginx with ssl");
    let knot = format!("{}/pkg/v1/model.knot", nginx.url());
    // http:// to the TLS port: nginx's 400 says why, and so do we
    let plain = knot.replacen("https://", "http://", 1);
    let err = says(&rows(&[&plain, "--tokens", "1"]), &["https://"]);
    assert!(err.to_lowercase().contains("https port"), "{err}");
    // a self-signed server certificate given as the CA: not a Rust debug
    // value, and not "pass --ca-cert", which was passed
    let own = fixtures::servers::self_signed(&tmp.path().join("self")).expect("openssl");
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx-self"),
        &NginxOptions {
            tls: Some(own.clone()),
            ..NginxOptions::default()
        },
    )
    .expect("nginx with a self-signed certificate");
    let knot = format!("{}/pkg/v1/model.knot", nginx.url());
    let pem = own.cert.to_str().expect("utf8");
    let err = says(
        &rows(&[&knot, "--tokens", "1", "--ca-cert", pem]),
        &["certificate"],
    );
    assert!(
        !err.contains("OtherError") && !err.contains("Other("),
        "{err}"
    );
    assert!(!err.contains("pass --ca-cert"), "{err}");
    assert!(
        err.contains("self-signed") || err.contains("CA certificate as its own"),
        "{err}"
    );
}

#[test]
fn endpoint_without_a_scheme_suggests_http() {
    let o = rows(&[
        "s3://bucket/m/model.knot",
        "--endpoint",
        "127.0.0.1:8014",
        "--tokens",
        "1",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    if gkq_store::FEATURES.contains(&"s3") {
        assert!(err.contains("http://127.0.0.1:8014"), "{err}");
    } else {
        assert!(err.contains("`s3` feature"), "{err}");
    }
}

/// Every tool's help has examples (issue 25): `--help` shows them.
#[test]
fn help_has_examples() {
    fixtures::assert_help_has_examples(env!("CARGO_BIN_EXE_gkq-rows"));
    fixtures::assert_help_has_examples(env!("CARGO_BIN_EXE_gkq-inspect"));
}
