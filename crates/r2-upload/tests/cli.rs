//! `cargo xtask upload` end to end: the packed tiny model to a real S3
//! server (s3s-fs), then the gkq-verify --url checks against nginx serving
//! the bucket, as the README shows.

use std::process::Command;

use fixtures::servers::{Nginx, NginxOptions, S3_ACCESS_KEY, S3_SECRET_KEY, S3sFs};

/// The r2-upload binary with the test server's credentials (and no AWS
/// variables of the caller's).
fn r2_upload() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_r2-upload"));
    c.env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env("R2_ACCESS_KEY_ID", S3_ACCESS_KEY)
        .env("R2_SECRET_ACCESS_KEY", S3_SECRET_KEY);
    c
}

/// An upload of `package` to `prefix` in s3s-fs's `models` bucket.
fn upload_to(package: impl AsRef<std::ffi::OsStr>, s3: &S3sFs, prefix: &str) -> Command {
    let mut c = r2_upload();
    c.arg(package).args([
        "--bucket",
        "models",
        "--prefix",
        prefix,
        "--endpoint",
        &s3.url(),
    ]);
    c
}

/// The committed tiny model packed into a temporary directory, and an
/// s3s-fs with a `models` bucket: `(tmp, package dir, server)`.
fn packed_and_s3() -> (tempfile::TempDir, std::path::PathBuf, S3sFs) {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("out");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(fixtures::committed_tiny(), &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    let s3 = S3sFs::start(&tmp.path().join("s3")).expect("s3s-fs (scripts/install-test-deps.sh)");
    std::fs::create_dir_all(s3.data().join("models")).expect("bucket");
    (tmp, out, s3)
}

#[test]
fn upload_then_verify_over_http() {
    let (tmp, out, s3) = packed_and_s3();
    let nginx = Nginx::start(
        s3.data(),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let public = format!("{}/models/qwen2-tiny/v1", nginx.url());
    let upload = |extra: &[&str]| {
        upload_to(&out, &s3, "qwen2-tiny/v1")
            .args(["--public-url", &public, "--json"])
            .args(extra)
            .output()
            .expect("run xtask upload")
    };
    let o = upload(&[]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&o.stderr)
    );
    let all: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    // the last line is the knot id a node pins
    let (id_line, lines) = all.split_last().expect("lines");
    let knot_bytes = std::fs::read(out.join("model.knot")).expect("knot");
    let knot = gkq_format::Knot::parse(&knot_bytes).expect("valid");
    assert_eq!(
        id_line["knot_id"],
        gkq_format::hex(&knot.header().preamble().header_sha256)
    );
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0]["key"], "qwen2-tiny/v1/token_embd.f32.rows");
    assert_eq!(
        lines[1]["key"], "qwen2-tiny/v1/token_embd.f32.rows.proof",
        "each row file's proof object right after it"
    );
    assert_eq!(
        lines[2]["key"], "qwen2-tiny/v1/config.json",
        "companion files before the knot"
    );
    assert_eq!(lines[3]["key"], "qwen2-tiny/v1/model.knot", "knot last");
    assert!(lines.iter().all(|l| l["status"] == "uploaded"));
    assert!(
        !stdout.contains(S3_SECRET_KEY)
            && !String::from_utf8_lossy(&o.stderr).contains(S3_SECRET_KEY)
    );
    let again = upload(&[]);
    assert!(
        String::from_utf8_lossy(&again.stdout)
            .lines()
            .filter(|l| l.contains("\"key\""))
            .all(|l| l.contains("\"skipped\""))
    );
    // the release gate over the public URL, as a separate step
    let mut opts = gkq_verify::VerifyOptions::new(&out);
    opts.url = Some(public);
    assert!(gkq_verify::verify(&opts).expect("verify").passed);
    // missing credentials: a clear message, exit non-zero
    let o = Command::new(env!("CARGO_BIN_EXE_r2-upload"))
        .arg(&out)
        .args(["--bucket", "models", "--endpoint", &s3.url()])
        .env_remove("R2_ACCESS_KEY_ID")
        .env_remove("R2_SECRET_ACCESS_KEY")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_PROFILE")
        .env("HOME", tmp.path())
        .output()
        .expect("run");
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("R2_ACCESS_KEY_ID"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Upload errors are one short line that says what to do, with no SDK
/// debug structure and no backtrace even with RUST_BACKTRACE=1.
#[test]
fn upload_errors_are_one_line() {
    let (_tmp, out, s3) = packed_and_s3();
    let upload = |endpoint: &str, secret: &str| {
        Command::new(env!("CARGO_BIN_EXE_r2-upload"))
            .arg(&out)
            .args(["--bucket", "models", "--endpoint", endpoint])
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env("R2_ACCESS_KEY_ID", S3_ACCESS_KEY)
            .env("R2_SECRET_ACCESS_KEY", secret)
            .env("RUST_BACKTRACE", "1")
            .output()
            .expect("run xtask upload")
    };
    let one_line = |o: &std::process::Output, must: &[&str]| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        for m in must {
            assert!(err.contains(m), "{m:?} missing: {err}");
        }
        for never in [
            "backtrace",
            "Backtrace",
            "DispatchFailure",
            "ServiceError {",
            "raw:",
        ] {
            assert!(!err.contains(never), "{never:?} in: {err}");
        }
    };
    one_line(
        &upload(&s3.url(), "wrong-secret"),
        &[
            "access denied",
            "R2_ACCESS_KEY_ID/R2_SECRET_ACCESS_KEY",
            "bucket permissions",
        ],
    );
    let dead = format!(
        "http://127.0.0.1:{}",
        fixtures::servers::free_port().expect("port")
    );
    one_line(
        &upload(&dead, S3_SECRET_KEY),
        &[&format!("cannot reach {dead}"), "refused"],
    );
    // --help names the variables and the defaults
    let help = Command::new(env!("CARGO_BIN_EXE_r2-upload"))
        .arg("--help")
        .output()
        .expect("help");
    let text = String::from_utf8_lossy(&help.stdout);
    for m in [
        "Usage: cargo xtask upload",
        "Examples:",
        "R2_ACCOUNT_ID",
        "R2_ACCESS_KEY_ID",
        "R2_SECRET_ACCESS_KEY",
        "default: 64",
        "default: auto",
        "Exit status",
    ] {
        assert!(text.contains(m), "{m:?} missing from --help:\n{text}");
    }
}

/// A signed package (issue 31): model.sig is published after the knot, so
/// a node never sees a signature before the package it signs; a signature
/// left over from an earlier pack is refused before anything is sent.
#[test]
fn the_signature_is_published_last_and_a_stale_one_refused() {
    use sha2::Digest;
    let (tmp, out, s3) = packed_and_s3();
    let k = p256::ecdsa::SigningKey::from_slice(&sha2::Sha256::digest(b"publisher")).expect("key");
    gkq_sign::sign_package(&out, &k).expect("sign");
    let upload = |prefix: &str| {
        upload_to(&out, &s3, prefix)
            .arg("--json")
            .output()
            .expect("run r2-upload")
    };
    let o = upload("tiny/v1");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let keys: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["key"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        keys[keys.len() - 2..],
        ["tiny/v1/model.knot", "tiny/v1/model.sig"],
        "{keys:?}"
    );
    let published = s3.data().join("models/tiny/v1/model.sig");
    assert_eq!(
        std::fs::read(published).expect("sig"),
        std::fs::read(out.join("model.sig")).expect("sig")
    );
    // re-pack over the signed package (another knot id), keep the old model.sig
    let sig = std::fs::read(out.join("model.sig")).expect("sig");
    let mut opts = gkq_pack::PackOptions::new(fixtures::committed_tiny(), &out);
    opts.dtypes = vec![gkq_format::DType::F16];
    opts.force = true;
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("repack");
    std::fs::write(out.join("model.sig"), sig).expect("stale sig");
    let o = upload("tiny/v2");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("re-sign the package"),
        "{err}"
    );
    assert!(
        !s3.data().join("models/tiny/v2").exists(),
        "nothing uploaded"
    );
    // issue 42, item 1: a package signed as one name is not published under another
    gkq_sign::sign_named(&out, &k, Some("tiny/v3")).expect("sign named");
    let o = upload("other/v3");
    let err: serde_json::Value = serde_json::from_slice(&o.stderr).expect("--json: one object");
    let message = err["error"]["message"].as_str().unwrap_or("");
    assert!(
        !o.status.success()
            && message.contains("signed as \"tiny/v3\"")
            && message.contains("\"other/v3\"")
            && err["error"]["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("model.sig")),
        "{err}"
    );
    // issue 57, J5: a prefix that only ends with the name is not the name
    let o = upload("models-eu/tiny/v3");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("but the prefix is")
            && err.contains("models-eu/tiny/v3"),
        "a prefix that ends with the name: {err}"
    );
    assert!(
        upload("tiny/v3").status.success(),
        "the prefix that is the name"
    );
    // issue 42, item 2: model.sig a FIFO is refused at once, not waited on
    std::fs::remove_file(out.join("model.sig")).expect("rm");
    fixtures::fifo(&out.join("model.sig"));
    let o = fixtures::output_within(&mut upload_to(&out, &s3, "tiny/v4"), 120);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("a FIFO, not a regular file"),
        "{err}"
    );
    assert!(
        !s3.data().join("models/tiny/v4").exists(),
        "nothing uploaded"
    );
    drop(tmp);
}

/// A regional mirror in a bucket of its own (issue 32, item 3): a package
/// published at one URL, given to the upload by its knot URL, is copied by
/// gkq-mirror's engine (verified against the knot and the publisher's key)
/// and published through the same upload path; the copy serves a node. An
/// origin serving a wrong row file is refused, and nothing is uploaded.
#[test]
fn a_published_package_is_mirrored_into_another_bucket() {
    use p256::pkcs8::{EncodePublicKey, LineEnding};
    use sha2::Digest;
    let (tmp, out, s3) = packed_and_s3();
    let key =
        p256::ecdsa::SigningKey::from_slice(&sha2::Sha256::digest(b"publisher")).expect("key");
    gkq_sign::sign_package(&out, &key).expect("sign");
    let public_key = tmp.path().join("pub.pem");
    let pem = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .expect("pem");
    std::fs::write(&public_key, pem).expect("write");
    // the origin: another site serving the package
    let www = tmp.path().join("www/m");
    std::fs::create_dir_all(&www).expect("www");
    for e in std::fs::read_dir(&out).expect("out") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, www.join(p.file_name().expect("name"))).expect("copy");
    }
    let origin = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx-origin"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let bucket = Nginx::start(
        s3.data(),
        &tmp.path().join("nginx-bucket"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let staging = tmp.path().join("staging");
    let upload = |prefix: &str| {
        upload_to(format!("{}/m/model.knot", origin.url()), &s3, prefix)
            .arg("--staging")
            .arg(&staging)
            .arg("--trust-key")
            .arg(&public_key)
            .args([
                "--public-url",
                &format!("{}/models/{prefix}", bucket.url()),
                "--json",
            ])
            .output()
            .expect("run xtask upload")
    };
    let o = upload("eu/m");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for e in std::fs::read_dir(&out).expect("out") {
        let p = e.expect("entry").path();
        let name = p.file_name().expect("name");
        let copy = s3.data().join("models/eu/m").join(name);
        assert!(
            std::fs::read(&p).expect("origin") == std::fs::read(&copy).expect("bucket"),
            "{name:?}"
        );
    }
    // an origin that now serves a flipped row: refused before any upload
    let rows = www.join("token_embd.f32.rows");
    let mut b = std::fs::read(&rows).expect("rows");
    b[100] ^= 1;
    std::fs::write(&rows, b).expect("write");
    std::fs::remove_dir_all(&staging).expect("fresh staging");
    let o = upload("eu/bad");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("cannot copy") && err.contains("token_embd.f32.rows"),
        "{err}"
    );
    assert!(
        !s3.data().join("models/eu/bad").exists(),
        "nothing uploaded"
    );
}
