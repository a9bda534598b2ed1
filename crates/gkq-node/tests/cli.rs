//! The `gkq-rows` operator tool against nginx.

use std::fs;
use std::path::PathBuf;

use fixtures::servers::{Nginx, NginxOptions};

/// A fixture preset packed (with `dtypes`, default f32) into `www/m` of a
/// temporary directory, served by nginx: `(tmp, nginx, package dir)`.
fn served(preset: &str, dtypes: &[gkq_format::DType]) -> (tempfile::TempDir, Nginx, PathBuf) {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    fixtures::write_model(&src, &fixtures::preset(preset).expect("preset")).expect("fixture");
    let out = tmp.path().join("www/m");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    if !dtypes.is_empty() {
        opts.dtypes = dtypes.to_vec();
    }
    // every package here has a warm object (FORMAT.md 7d), as published ones may
    let ids = tmp.path().join("warm.txt");
    fs::write(&ids, "1 2 3 40").expect("ids");
    opts.warm.ids = Some(ids);
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    (tmp, nginx, out)
}

#[test]
fn gkq_rows_json_and_sessions() {
    let (tmp, nginx, _out) = served("llama-tiny-bf16", &[]);
    let knot = format!("{}/m/model.knot", nginx.url());
    let rows = format!("{}/m/token_embd.f32.rows", nginx.url());
    let run = |args: &[&str]| {
        fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"))
            .args(args)
            .output()
            .expect("run gkq-rows")
    };

    let o = run(&[
        &knot,
        "--columnar-embed",
        &rows,
        "--tokens",
        "3,4,3",
        "--f32",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["resolution"]["path"], "columnar");
    assert_eq!(v["distinct_rows"], 2);
    assert_eq!(v["misses"], 2);
    // the rows, and the proof: with 256-byte rows the proof height is 0,
    // so the chunk table is the 512 leaf hashes, fetched once
    assert_eq!(v["proof_bytes"], 512 * 32);
    assert_eq!(v["payload_bytes"], 2 * 256 + 512 * 32);
    assert!(v["http_bytes"].as_u64().expect("n") > 512 + 512 * 32);
    let r = v["rows"].as_array().expect("rows");
    assert_eq!(r.len(), 3);
    assert_eq!(r[0], r[2]);
    assert_eq!(r[0].as_array().expect("row").len(), 64);

    let sessions = tmp.path().join("s.jsonl");
    fs::write(&sessions, "[1,2,3]\n[3,4]\n\n[1,4]\n").expect("write");
    let o = run(&[
        &knot,
        "--columnar-embed",
        &rows,
        "--sessions-file",
        sessions.to_str().expect("utf8"),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let s = v["sessions"].as_array().expect("sessions");
    assert_eq!(s.len(), 3);
    assert_eq!(
        (
            s[0]["misses"].as_u64(),
            s[1]["hits"].as_u64(),
            s[1]["misses"].as_u64(),
            s[2]["hits"].as_u64()
        ),
        (Some(3), Some(1), Some(1), Some(2))
    );
    assert_eq!(v["hits"], 3);
    assert_eq!(v["misses"], 4);

    // human output: resolution and counters on stderr; rows on stdout with --f32
    let o = run(&[&knot, "--tokens", "1", "--f32", "--dense"]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("resolution: Dense: the dense block was asked for (--dense)"),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("1\t"));

    // bad input: an id past the vocabulary
    let o = run(&[&knot, "--columnar-embed", &rows, "--tokens", "512"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("token id 512 is out of range"));
}

/// `gkq-rows` on a knot whose token embedding is spectral: the resolution
/// says so, the rows are the reconstruction, and an id past the vocabulary
/// is an error (exit 1), not a panic.
#[test]
fn gkq_rows_on_a_spectral_embedding() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (knot, want) = fixtures::knots::spectral_embedding_knot(tmp.path());
    let run = |args: &[&str]| {
        fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"))
            .arg(&knot)
            .args(args)
            .output()
            .expect("run gkq-rows")
    };
    let o = run(&["--tokens", "1", "--f32", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["resolution"]["path"], "spectral");
    let row: Vec<f32> = v["rows"][0]
        .as_array()
        .expect("row")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect();
    assert_eq!(row, want[3..6].to_vec());
    let o = run(&["--tokens", "1000000"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("out of range") && !err.contains("panicked"),
        "{err}"
    );
}

/// `gkq-rows … | head -1` exits quietly.
#[test]
fn gkq_rows_closed_stdout_is_not_a_crash() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (knot, _) = fixtures::knots::spectral_embedding_knot(tmp.path());
    let mut child = fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"))
        .arg(&knot)
        .args(["--tokens", "1,2,3", "--f32"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    let o = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `gkq-inspect` on a local knot and on a URL (header only).
#[test]
fn gkq_inspect_local_and_remote() {
    let (tmp, nginx, out) = served(
        "llama-tiny-bf16",
        &[gkq_format::DType::BF16, gkq_format::DType::F32],
    );
    let knot_bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = gkq_format::Knot::parse(&knot_bytes).expect("valid");
    let id = gkq_format::hex(&knot.header().preamble().header_sha256);
    let inspect = |arg: &str, json: bool| {
        let mut c = fixtures::tool(env!("CARGO_BIN_EXE_gkq-inspect"));
        c.arg(arg);
        if json {
            c.arg("--json");
        }
        c.output().expect("run gkq-inspect")
    };
    let local = out.join("model.knot");
    let o = inspect(local.to_str().expect("utf8"), false);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    for needle in [
        &format!("knot id (header sha256) {id}")[..],
        "role.token_embd",
        "model.embed_tokens.weight",
        "lm_head.weight",
        "row file lm_head.bf16.rows (bf16, 512 rows x 128 bytes",
        "package.files",
        "config.json",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    let o = inspect(local.to_str().expect("utf8"), true);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["knot_id"], id.as_str());
    let blocks = v["blocks"].as_array().expect("blocks");
    assert_eq!(blocks.len(), knot.blocks().len());
    let embed = blocks
        .iter()
        .find(|b| b["name"] == "model.embed_tokens.weight")
        .expect("embed");
    assert_eq!(embed["encoding"], "dense");
    assert_eq!(embed["dtype"], "bf16");
    assert_eq!(embed["columnar"].as_array().map(Vec::len), Some(2));

    let url = format!("{}/m/model.knot", nginx.url());
    let o = inspect(&url, true);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(r["knot_id"], id.as_str());
    assert_eq!(r["blocks"], v["blocks"]);
    let fetched = r["fetched"]["payload_bytes"].as_u64().expect("counted");
    assert!(
        fetched <= 32 * 1024 && fetched < knot_bytes.len() as u64,
        "read {fetched} bytes of a {} byte knot",
        knot_bytes.len()
    );
    // a broken knot: exit 1 naming the rule
    let bad = tmp.path().join("bad.knot");
    fs::write(&bad, &knot_bytes[..100]).expect("write");
    let o = inspect(bad.to_str().expect("utf8"), false);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("header ends at byte"));
}

/// `--columnar-embed` mistakes are visible: a base URL works with or without
/// the trailing `/`; a typo, a dead server or the wrong dtype falls back with
/// a warning, or fails with --require-columnar; a directory URL is read as
/// its knot, and https to a plain port says what to do.
#[test]
fn gkq_rows_columnar_embed_mistakes() {
    let (_tmp, nginx, _out) = served("qwen2-tiny-f32", &[]);
    let base = format!("{}/m", nginx.url());
    let knot = format!("{base}/model.knot");
    let run = |args: &[&str]| {
        fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"))
            .args(args)
            .output()
            .expect("run gkq-rows")
    };
    let path_of = |o: &std::process::Output| {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        v["resolution"]["path"].as_str().expect("path").to_owned()
    };
    for b in [base.clone(), format!("{base}/")] {
        let o = run(&[&knot, "--columnar-embed", &b, "--tokens", "1,2", "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(path_of(&o), "columnar", "{b}");
        assert!(!String::from_utf8_lossy(&o.stderr).contains("warning"));
    }
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!(
            "http://127.0.0.1:{}/m/",
            l.local_addr().expect("addr").port()
        )
    };
    for bad in [
        format!("{base}/token_embd.f33.rows"),
        dead,
        format!("{base}/token_embd.bf16.rows"),
    ] {
        let o = run(&[&knot, "--columnar-embed", &bad, "--tokens", "1", "--json"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert_eq!(path_of(&o), "dense", "{bad}");
        assert!(
            err.contains("warning: --columnar-embed") && err.contains("bytes) because"),
            "{bad}: {err}"
        );
        let o = run(&[
            &knot,
            "--columnar-embed",
            &bad,
            "--require-columnar",
            "--tokens",
            "1",
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{bad}: {err}");
        assert!(err.contains("--require-columnar"), "{err}");
    }
    // the package's directory URL is read as its knot (issue 58)
    let o = run(&[&base, "--tokens", "1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // https to a plain http port
    let tls = knot.replacen("http://", "https://", 1);
    let o = run(&[&tls, "--tokens", "1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("the server does not speak TLS"), "{err}");
}

/// FORMAT.md 7a (issue 22, item 13): a proof object that is missing (404)
/// or damaged is one rule: exit 0 with the dense rows and the reason, or
/// exit 1 with `--require-columnar`.
#[test]
fn gkq_rows_missing_or_damaged_proof_falls_back_to_dense() {
    let (_tmp, nginx, out) = served("qwen2-tiny-f32", &[]);
    let knot = format!("{}/m/model.knot", nginx.url());
    let base = format!("{}/m/", nginx.url());
    let proof = out.join("token_embd.f32.rows.proof");
    let good = fs::read(&proof).expect("proof");
    let run = |extra: &[&str]| {
        fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"))
            .args([
                &knot,
                "--columnar-embed",
                &base,
                "--tokens",
                "1,2",
                "--json",
            ])
            .args(extra)
            .output()
            .expect("run gkq-rows")
    };
    let clean = run(&[]);
    assert!(clean.status.success());
    let rows_of = |o: &std::process::Output| {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        (v["resolution"]["path"].clone(), v["rows"].clone())
    };
    let (path, want) = rows_of(&clean);
    assert_eq!(path, "columnar");
    let mut damaged = good.clone();
    damaged[3] ^= 1;
    for (why, contents) in [("missing", None), ("damaged", Some(damaged))] {
        match &contents {
            None => fs::remove_file(&proof).expect("rm"),
            Some(b) => fs::write(&proof, b).expect("write"),
        }
        let o = run(&[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{why}: {err}");
        let (path, rows) = rows_of(&o);
        assert_eq!(path, "dense", "{why}");
        assert_eq!(rows, want, "{why}: the dense rows are the same values");
        assert!(err.contains("token_embd.f32.rows.proof"), "{why}: {err}");
        let o = run(&["--require-columnar"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{why}: {err}");
        assert!(err.contains("token_embd.f32.rows.proof"), "{why}: {err}");
        fs::write(&proof, &good).expect("restore");
    }
}

/// A server that drips one byte every 200 ms (issue 22, item 2): each
/// request's deadline (--timeout + bytes / --min-throughput) cuts it off,
/// the retries too, and gkq-rows exits 1 naming the URL. Without the
/// deadline one 256-byte row takes 51 s per attempt.
#[test]
fn gkq_rows_gives_up_on_a_dripping_server() {
    let (_tmp, _nginx, out) = served("qwen2-tiny-f32", &[]);
    let server =
        fixtures::servers::FaultServer::start_dir(&out, fixtures::servers::Fault::Drip(200))
            .expect("server");
    let t = std::time::Instant::now();
    let o = fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"))
        .args([
            &server.url("model.knot"),
            "--columnar-embed",
            &server.url("token_embd.f32.rows"),
            "--require-columnar",
            "--tokens",
            "1",
            "--timeout",
            "1",
        ])
        .output()
        .expect("run gkq-rows");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("timed out") && err.contains("token_embd.f32.rows"),
        "{err}"
    );
    assert!(t.elapsed().as_secs() < 30, "{:?}: {err}", t.elapsed());
}

/// Issue 23: the first knot read is sized from what is known. Cold: one
/// 32 KiB read covers a typical header in one round trip, and the bytes
/// beyond the header are reported; with the cache's length hint for the
/// URL, the read is the header exactly.
#[test]
fn the_first_knot_read_is_sized_and_its_overfetch_reported() {
    let (tmp, nginx, _out) = served("qwen2-tiny-f32", &[]);
    let knot = format!("{}/m/model.knot", nginx.url());
    let cache = tmp.path().join("cache");
    let inspect = || {
        let o = fixtures::tool(env!("CARGO_BIN_EXE_gkq-inspect"))
            .args([&knot, "--json", "--cache-dir"])
            .arg(&cache)
            .output()
            .expect("run gkq-inspect");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        v["fetched"].clone()
    };
    let cold = inspect();
    assert_eq!(cold["requests"], 1, "{cold}");
    assert_eq!(cold["payload_bytes"], 32768, "{cold}");
    let beyond = cold["beyond_header"].as_u64().expect("reported");
    assert!(beyond > 0 && beyond < 32768, "{cold}");
    let warm = inspect();
    assert_eq!(warm["requests"], 1, "{warm}");
    assert_eq!(warm["beyond_header"], 0, "{warm}");
    assert_eq!(
        warm["payload_bytes"].as_u64(),
        Some(32768 - beyond),
        "{warm}"
    );
}

/// `--trust-key` on the node tools (issue 31): the signer in the report,
/// an unsigned package refused with exit 1, a key in the wrong format
/// refused before any request.
#[test]
fn node_tools_trust_signed_packages_only() {
    use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
    use sha2::Digest;
    let (tmp, nginx, out) = served("qwen2-tiny-f32", &[]);
    let k = p256::ecdsa::SigningKey::from_slice(&sha2::Sha256::digest(b"publisher")).expect("key");
    let public = tmp.path().join("pub.pem");
    let private = tmp.path().join("key.pem");
    fs::write(
        &public,
        k.verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .expect("pem"),
    )
    .expect("write");
    fs::write(
        &private,
        k.to_pkcs8_pem(LineEnding::LF).expect("pem").as_bytes(),
    )
    .expect("write");
    let url = format!("{}/m/model.knot", nginx.url());
    let rows = |key: &std::path::Path| {
        fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"))
            .args([url.as_str(), "--tokens", "1,2", "--json", "--trust-key"])
            .arg(key)
            .output()
            .expect("run gkq-rows")
    };
    let o = rows(&public);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no signature object") && err.contains("/m/model.sig"),
        "{err}"
    );
    let signed = gkq_sign::sign_package(&out, &k).expect("sign");
    let o = rows(&public);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["open"]["trusted"]["by"], "signed");
    assert_eq!(v["open"]["trusted"]["signer"], signed.signer.as_str());
    let o = fixtures::tool(env!("CARGO_BIN_EXE_gkq-inspect"))
        .arg(&url)
        .arg("--trust-key")
        .arg(&public)
        .output()
        .expect("run gkq-inspect");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("trust: signed by key {}", signed.signer)),
        "{text}"
    );
    let o = rows(&private);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("this is a private key"),
        "{err}"
    );
    assert!(!err.contains("MIGHAgEA"), "no key material: {err}");
}

/// `gkq-mirror` (issue 32): a verified copy that another nginx serves to
/// a node with `--trust-key`; a second run keeps what is there; an origin
/// serving a wrong row file is refused with both digests, and no knot is
/// left in the copy.
#[test]
fn gkq_mirror_makes_a_verified_servable_copy() {
    use p256::pkcs8::{EncodePublicKey, LineEnding};
    use sha2::Digest;
    let (tmp, nginx, out) = served("qwen2-tiny-f32", &[]);
    let k = p256::ecdsa::SigningKey::from_slice(&sha2::Sha256::digest(b"publisher")).expect("key");
    gkq_sign::sign_package(&out, &k).expect("sign");
    let public = tmp.path().join("pub.pem");
    fs::write(
        &public,
        k.verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .expect("pem"),
    )
    .expect("write");
    let mirror = tmp.path().join("site/m");
    let url = format!("{}/m/model.knot", nginx.url());
    let run = |dir: &std::path::Path| {
        fixtures::tool(env!("CARGO_BIN_EXE_gkq-mirror"))
            .args([url.as_str()])
            .arg(dir)
            .args(["--json", "--trust-key"])
            .arg(&public)
            .output()
            .expect("run gkq-mirror")
    };
    let o = run(&mirror);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["trusted"]["by"], "signed");
    let names: Vec<&str> = v["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .filter_map(|o| o["name"].as_str())
        .collect();
    assert_eq!(names.last(), Some(&"model.sig"), "{names:?}");
    assert!(names.iter().any(|n| n.ends_with(".rows.warm")), "{names:?}");
    for name in &names {
        assert_eq!(
            fs::read(out.join(name)).expect("origin"),
            fs::read(mirror.join(name)).expect("copy"),
            "{name}"
        );
    }
    let again: serde_json::Value = serde_json::from_slice(&run(&mirror).stdout).expect("json");
    let fetched: Vec<&str> = again["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .filter(|o| o["status"] == "fetched")
        .filter_map(|o| o["name"].as_str())
        .collect();
    assert_eq!(fetched, ["model.sig"], "everything else kept");
    // the copy, served by another nginx, opens on a node that trusts the key
    let site = Nginx::start(
        &tmp.path().join("site"),
        &tmp.path().join("nginx-site"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let o = fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"))
        .arg(format!("{}/m/model.knot", site.url()))
        .args(["--tokens", "1,2", "--json", "--trust-key"])
        .arg(&public)
        .arg("--columnar-embed")
        .arg(format!("{}/m/", site.url()))
        .output()
        .expect("gkq-rows");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // an origin whose row file is another one: refused, with both digests
    let rows = out.join("token_embd.f32.rows");
    let mut bytes = fs::read(&rows).expect("rows");
    bytes[100] ^= 1;
    fs::write(&rows, bytes).expect("tamper");
    let fresh = tmp.path().join("site2/m");
    let o = run(&fresh);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("token_embd.f32.rows: sha256")
            && err.contains("but the knot records"),
        "{err}"
    );
    assert!(
        !fresh.join("model.knot").exists(),
        "an unfinished copy has no knot"
    );
}

/// Issue 42: gkq-mirror stages every object and renames it into DIR only
/// once the staged package is verified. Killed in the middle of an object
/// (the origin paced to 32 KB/s), no final name in DIR holds a byte; the
/// next run finishes the copy. A directory holding another package is
/// refused, naming it, and replaced whole with --replace.
/// Issue 58: on a terminal, gkq-mirror shows a bar while it copies; none
/// with --no-progress.
#[test]
fn gkq_mirror_shows_a_bar_on_a_terminal() {
    let (tmp, nginx, _out) = served("qwen2-tiny-f32", &[]);
    let url = format!("{}/m/model.knot", nginx.url());
    let bin = env!("CARGO_BIN_EXE_gkq-mirror");
    let dir = |n: &str| tmp.path().join(n).display().to_string();
    let shown = fixtures::on_terminal(bin, &[&url, &dir("a"), "--no-cache"]);
    assert!(
        shown.contains("pulling ") && shown.contains("KiB"),
        "{shown}"
    );
    let quiet = fixtures::on_terminal(bin, &[&url, &dir("b"), "--no-cache", "--no-progress"]);
    assert!(!quiet.contains("pulling "), "{quiet}");
}

#[test]
fn gkq_mirror_renames_only_verified_objects_and_never_mixes_packages() {
    let (tmp, nginx, out) = served("qwen2-tiny-f32", &[]);
    let paced = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx-paced"),
        &NginxOptions {
            extra: "limit_rate 32k;".into(),
            ..NginxOptions::default()
        },
    )
    .expect("nginx");
    let mirror = tmp.path().join("site/m");
    let cmd = |base: &str, dir: &std::path::Path| {
        let mut c = fixtures::tool(env!("CARGO_BIN_EXE_gkq-mirror"));
        c.arg(format!("{base}/m/model.knot")).arg(dir).arg("--json");
        c
    };
    let mut child = cmd(&paced.url(), &mirror)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let staged = mirror.join(".gkq-mirror");
    let t = std::time::Instant::now();
    while fs::read_dir(&staged).map_or(0, |d| d.count()) == 0 {
        assert!(t.elapsed().as_secs() < 30, "nothing staged");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    child.kill().expect("kill");
    child.wait().expect("wait");
    let finals: Vec<String> = fs::read_dir(&mirror)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".gkq-mirror")
        .collect();
    assert!(
        finals.is_empty(),
        "final names before verification: {finals:?}"
    );
    assert!(
        fs::read_dir(&staged).expect("staged").any(|e| e
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .ends_with(".part")),
        "killed in the middle of an object"
    );
    let o = cmd(&nginx.url(), &mirror).output().expect("resume");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!staged.exists(), "the staging directory is removed");
    for e in fs::read_dir(&out).expect("origin") {
        let name = e.expect("entry").file_name();
        assert_eq!(
            fs::read(out.join(&name)).ok(),
            fs::read(mirror.join(&name)).ok(),
            "{name:?}"
        );
    }
    // another package in the directory: refused, then replaced whole
    let other = tmp.path().join("www/other");
    let mut opts = gkq_pack::PackOptions::new(fixtures::committed_tiny(), &other);
    opts.dtypes = vec![gkq_format::DType::F16];
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack other");
    let other_id = gkq_sign::knot_id_of(&other).expect("id").to_string();
    let mut c = fixtures::tool(env!("CARGO_BIN_EXE_gkq-mirror"));
    c.arg(format!("{}/other/model.knot", nginx.url()))
        .arg(&mirror);
    let o = c.output().expect("run");
    let err = String::from_utf8_lossy(&o.stderr);
    let asked = gkq_sign::knot_id_of(&out).expect("id").to_string();
    assert!(
        !o.status.success()
            && err.contains("holds another package")
            && err.contains(&asked)
            && err.contains("--replace"),
        "{err}"
    );
    assert_eq!(
        gkq_sign::knot_id_of(&mirror)
            .expect("untouched")
            .to_string(),
        asked
    );
    let o = c.arg("--replace").output().expect("replace");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut have: Vec<String> = fs::read_dir(&mirror)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let mut want: Vec<String> = fs::read_dir(&other)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    have.sort();
    want.sort();
    assert_eq!(have, want, "the other package whole, nothing of the first");
    assert_eq!(
        gkq_sign::knot_id_of(&mirror).expect("id").to_string(),
        other_id
    );
}

/// Issue 42: 30 node processes at once against one nginx: each reads its
/// rows or fails saying why; none exits non-zero in silence.
#[test]
fn thirty_nodes_at_once_never_fail_in_silence() {
    let (_tmp, nginx, _out) = served("qwen2-tiny-f32", &[]);
    let knot = format!("{}/m/model.knot", nginx.url());
    let rows = format!("{}/m/", nginx.url());
    let children: Vec<_> = (0..30)
        .map(|i| {
            fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"))
                .args([&knot, "--columnar-embed", &rows, "--json", "--tokens"])
                .arg(format!("{},{},{}", i, i + 100, i + 200))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let mut ok = 0;
    for c in children {
        let o = c.wait_with_output().expect("wait");
        if o.status.success() {
            ok += 1;
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
            assert_eq!(v["resolution"]["path"], "columnar");
        } else {
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains("gkq-rows: error: ") && err.trim().len() > 20,
                "a failure in silence: {o:?}"
            );
        }
    }
    assert!(ok > 0, "no node read its rows");
}

/// Issue 57, J5 and J15 at the node: model B signed `--name v1` (as a
/// bucket-per-model layout signs) and served at `/models/a/v1/` is refused,
/// from the origin and through a mirror, naming both names (a short name
/// never matches a longer path by its tail); B signed `b/v1` copied into a
/// local `…/models/a/v1` is refused too; at `…/models/b/v1` it opens and
/// reports the name it carries.
#[test]
fn a_signed_name_binds_at_urls_and_in_local_directories() {
    use p256::pkcs8::{EncodePublicKey, LineEnding};
    use sha2::Digest;
    let (tmp, nginx, out) = served("qwen2-tiny-f32", &[]);
    let k = p256::ecdsa::SigningKey::from_slice(&sha2::Sha256::digest(b"publisher")).expect("key");
    let public = tmp.path().join("pub.pem");
    let pem = k.verifying_key().to_public_key_pem(LineEnding::LF);
    fs::write(&public, pem.expect("pem")).expect("write");
    let copy_to = |dir: &std::path::Path| {
        fs::create_dir_all(dir).expect("dir");
        for e in fs::read_dir(&out).expect("out") {
            let e = e.expect("entry");
            fs::copy(e.path(), dir.join(e.file_name())).expect("copy");
        }
    };
    let rows = |knot: &str, extra: &[&str]| {
        fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"))
            .args([knot, "--tokens", "1,2", "--json", "--trust-key"])
            .arg(&public)
            .args(extra)
            .output()
            .expect("run gkq-rows")
    };
    let refused = |o: &std::process::Output, needles: &[&str]| {
        let text = String::from_utf8_lossy(&o.stderr);
        let last = text
            .lines()
            .rfind(|l| l.starts_with('{'))
            .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(last).expect("--json: the failure");
        let err = v["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(o.status.code(), Some(1), "{v}");
        for n in needles {
            assert!(err.contains(n), "{n:?} missing from {err}");
        }
    };
    // J5: signed "v1", served at /models/a/v1/
    gkq_sign::sign_named(&out, &k, Some("v1")).expect("sign v1");
    let www = tmp.path().join("www");
    copy_to(&www.join("models/a/v1"));
    let url = format!("{}/models/a/v1/model.knot", nginx.url());
    refused(&rows(&url, &[]), &["\"v1\"", "package \"models/a/v1\""]);
    let mirror = format!("{}/m/", nginx.url());
    refused(
        &rows(&url, &["--mirror", &mirror]),
        &["\"v1\"", "package \"models/a/v1\""],
    );
    // J15: signed "b/v1", in a local directory that is a/v1's
    gkq_sign::sign_named(&out, &k, Some("b/v1")).expect("sign b/v1");
    let (a, b) = (
        tmp.path().join("local/models/a/v1"),
        tmp.path().join("local/models/b/v1"),
    );
    copy_to(&a);
    copy_to(&b);
    refused(
        &rows(a.to_str().expect("utf8"), &[]),
        &["\"b/v1\"", "models/a/v1"],
    );
    let o = rows(b.to_str().expect("utf8"), &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["open"]["trusted"]["package"], "b/v1", "{v}");
}
