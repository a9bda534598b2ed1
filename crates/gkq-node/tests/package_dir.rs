//! A package is a directory (issue 47 item 1): given a knot, the node
//! tools read the row files next to it with no other flag; `--dense`
//! reads the block, `--columnar-embed` points elsewhere, and the two
//! mistakes a user makes with them are refused with what to give.

use std::path::PathBuf;
use std::process::Output;

use fixtures::servers::{Nginx, NginxOptions, WireProxy};

/// The committed tiny model packed into `www/pkg/v1`, served by nginx
/// behind a counting proxy: `(tmp, package dir, nginx, proxy)`.
fn served() -> (tempfile::TempDir, PathBuf, Nginx, WireProxy) {
    served_as(true)
}

/// [`served`], its blocks stored once (the default, FORMAT.md 7e) or in
/// the knot too.
fn served_as(one_copy: bool) -> (tempfile::TempDir, PathBuf, Nginx, WireProxy) {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("www/pkg/v1");
    let mut opts = gkq_pack::PackOptions::new(fixtures::committed_tiny(), &out);
    opts.one_copy = one_copy;
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let proxy = WireProxy::start(nginx.port(), std::time::Duration::ZERO).expect("proxy");
    (tmp, out, nginx, proxy)
}

fn rows(args: &[&str]) -> Output {
    fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"))
        .args(args)
        .output()
        .expect("run")
}

fn json(o: &Output) -> serde_json::Value {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    serde_json::from_slice(&o.stdout).expect("json")
}

/// Bytes of the embedding's dense block in the knot.
fn block_bytes(out: &std::path::Path) -> u64 {
    let bytes = std::fs::read(out.join("model.knot")).expect("knot");
    let knot = gkq_format::Knot::parse(&bytes).expect("knot");
    let h = knot.header();
    let name = h
        .header()
        .meta_str(gkq_format::keys::ROLE_TOKEN_EMBD)
        .expect("role");
    let i = h.header().block_index(name).expect("token_embd");
    h.payload_len(i)
}

#[test]
fn rows_next_to_the_knot_are_read_with_no_other_flag() {
    let (_tmp, out, _nginx, proxy) = served();
    let knot = format!("http://127.0.0.1:{}/pkg/v1/model.knot", proxy.port());
    let block = block_bytes(&out);
    let v = json(&rows(&[&knot, "-t", "1,2,3", "--json", "--no-cache"]));
    assert_eq!(v["resolution"]["path"], "columnar", "{v}");
    // the open reads the knot's first 64 KiB (header and some payload),
    // then 3 rows and their proof: far less than the block
    let rows_wire = proxy.stats().down_bytes;
    assert!(
        rows_wire < (64 << 10) + 8192,
        "{rows_wire} bytes on the wire for 3 rows; the block is {block}"
    );
    // --dense pulls the whole block, as asked
    let v = json(&rows(&[
        &knot,
        "-t",
        "1,2,3",
        "--json",
        "--no-cache",
        "--dense",
    ]));
    assert_eq!(v["resolution"]["path"], "dense", "{v}");
    let dense_wire = proxy.stats().down_bytes - rows_wire;
    assert!(
        dense_wire >= rows_wire + block - (64 << 10),
        "{dense_wire} bytes with --dense, {rows_wire} without; the block is {block}"
    );
    // a local package directory: its row files too
    let v = json(&rows(&[
        out.to_str().expect("utf-8"),
        "-t",
        "1",
        "--json",
        "--no-cache",
    ]));
    assert_eq!(v["resolution"]["path"], "columnar", "{v}");
}

#[test]
fn missing_row_files_fall_back_with_a_warning() {
    // with the blocks in the knot too: the node falls back to them
    let (_tmp, out, nginx, _proxy) = served_as(false);
    for e in std::fs::read_dir(&out).expect("dir") {
        let p = e.expect("entry").path();
        if p.to_string_lossy().ends_with(".rows") {
            std::fs::remove_file(p).expect("rm");
        }
    }
    let knot = format!("{}/pkg/v1/model.knot", nginx.url());
    let o = rows(&[&knot, "-t", "1", "--json", "--no-cache"]);
    let v = json(&o);
    assert_eq!(v["resolution"]["path"], "dense", "{v}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the row files next to the knot are not used") && err.contains("404"),
        "{err}"
    );
}

/// Stored once (the default), the embedding has no other copy: without
/// its row file the tool fails, naming it, and prints no row.
#[test]
fn a_missing_row_file_that_holds_the_block_is_named() {
    let (_tmp, out, nginx, _proxy) = served();
    std::fs::remove_file(out.join("token_embd.f32.rows")).expect("rm");
    let knot = format!("{}/pkg/v1/model.knot", nginx.url());
    let o = rows(&[&knot, "-t", "1", "--json", "--no-cache"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        o.stdout.is_empty() && err.contains("token_embd.f32.rows") && err.contains("404"),
        "{err}"
    );
}

#[test]
fn a_knot_as_the_row_source_and_warm_with_dense_are_refused() {
    let (_tmp, _out, nginx, _proxy) = served();
    let knot = format!("{}/pkg/v1/model.knot", nginx.url());
    let o = rows(&[&knot, "-t", "1", "--columnar-embed", &knot, "--no-cache"]);
    let err = String::from_utf8_lossy(&o.stderr);
    println!("{err}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("names a knot, not a row file") && err.contains("leave the flag out"),
        "{err}"
    );
    let o = rows(&[&knot, "-t", "1", "--warm", "--dense", "--no-cache"]);
    let err = String::from_utf8_lossy(&o.stderr);
    println!("{err}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--dense reads no rows"), "{err}");
}

/// `--json` failures (issue 47 item 7): one JSON object on stderr with the
/// kind, the message and what failed; the exit codes unchanged.
#[test]
fn json_failures_are_one_object_on_stderr() {
    let (_tmp, _out, nginx, _proxy) = served();
    let knot = format!("{}/pkg/v1/model.knot", nginx.url());
    let o = rows(&[&knot, "-t", "5000", "--json", "--no-cache"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stderr).expect("one JSON object");
    assert_eq!(v["tool"], "gkq-rows");
    assert_eq!(v["error"]["kind"], "TokenOutOfRange", "{v}");
    assert_eq!(v["error"]["row"], 5000, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .contains("out of range")
    );
    let missing = format!("{}/pkg/v2/model.knot", nginx.url());
    let o = rows(&[&missing, "-t", "1", "--json", "--no-cache"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stderr).expect("one JSON object");
    assert_eq!(v["error"]["url"], missing.as_str(), "{v}");
    // a usage error: exit 2, kind usage
    let o = rows(&[&knot, "--json", "--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&o.stderr).expect("one JSON object");
    assert_eq!(v["error"]["kind"], "usage", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .contains("--no-such-flag")
    );
}
