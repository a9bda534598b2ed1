//! `gkq-verify --trust-key` (issue 31): the package against its model.sig,
//! signed by gkq-sign or by `model_signing sign key`; locally and, with
//! --url, the published signature object on nginx.

use std::fs;
use std::process::Command;

use fixtures::servers::{Nginx, NginxOptions};
use p256::ecdsa::SigningKey;
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use sha2::{Digest, Sha256};

use super::{fails_with, packed, s, verify};

/// A key from a seed, with its PEM files in `dir`: (private, public).
fn key_files(
    dir: &std::path::Path,
    seed: &str,
) -> (SigningKey, std::path::PathBuf, std::path::PathBuf) {
    let k = SigningKey::from_slice(&Sha256::digest(seed.as_bytes())).expect("scalar");
    let private = dir.join(format!("{seed}.pem"));
    let public = dir.join(format!("{seed}.pub.pem"));
    fs::write(
        &private,
        k.to_pkcs8_pem(LineEnding::LF).expect("pem").as_bytes(),
    )
    .expect("write");
    fs::write(
        &public,
        k.verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .expect("pem"),
    )
    .expect("write");
    (k, private, public)
}

#[test]
fn trust_key_checks_gkq_and_model_signing_signatures() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let keys = p.out.parent().expect("tmp").join("keys");
    fs::create_dir_all(&keys).expect("keys");
    let (k, private, public) = key_files(&keys, "publisher");
    let (_, _, other) = key_files(&keys, "other");
    // unsigned: the signature check fails, naming the file
    fails_with(
        &verify(&[s(&p.out), "--trust-key", s(&public)]),
        &["signature\tFAIL", "model.sig"],
    );
    gkq_sign::sign_package(&p.out, &k).expect("sign");
    let out = verify(&[s(&p.out), "--trust-key", s(&public)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let hint = gkq_format::sig::PublicKey::from_pem(&fs::read_to_string(&public).expect("pem"))
        .expect("key");
    assert!(
        text.contains(&format!("signed by key {}", hint.hint())),
        "{text}"
    );
    // rotation: either key; a foreign key alone fails
    assert!(
        verify(&[
            s(&p.out),
            "--trust-key",
            s(&other),
            "--trust-key",
            s(&public)
        ])
        .status
        .success()
    );
    fails_with(
        &verify(&[s(&p.out), "--trust-key", s(&other)]),
        &["which is not trusted"],
    );
    // a key in the wrong format stops verification (exit 2), named
    let bad = verify(&[s(&p.out), "--trust-key", s(&private)]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("this is a private key"));
    // the published signature, on nginx, must sign this knot too
    let www = p.out.parent().expect("tmp");
    let nginx = Nginx::start(www, &www.join("nginx"), &NginxOptions::default()).expect("nginx");
    let base = format!("{}/out", nginx.url());
    assert!(
        verify(&[s(&p.out), "--url", &base, "--trust-key", s(&public)])
            .status
            .success()
    );
    // model_signing's own signature of the same directory
    let oms = Command::new("python3")
        .args([
            "-m",
            "model_signing",
            "sign",
            "key",
            "--private_key",
            s(&private),
            "--signature",
        ])
        .arg(p.out.join("model.sig"))
        .arg(&p.out)
        .output()
        .expect("python3 (scripts/install-test-deps.sh installs model-signing)");
    assert!(
        oms.status.success(),
        "{}",
        String::from_utf8_lossy(&oms.stderr)
    );
    let out = verify(&[s(&p.out), "--trust-key", s(&public)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("a model_signing signature"),
        "{text}"
    );
    // the published one (model_signing's names no knot id) fails --url's check
    fails_with(
        &verify(&[s(&p.out), "--url", &base, "--trust-key", s(&public)]),
        &["names no knot id"],
    );
}
