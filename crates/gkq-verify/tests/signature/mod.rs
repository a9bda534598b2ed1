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

/// Issue 42, items 2 and 3: the signature path and the trusted key are
/// regular files whose length is checked before a byte is read. A 1 GiB
/// model.sig is refused at once (it cost 1.05 GB of memory), a model.sig
/// that is a link to /dev/zero or a FIFO is refused (one read until memory
/// ran out, the other hung), and so is --trust-key /dev/zero (22.9 GB).
#[test]
fn hostile_signature_and_key_files_are_refused_at_once() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let keys = p.out.parent().expect("tmp").join("keys");
    fs::create_dir_all(&keys).expect("keys");
    let (k, _, public) = key_files(&keys, "publisher");
    gkq_sign::sign_package(&p.out, &k).expect("sign");
    let sig = p.out.join("model.sig");
    let run = |key: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_gkq-verify"));
        c.args([s(&p.out), "--trust-key", key]);
        fixtures::output_within(&mut c, 60)
    };
    fs::remove_file(&sig).expect("rm");
    let f = fs::File::create(&sig).expect("big");
    f.set_len(1 << 30).expect("sparse 1 GiB");
    drop(f);
    fails_with(
        &run(s(&public)),
        &[
            "model.sig",
            "1073741824 bytes, over the limit of 4194304 bytes for a signature object",
        ],
    );
    fs::remove_file(&sig).expect("rm");
    std::os::unix::fs::symlink("/dev/zero", &sig).expect("link");
    fails_with(
        &run(s(&public)),
        &["model.sig", "a symbolic link, not a regular file"],
    );
    fs::remove_file(&sig).expect("rm");
    fixtures::fifo(&sig);
    fails_with(
        &run(s(&public)),
        &["model.sig", "a FIFO, not a regular file"],
    );
    let out = run("/dev/zero");
    assert_eq!(
        out.status.code(),
        Some(2),
        "a bad --trust-key is a usage error"
    );
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("/dev/zero") && text.contains("a device, not a regular file"),
        "{text}"
    );
}

/// Issue 57, J1 and J15: a package signed for another name is refused by
/// gkq-verify as a node refuses it, naming both names: model B signed
/// `b/v1` served at `…/models/a/v1/` (`gkq-verify URL`), and copied into a
/// directory `…/models/a/v1` (`gkq-verify DIR`); `--package` names the
/// package asked for; a package whose place matches its name passes and
/// says which name it carries.
#[test]
fn a_signature_for_another_name_is_refused_naming_both() {
    let p = packed("qwen2-tiny-f32", &["f32"]);
    let tmp = p.out.parent().expect("tmp");
    let keys = tmp.join("keys");
    fs::create_dir_all(&keys).expect("keys");
    let (k, _, public) = key_files(&keys, "publisher");
    gkq_sign::sign_named(&p.out, &k, Some("b/v1")).expect("sign as b/v1");
    let www = tmp.join("www");
    let copy_to = |dir: &std::path::Path| {
        fs::create_dir_all(dir).expect("dir");
        for e in fs::read_dir(&p.out).expect("out") {
            let e = e.expect("entry");
            fs::copy(e.path(), dir.join(e.file_name())).expect("copy");
        }
    };
    let (a, b) = (www.join("models/a/v1"), www.join("models/b/v1"));
    copy_to(&a);
    copy_to(&b);
    // J15: a local directory whose path does not end with the signed name
    fails_with(
        &verify(&[s(&a), "--trust-key", s(&public)]),
        &["signature\tFAIL", "\"b/v1\"", "models/a/v1"],
    );
    fails_with(
        &verify(&[s(&b), "--trust-key", s(&public), "--package", "a/v1"]),
        &["signature\tFAIL", "\"b/v1\"", "package \"a/v1\""],
    );
    let out = verify(&[s(&b), "--trust-key", s(&public)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("as package \"b/v1\""),
        "{text}"
    );
    // J1: gkq-verify URL holds the signature to the URL's whole path
    let nginx = Nginx::start(&www, &tmp.join("nginx"), &NginxOptions::default()).expect("nginx");
    let at = |m: &str| format!("{}/models/{m}/v1/model.knot", nginx.url());
    fails_with(
        &verify(&[&at("a"), "--trust-key", s(&public)]),
        &["signature\tFAIL", "\"b/v1\"", "package \"models/a/v1\""],
    );
    // J5's rule: b/v1 only ends the path /models/b/v1: not the name asked for
    fails_with(
        &verify(&[&at("b"), "--trust-key", s(&public)]),
        &["signature\tFAIL", "\"b/v1\"", "package \"models/b/v1\""],
    );
    let out = verify(&[&at("b"), "--trust-key", s(&public), "--package", "b/v1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
