//! `gkq-verify URL` (issue 47 item 4): a published package checked in
//! place, with no local copy: it passes when clean (knot URL or base URL,
//! signature with --trust-key), and fails naming the object on each kind
//! of damage the suite builds locally (a knot payload, a row, a proof, a
//! warm object, a companion, a missing row file, a wrong Content-Length,
//! a foreign signature).

use std::fs;
use std::path::Path;

use fixtures::servers::NginxOptions;

use super::{Packed, fails_with, flip, packed_with, passes, serve, verify};

/// A package with f32 and bf16 row files, a warm object and a companion.
fn packed_full() -> Packed {
    let spec = fixtures::preset("qwen2-tiny-bf16").expect("preset");
    packed_with(&spec, |opts, tmp| {
        let ids = tmp.join("ids.txt");
        fs::write(&ids, "5 0 99 511 250 7").expect("ids");
        opts.dtypes = vec![gkq_format::DType::F32, gkq_format::DType::BF16];
        opts.warm.ids = Some(ids);
    })
}

/// The package published (with `damage` done to the copy nginx serves)
/// and checked at its knot URL: the output.
fn check_published(p: &Packed, damage: impl FnOnce(&Path), extra: &[&str]) -> std::process::Output {
    let (nginx, _www) = serve(p, &NginxOptions::default(), damage);
    let url = format!("{}/v1/model.knot", nginx.url());
    let mut args = vec![url.as_str()];
    args.extend_from_slice(extra);
    verify(&args)
}

#[test]
fn a_clean_published_package_passes_at_its_knot_or_base_url() {
    let p = packed_full();
    let (nginx, _www) = serve(&p, &NginxOptions::default(), |_| {});
    for url in [
        format!("{}/v1/model.knot", nginx.url()),
        format!("{}/v1/", nginx.url()),
        format!("{}/v1", nginx.url()),
    ] {
        let out = verify(&[&url, "--sample-rows", "4"]);
        passes(&out);
        let text = String::from_utf8_lossy(&out.stdout);
        for check in [
            "knot\tPASS",
            "columnar\tPASS",
            "package\tPASS",
            "remote\tPASS",
        ] {
            assert!(text.contains(check), "{check}: {text}");
        }
        assert!(text.contains("2 warm objects"), "{text}");
    }
    // the temporary copy is gone afterwards; --url with a URL is refused
    let out = verify(&[
        &format!("{}/v1/", nginx.url()),
        "--url",
        &format!("{}/v1", nginx.url()),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("leave --url out"));
}

/// Damage done to the published copy.
type Damage = Box<dyn FnOnce(&Path)>;

#[test]
fn each_tampered_published_object_is_named() {
    let p = packed_full();
    let cases: Vec<(&str, Damage, Vec<&str>)> = vec![
        (
            "a byte of a row",
            Box::new(|d: &Path| flip(&d.join("token_embd.f32.rows"), 4 * 64 * 3 + 1)),
            vec!["token_embd.f32.rows", "row 3"],
        ),
        (
            "a knot payload byte",
            Box::new(|d: &Path| {
                let len = fs::metadata(d.join("model.knot")).expect("knot").len();
                flip(&d.join("model.knot"), len as usize - 9);
            }),
            vec!["knot\tFAIL"],
        ),
        (
            "a proof object",
            Box::new(|d: &Path| flip(&d.join("token_embd.bf16.rows.proof"), 7)),
            vec!["token_embd.bf16.rows.proof"],
        ),
        (
            "a warm object",
            Box::new(|d: &Path| flip(&d.join("token_embd.bf16.rows.warm"), 40)),
            vec!["token_embd.bf16.rows.warm"],
        ),
        (
            "a companion",
            Box::new(|d: &Path| fs::write(d.join("config.json"), b"{}").expect("write")),
            vec!["config.json"],
        ),
        (
            "a missing row file",
            Box::new(|d: &Path| fs::remove_file(d.join("token_embd.bf16.rows")).expect("rm")),
            vec!["token_embd.bf16.rows", "missing"],
        ),
        (
            "a row file one byte short",
            Box::new(|d: &Path| {
                let f = d.join("token_embd.f32.rows");
                let b = fs::read(&f).expect("rows");
                fs::write(&f, &b[..b.len() - 1]).expect("write");
            }),
            vec!["token_embd.f32.rows"],
        ),
    ];
    for (what, damage, needles) in cases {
        println!("{what}");
        fails_with(
            &check_published(&p, damage, &["--sample-rows", "4"]),
            &needles,
        );
    }
    // a missing object is named by its URL, not by the temporary copy's
    // path (issue 58)
    let out = check_published(
        &p,
        Box::new(|d: &Path| fs::remove_file(d.join("config.json")).expect("rm")),
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("/v1/config.json"), "{text}");
    assert!(!text.contains("gkq-verify-"), "{text}");
}

#[test]
fn a_published_signature_is_checked_with_trust_key() {
    let p = packed_full();
    let keys = p.out.parent().expect("tmp").join("keys");
    fs::create_dir_all(&keys).expect("keys");
    let key = |seed: &str| {
        use p256::pkcs8::{EncodePublicKey, LineEnding};
        use sha2::Digest;
        let k = p256::ecdsa::SigningKey::from_slice(&sha2::Sha256::digest(seed.as_bytes()))
            .expect("scalar");
        let public = keys.join(format!("{seed}.pub.pem"));
        let pem = k
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .expect("pem");
        fs::write(&public, pem.as_bytes()).expect("write");
        (k, public)
    };
    let (k, public) = key("publisher");
    let (_, other) = key("other");
    gkq_sign::sign_package(&p.out, &k).expect("sign");
    let trust = public.to_str().expect("utf-8");
    passes(&check_published(&p, |_| {}, &["--trust-key", trust]));
    fails_with(
        &check_published(&p, |_| {}, &["--trust-key", other.to_str().expect("utf-8")]),
        &["signature\tFAIL", "which is not trusted"],
    );
    fails_with(
        &check_published(
            &p,
            |d: &Path| fs::remove_file(d.join("model.sig")).expect("rm"),
            &["--trust-key", trust],
        ),
        &["signature\tFAIL", "model.sig"],
    );
}

#[test]
fn an_unreachable_package_stops_with_its_url() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let url = format!("http://127.0.0.1:{port}/v1/model.knot");
    let out = verify(&[&url, "--timeout", "2"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&url) && err.contains("cannot fetch the package"),
        "{err}"
    );
}

/// Issue 58: on a terminal, a bar while the package is copied and checked;
/// none with --quiet.
#[test]
fn a_published_check_shows_a_bar_on_a_terminal() {
    let p = packed_full();
    let (nginx, _www) = serve(&p, &NginxOptions::default(), |_| {});
    let url = format!("{}/v1/model.knot", nginx.url());
    let bin = env!("CARGO_BIN_EXE_gkq-verify");
    let shown = fixtures::on_terminal(bin, &[&url]);
    assert!(
        shown.contains("verify ") && shown.contains("KiB"),
        "{shown}"
    );
    assert!(!fixtures::on_terminal(bin, &[&url, "--quiet"]).contains("KiB"));
}
