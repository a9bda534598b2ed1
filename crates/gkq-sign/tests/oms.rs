//! Interoperability with OpenSSF Model Signing (the `model-signing` 1.1.1
//! package from PyPI, installed by scripts/install-test-deps.sh): a package
//! gkq-sign signed verifies with `model_signing verify key`, and one that
//! `model_signing sign key` signed verifies with gkq. Keys are made by
//! openssl, as a publisher would make them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

struct Keys {
    private: PathBuf,
    encrypted: PathBuf,
    public: PathBuf,
}

const PASSWORD: &str = "correct horse battery staple";

fn keys(dir: &Path, name: &str) -> Keys {
    let sec1 = dir.join(format!("{name}.sec1.pem"));
    let private = dir.join(format!("{name}.pem"));
    let encrypted = dir.join(format!("{name}.enc.pem"));
    let public = dir.join(format!("{name}.pub.pem"));
    let s = |p: &Path| p.to_str().expect("utf8").to_owned();
    run(Command::new("openssl").args([
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        &s(&sec1),
    ]));
    run(Command::new("openssl").args([
        "pkcs8",
        "-topk8",
        "-nocrypt",
        "-in",
        &s(&sec1),
        "-out",
        &s(&private),
    ]));
    let pass = format!("pass:{PASSWORD}");
    run(Command::new("openssl").args([
        "pkcs8",
        "-topk8",
        "-v2",
        "aes-256-cbc",
        "-in",
        &s(&sec1),
        "-out",
        &s(&encrypted),
        "-passout",
        &pass,
    ]));
    run(Command::new("openssl").args(["ec", "-in", &s(&sec1), "-pubout", "-out", &s(&public)]));
    Keys {
        private,
        encrypted,
        public,
    }
}

/// The committed tiny model, packed.
fn package(root: &Path) -> PathBuf {
    let out = root.join("tiny-v1");
    let opts = gkq_pack::PackOptions::new(fixtures::committed_tiny(), &out);
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    out
}

fn oms(args: &[&str]) -> Output {
    Command::new("python3")
        .args(["-m", "model_signing"])
        .args(args)
        .output()
        .expect("python3 (bash scripts/install-test-deps.sh installs model-signing)")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8")
}

#[test]
fn a_package_gkq_signs_verifies_with_model_signing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let k = keys(tmp.path(), "publisher");
    let pkg = package(tmp.path());
    // the encrypted key, its password in the environment
    let out = run(Command::new(env!("CARGO_BIN_EXE_gkq-sign"))
        .arg(&pkg)
        .arg("--key")
        .arg(&k.encrypted)
        .arg("--json")
        .env("GKQ_SIGN_PASSWORD", PASSWORD));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains(PASSWORD) && !text.contains("PRIVATE"),
        "{text}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let sig = pkg.join("model.sig");
    let verified = oms(&[
        "verify",
        "key",
        "--public_key",
        s(&k.public),
        "--signature",
        s(&sig),
        s(&pkg),
    ]);
    assert!(
        verified.status.success(),
        "model_signing refused gkq's signature: {}",
        String::from_utf8_lossy(&verified.stderr)
    );
    // the fingerprint is the one OMS writes for the same key
    let theirs = tmp.path().join("theirs.sig");
    let signed = oms(&[
        "sign",
        "key",
        "--private_key",
        s(&k.private),
        "--signature",
        s(&theirs),
        s(&pkg),
    ]);
    assert!(
        signed.status.success(),
        "{}",
        String::from_utf8_lossy(&signed.stderr)
    );
    let bundle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&theirs).expect("sig")).expect("json");
    assert_eq!(
        bundle["verificationMaterial"]["publicKey"]["hint"],
        report["signer"]
    );
    // a file changed after signing: both verifiers refuse
    std::fs::write(pkg.join("config.json"), b"{}").expect("tamper");
    assert!(
        !oms(&[
            "verify",
            "key",
            "--public_key",
            s(&k.public),
            "--signature",
            s(&sig),
            s(&pkg)
        ])
        .status
        .success()
    );
    let trusted = gkq_files::load_trusted_keys(std::slice::from_ref(&k.public)).expect("key");
    let e = gkq_sign::verify_package(&pkg, &trusted).expect_err("tampered");
    assert!(e.to_string().contains("config.json has sha256"), "{e}");
}

#[test]
fn a_package_model_signing_signs_verifies_with_gkq() {
    let tmp = tempfile::tempdir().expect("tmp");
    let k = keys(tmp.path(), "publisher");
    let pkg = package(tmp.path());
    for round in 0..4 {
        // OpenSSL's ECDSA nonces are random: several signatures (high and low s)
        let signed = oms(&[
            "sign",
            "key",
            "--private_key",
            s(&k.private),
            "--signature",
            s(&pkg.join("model.sig")),
            s(&pkg),
        ]);
        assert!(
            signed.status.success(),
            "{}",
            String::from_utf8_lossy(&signed.stderr)
        );
        let trusted = gkq_files::load_trusted_keys(std::slice::from_ref(&k.public)).expect("key");
        let r = gkq_sign::verify_package(&pkg, &trusted)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(r.knot_id, None, "OMS names no knot id");
        assert!(r.files >= 3, "{r:?}");
    }
    // another publisher's key is refused, with the signer's fingerprint
    let other = keys(tmp.path(), "other");
    let trusted = gkq_files::load_trusted_keys(&[other.public]).expect("key");
    let e = gkq_sign::verify_package(&pkg, &trusted).expect_err("foreign");
    assert!(e.to_string().contains("which is not trusted"), "{e}");
}

#[test]
fn keys_that_cannot_sign_are_refused_without_showing_them() {
    let tmp = tempfile::tempdir().expect("tmp");
    let k = keys(tmp.path(), "publisher");
    let pkg = package(tmp.path());
    let sign = |key: &Path, password: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_gkq-sign"));
        c.arg(&pkg)
            .arg("--key")
            .arg(key)
            .env_remove("GKQ_SIGN_PASSWORD");
        if let Some(p) = password {
            c.env("GKQ_SIGN_PASSWORD", p);
        }
        c.output().expect("spawn")
    };
    for (key, password, says) in [
        (&k.encrypted, None, "set its password in $GKQ_SIGN_PASSWORD"),
        (&k.encrypted, Some("wrong"), "cannot decrypt the key"),
        (&k.public, None, "not a PEM private key"),
    ] {
        let out = sign(key, password);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{err}");
        assert!(!err.contains("wrong\"") && !err.contains("BEGIN"), "{err}");
        assert!(!pkg.join("model.sig").exists(), "no signature left behind");
    }
    run(Command::new(env!("CARGO_BIN_EXE_gkq-sign"))
        .arg(&pkg)
        .arg("--key")
        .arg(&k.private));
    let trusted = gkq_files::load_trusted_keys(std::slice::from_ref(&k.public)).expect("key");
    gkq_sign::verify_package(&pkg, &trusted).expect("signed with the plain PKCS#8 key");
    let e = gkq_files::load_trusted_keys(std::slice::from_ref(&k.private))
        .expect_err("a private key is not a trust key");
    assert!(e.to_string().contains("this is a private key"), "{e}");
}
