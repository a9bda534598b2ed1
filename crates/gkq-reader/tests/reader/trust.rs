//! Signed releases on a node (issue 31): with a trust policy, a package is
//! used only when its model.sig signs its knot id with a trusted key, or
//! its id is pinned. Each attack is served by nginx on 127.0.0.1.

use std::fs;
use std::path::{Path, PathBuf};

use fixtures::servers::{Nginx, NginxOptions};
use gkq_format::sig::{self, PublicKey, SigFailure};
use gkq_format::{DType, Error as FormatError, KnotId};
use gkq_reader::{CacheConfig, Reader, ReaderConfig, ReaderError, Serve, Trusted};
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::{Signature, SigningKey};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn key(seed: &str) -> SigningKey {
    SigningKey::from_slice(&Sha256::digest(seed.as_bytes())).expect("scalar")
}

fn public(k: &SigningKey) -> PublicKey {
    PublicKey::from_key(*k.verifying_key())
}

struct Site {
    tmp: tempfile::TempDir,
    nginx: Nginx,
}

impl Site {
    fn dir(&self, pkg: &str) -> PathBuf {
        self.tmp.path().join("www").join(pkg)
    }
    fn knot(&self, pkg: &str) -> String {
        format!("{}/{pkg}/model.knot", self.nginx.url())
    }
}

/// Two packages of different models, `a` and `b`, both signed with key A.
fn site() -> Site {
    let tmp = tempfile::tempdir().expect("tmp");
    for (pkg, preset) in [("a", "qwen2-tiny-f32"), ("b", "llama-tiny-f32")] {
        let src = tmp.path().join(format!("src-{pkg}"));
        fixtures::write_model(&src, &fixtures::preset(preset).expect("preset")).expect("model");
        let out = tmp.path().join("www").join(pkg);
        let mut opts = gkq_pack::PackOptions::new(&src, &out);
        opts.dtypes = vec![DType::F32];
        gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
        gkq_sign::sign_package(&out, &key("A")).expect("sign");
    }
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("start nginx (scripts/install-test-deps.sh)");
    Site { tmp, nginx }
}

fn trusting(keys: &[&SigningKey], cache: Option<&Path>) -> ReaderConfig {
    ReaderConfig {
        trust: keys.iter().map(|k| public(k)).collect(),
        cache: CacheConfig {
            dir: cache.map(Path::to_path_buf),
            ..CacheConfig::default()
        },
        ..ReaderConfig::default()
    }
}

fn refusal(s: &Site, pkg: &str, config: ReaderConfig) -> ReaderError {
    Reader::open(&s.knot(pkg), config, Serve::NONE).expect_err("refused")
}

fn failure(e: &ReaderError) -> SigFailure {
    match e {
        ReaderError::Signature { error, .. } => match &**error {
            FormatError::Signature(f) => f.clone(),
            other => panic!("not a signature failure: {other}"),
        },
        other => panic!("not a signature refusal: {other}"),
    }
}

fn knot_id(dir: &Path) -> KnotId {
    gkq_sign::knot_id_of(dir).expect("knot id")
}

/// Signs `statement` (edited JSON) with `k` as `model.sig` of `dir`.
fn resign(dir: &Path, k: &SigningKey, edit: impl Fn(&mut Value)) {
    let files = gkq_sign::resources(dir).expect("files");
    let mut doc: Value =
        serde_json::from_slice(&sig::statement("x", &files, knot_id(dir))).expect("json");
    edit(&mut doc);
    let payload = serde_json::to_vec(&doc).expect("json");
    let s: Signature = k.sign(&sig::pae(&payload));
    let b = sig::bundle(&payload, s.to_der().as_bytes(), public(k).hint());
    fs::write(dir.join("model.sig"), b).expect("write");
}

#[test]
fn the_genuine_package_opens_cold_and_warm_with_one_request_more_then_none() {
    let s = site();
    let a = key("A");
    let plain = Reader::open(&s.knot("a"), ReaderConfig::default(), Serve::NONE).expect("open");
    assert_eq!(plain.knot().trusted(), &Trusted::Channel);
    let cache = s.tmp.path().join("cache");
    let cold =
        Reader::open(&s.knot("a"), trusting(&[&a], Some(&cache)), Serve::NONE).expect("signed");
    let hint = public(&a).hint().to_owned();
    assert_eq!(
        cold.knot().trusted(),
        &Trusted::Signed {
            signer: hint.clone(),
            cached: false,
            package: None,
        }
    );
    assert_eq!(
        cold.net_stats().requests,
        plain.net_stats().requests + 1,
        "one request for model.sig"
    );
    let warm =
        Reader::open(&s.knot("a"), trusting(&[&a], Some(&cache)), Serve::NONE).expect("warm");
    assert_eq!(
        warm.knot().trusted(),
        &Trusted::Signed {
            signer: hint,
            cached: true,
            package: None,
        }
    );
    assert_eq!(
        warm.net_stats().requests,
        plain.net_stats().requests,
        "no request for the signature"
    );
    // a pinned id with a warm cache: no request at all
    let pinned = ReaderConfig {
        knot_id: Some(knot_id(&s.dir("a"))),
        ..trusting(&[&a], Some(&cache))
    };
    let r = Reader::open(&s.knot("a"), pinned, Serve::NONE).expect("pinned");
    assert_eq!(r.net_stats().requests, 0);
    assert_eq!(r.knot().trusted(), &Trusted::Pinned);
}

/// A cached signature that no longer verifies (damaged on disk) is not
/// trusted: it is fetched again, checked once, and replaces the entry.
#[test]
fn a_damaged_cached_signature_is_fetched_again() {
    let s = site();
    let a = key("A");
    let cache = s.tmp.path().join("cache");
    let open = || Reader::open(&s.knot("a"), trusting(&[&a], Some(&cache)), Serve::NONE);
    let cold = open().expect("cold");
    let entry = cache.join("v1/sig").join(knot_id(&s.dir("a")).to_string());
    let genuine = fs::read(&entry).expect("the cached signature");
    let mut damaged = genuine.clone();
    let mid = damaged.len() / 2;
    damaged[mid] ^= 1;
    fs::write(&entry, &damaged).expect("damage");
    let again = open().expect("fetched again");
    let signer = public(&a).hint().to_owned();
    let fetched = Trusted::Signed {
        signer: signer.clone(),
        cached: false,
        package: None,
    };
    assert_eq!(again.knot().trusted(), &fetched);
    assert_eq!(again.net_stats().requests, cold.net_stats().requests);
    assert_eq!(fs::read(&entry).expect("replaced"), genuine);
    let warm = open().expect("warm");
    assert_eq!(
        warm.knot().trusted(),
        &Trusted::Signed {
            signer,
            cached: true,
            package: None,
        }
    );
}

#[test]
fn another_key_a_spoofed_hint_and_rotation() {
    let s = site();
    let (a, b) = (key("A"), key("B"));
    gkq_sign::sign_package(&s.dir("b"), &b).expect("sign with B");
    let e = refusal(&s, "b", trusting(&[&a], None));
    assert_eq!(
        failure(&e),
        SigFailure::UnknownKey {
            hint: public(&b).hint().to_owned()
        },
        "{e}"
    );
    assert!(e.to_string().contains("not trusted"), "{e}");
    // rotation: both trusted, B's signature is accepted; B removed, refused
    let r = Reader::open(&s.knot("b"), trusting(&[&a, &b], None), Serve::NONE).expect("rotated");
    assert!(
        matches!(r.knot().trusted(), Trusted::Signed { signer, .. } if signer == public(&b).hint())
    );
    assert!(matches!(
        failure(&refusal(&s, "b", trusting(&[&a], None))),
        SigFailure::UnknownKey { .. }
    ));
    // B's signature under A's fingerprint
    let stmt = fs::read(s.dir("b").join("model.sig")).expect("sig");
    let mut doc: Value = serde_json::from_slice(&stmt).expect("json");
    doc["verificationMaterial"]["publicKey"]["hint"] = json!(public(&a).hint());
    fs::write(
        s.dir("b").join("model.sig"),
        serde_json::to_vec(&doc).expect("json"),
    )
    .expect("write");
    assert!(matches!(
        failure(&refusal(&s, "b", trusting(&[&a], None))),
        SigFailure::BadSignature { .. }
    ));
}

#[test]
fn a_replayed_signature_and_a_swapped_knot_are_another_package() {
    let s = site();
    let a = key("A");
    // a's genuine signature served at b's prefix
    fs::copy(s.dir("a").join("model.sig"), s.dir("b").join("model.sig")).expect("copy");
    let e = refusal(&s, "b", trusting(&[&a], None));
    assert!(matches!(failure(&e), SigFailure::OtherKnot { .. }), "{e}");
    assert!(e.to_string().contains("/b/model.sig"), "{e}");
    // issue 58: the refusal says how to re-sign
    assert!(e.to_string().contains("re-sign it with gkq-sign"), "{e}");
    // b's knot put in a's place, a's signature kept
    fs::copy(s.dir("b").join("model.knot"), s.dir("a").join("model.knot")).expect("copy");
    assert!(matches!(
        failure(&refusal(&s, "a", trusting(&[&a], None))),
        SigFailure::OtherKnot { .. }
    ));
}

#[test]
fn broken_bundles_and_statements_are_refused() {
    let s = site();
    let a = key("A");
    let path = s.dir("a").join("model.sig");
    let good = fs::read(&path).expect("sig");
    fs::write(&path, &good[..good.len() / 3]).expect("truncate");
    assert!(matches!(
        failure(&refusal(&s, "a", trusting(&[&a], None))),
        SigFailure::Malformed(_)
    ));
    fs::write(&path, b"\x89PNG garbage").expect("garbage");
    assert!(matches!(
        failure(&refusal(&s, "a", trusting(&[&a], None))),
        SigFailure::Malformed(_)
    ));
    let mut two: Value = serde_json::from_slice(&good).expect("json");
    let one = two["dsseEnvelope"]["signatures"][0].clone();
    two["dsseEnvelope"]["signatures"] = json!([one.clone(), one]);
    fs::write(&path, serde_json::to_vec(&two).expect("json")).expect("write");
    assert_eq!(
        failure(&refusal(&s, "a", trusting(&[&a], None))),
        SigFailure::Signatures(2)
    );
    resign(&s.dir("a"), &a, |d| {
        let x = d["subject"][0].clone();
        d["subject"] = json!([x.clone(), x]);
    });
    assert_eq!(
        failure(&refusal(&s, "a", trusting(&[&a], None))),
        SigFailure::Subjects(2)
    );
    resign(&s.dir("a"), &a, |d| d["subject"] = json!([]));
    assert_eq!(
        failure(&refusal(&s, "a", trusting(&[&a], None))),
        SigFailure::Subjects(0)
    );
    resign(&s.dir("a"), &a, |d| d["predicate"]["gkq"] = json!(null));
    assert_eq!(
        failure(&refusal(&s, "a", trusting(&[&a], None))),
        SigFailure::NoKnotId
    );
}

#[test]
fn unsigned_is_refused_unless_the_id_is_pinned() {
    let s = site();
    let a = key("A");
    fs::remove_file(s.dir("a").join("model.sig")).expect("unsign");
    let e = refusal(&s, "a", trusting(&[&a], None));
    assert!(
        matches!(&e, ReaderError::Unsigned { url, .. } if url.ends_with("/a/model.sig")),
        "{e}"
    );
    let pinned = ReaderConfig {
        knot_id: Some(knot_id(&s.dir("a"))),
        ..trusting(&[&a], None)
    };
    let r = Reader::open(&s.knot("a"), pinned, Serve::NONE).expect("the pin trusts it");
    assert_eq!(r.knot().trusted(), &Trusted::Pinned);
}
