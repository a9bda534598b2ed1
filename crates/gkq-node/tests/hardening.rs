//! Issue 35 at the node tools: a pin that is a path, a cache that cannot
//! be written, and credentials in read URLs. Each runs the built binary
//! against a real server that counts its connections.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use fixtures::servers::{Fault, FaultServer};

/// The committed tiny model packed into `pkg` of a temporary directory.
fn packed() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("pkg");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(fixtures::committed_tiny(), &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    (tmp, out)
}

fn rows(args: &[&str]) -> Command {
    let mut c = fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"));
    c.args(args);
    c
}

fn text(o: &Output) -> String {
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    println!("{all}");
    all
}

/// A read-only tmpfs at `at` (EROFS even for root), unmounted on drop.
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn mount(at: &Path) -> ReadOnly {
        std::fs::create_dir_all(at).expect("mount point");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro,size=64k", "tmpfs"])
            .arg(at)
            .status();
        assert!(
            ok.is_ok_and(|s| s.success()),
            "this test needs to mount a read-only tmpfs (run as root, as CI does)"
        );
        ReadOnly(at.to_path_buf())
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Item 1: `--knot-id ../../../victim.txt` is refused before any request,
/// and the file it names is left alone.
#[test]
fn a_pin_that_is_a_path_is_refused_before_any_request() {
    let (tmp, out) = packed();
    let server = FaultServer::start_dir(&out, Fault::None).expect("server");
    let cache = tmp.path().join("cache");
    let victim = tmp.path().join("victim.txt");
    std::fs::write(&victim, "keep me").expect("victim");
    for pin in [
        "../../../victim.txt".to_owned(),
        victim.display().to_string(),
        "ab".repeat(31),
        format!("{}zz", "ab".repeat(31)),
    ] {
        let o = rows(&[
            &server.url("model.knot"),
            "--tokens",
            "1",
            "--cache-dir",
            cache.to_str().expect("utf8"),
            "--knot-id",
            &pin,
        ])
        .output()
        .expect("run");
        let all = text(&o);
        assert_eq!(o.status.code(), Some(2), "a usage error: {all}");
        assert!(all.contains("is not a knot id"), "{all}");
        assert!(all.contains("hex digits"), "{all}");
    }
    assert_eq!(server.connections(), 0, "no request was made");
    assert_eq!(std::fs::read_to_string(&victim).expect("kept"), "keep me");
}

/// Item 3: with `$XDG_CACHE_HOME` read-only, a node tool warns and runs
/// uncached; an explicit `--cache-dir` there is an error naming the flag
/// and `--no-cache`.
#[test]
fn a_read_only_cache_never_breaks_the_node() {
    let (tmp, out) = packed();
    let ro = tmp.path().join("ro");
    let _mounted = ReadOnly::mount(&ro);
    let server = FaultServer::start_dir(&out, Fault::None).expect("server");
    let knot = server.url("model.knot");
    let o = Command::new(env!("CARGO_BIN_EXE_gkq-rows"))
        .args([&knot, "--tokens", "1,2", "--json", "--f32"])
        .env("XDG_CACHE_HOME", &ro)
        .output()
        .expect("run");
    let all = text(&o);
    assert!(o.status.success(), "{all}");
    assert!(all.contains("running without a disk cache"), "{all}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["rows"].as_array().expect("rows").len(), 2);
    let o = rows(&[
        &knot,
        "--tokens",
        "1",
        "--cache-dir",
        ro.to_str().expect("utf8"),
    ])
    .output()
    .expect("run");
    let all = text(&o);
    assert_eq!(o.status.code(), Some(1), "{all}");
    for needle in ["--cache-dir", "--no-cache", "Read-only file system"] {
        assert!(all.contains(needle), "{needle:?} missing: {all}");
    }
}

/// Item 6: a read URL with credentials is refused before anything is sent,
/// and the secret is printed nowhere (errors, warnings, JSON).
#[test]
fn credentials_in_read_urls_are_refused_and_never_printed() {
    let (_tmp, out) = packed();
    let server = FaultServer::start_dir(&out, Fault::None).expect("server");
    let with_secret = |name: &str| {
        server
            .url(name)
            .replacen("http://", "http://AKID42:s3cr3t-value@", 1)
    };
    let cases = [
        vec![with_secret("model.knot"), "--tokens".into(), "1".into()],
        vec![
            server.url("model.knot"),
            "--columnar-embed".into(),
            with_secret("token_embd.f32.rows"),
            "--tokens".into(),
            "1".into(),
            "--json".into(),
        ],
    ];
    for args in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = rows(&args).output().expect("run");
        let all = text(&o);
        assert_eq!(o.status.code(), Some(1), "{all}");
        assert!(all.contains("credentials in a URL are refused"), "{all}");
        assert!(all.contains("***@127.0.0.1"), "{all}");
        assert!(!all.contains("s3cr3t") && !all.contains("AKID42"), "{all}");
    }
    assert_eq!(server.connections(), 0, "nothing was sent");
    let o = Command::new(env!("CARGO_BIN_EXE_gkq-inspect"))
        .arg(with_secret("model.knot"))
        .output()
        .expect("run");
    let all = text(&o);
    assert_eq!(o.status.code(), Some(1), "{all}");
    assert!(!all.contains("s3cr3t"), "{all}");
}

/// Issue 34, item 7: the first knot read is documented as what the code
/// reads (it said 64 KiB in three places while the code read 32 KiB).
#[test]
fn the_first_read_is_documented_as_the_code_does_it() {
    let kib = gkq_reader::FIRST_FETCH / 1024;
    let o = Command::new(env!("CARGO_BIN_EXE_gkq-inspect"))
        .arg("--help")
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.contains(&format!("first {kib} KiB")), "{help}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for doc in ["README.md", "docs/ARCHITECTURE.md"] {
        let text = std::fs::read_to_string(root.join(doc)).expect("doc");
        assert!(text.contains(&format!("first {kib} KiB")), "{doc}");
        assert!(!text.contains("first 64 KiB"), "{doc}");
    }
}

/// Issue 57, J10 and J14: `--tokens-file` and `--sessions-file` are bounded
/// regular files: a FIFO is refused at once (it hung), a tokens file past
/// its 1 MiB limit is refused before it is parsed (it was parsed whole,
/// at 11.6 times its bytes), and a small one is read.
#[test]
fn id_files_are_bounded_regular_files() {
    let (tmp, pkg) = packed();
    let p = pkg.to_str().expect("utf8");
    let fifo = tmp.path().join("ids.fifo");
    fixtures::fifo(&fifo);
    let f = fifo.to_str().expect("utf8");
    for flag in ["--tokens-file", "--sessions-file"] {
        let o = fixtures::output_within(&mut rows(&[p, flag, f]), 30);
        let t = text(&o);
        assert!(
            !o.status.success() && t.contains("a FIFO, not a regular file"),
            "{flag}: {t}"
        );
    }
    let big = tmp.path().join("ids.txt");
    std::fs::write(&big, "1,".repeat(600_000)).expect("write");
    let o = rows(&[p, "--tokens-file", big.to_str().expect("utf8")])
        .output()
        .expect("run");
    let t = text(&o);
    assert!(
        !o.status.success() && t.contains("over the limit of 1048576 bytes for a tokens file"),
        "{t}"
    );
    let small = tmp.path().join("ids.small");
    std::fs::write(&small, "1, 2, 3").expect("write");
    let o = rows(&[p, "--tokens-file", small.to_str().expect("utf8"), "--json"])
        .output()
        .expect("run");
    assert!(o.status.success(), "{}", text(&o));
}
