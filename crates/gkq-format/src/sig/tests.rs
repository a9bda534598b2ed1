#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

use p256::ecdsa::SigningKey;
use p256::ecdsa::signature::Signer as _;

use super::*;

/// The fixed test key of FORMAT.md's golden vector: the scalar
/// SHA-256("gkq test key, never a real one").
pub(crate) fn test_key() -> SigningKey {
    let scalar = Sha256::digest(b"gkq test key, never a real one");
    SigningKey::from_slice(&scalar).expect("a valid scalar")
}

fn other_key() -> SigningKey {
    SigningKey::from_slice(&Sha256::digest(b"another key")).expect("a valid scalar")
}

fn sign_with(key: &SigningKey, payload: &[u8]) -> Vec<u8> {
    let sig: Signature = key.sign(&pae(payload));
    let hint = PublicKey::from_key(*key.verifying_key()).hint;
    bundle(payload, sig.to_der().as_bytes(), &hint)
}

fn golden_resources() -> Vec<Resource> {
    vec![
        Resource {
            name: "model.knot".into(),
            digest: Sha256::digest(b"knot").into(),
        },
        Resource {
            name: "config.json".into(),
            digest: Sha256::digest(b"{}").into(),
        },
    ]
}

fn golden_id() -> KnotId {
    KnotId::from_digest([0x11; 32])
}

fn trusted() -> Vec<PublicKey> {
    vec![PublicKey::from_key(*test_key().verifying_key())]
}

fn failure(r: Result<Signed>) -> SigFailure {
    match r {
        Err(Error::Signature(f)) => f,
        other => panic!("expected a signature failure, got {other:?}"),
    }
}

/// FORMAT.md section 7c's golden vector.
#[test]
fn golden_vector() {
    let key = test_key();
    let public = PublicKey::from_key(*key.verifying_key());
    assert_eq!(
        public.hint(),
        "bcca927caa629af17d4518443902b727872655d6ab85ad367e645ef6f76a744a",
        "{}",
        key.verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .expect("pem")
    );
    let payload = statement("tiny", &golden_resources(), golden_id());
    let text = String::from_utf8(payload.clone()).expect("utf8");
    assert_eq!(
        text,
        r#"{"_type":"https://in-toto.io/Statement/v1","predicate":{"gkq":{"knot_id":"1111111111111111111111111111111111111111111111111111111111111111"},"resources":[{"algorithm":"sha256","digest":"44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","name":"config.json"},{"algorithm":"sha256","digest":"ec580d1e235cba2089cc0dc6227dd70793d586408b40a132c84cf63ae17bb2d2","name":"model.knot"}],"serialization":{"allow_symlinks":false,"hash_type":"sha256","ignore_paths":[".git",".gitattributes",".github",".gitignore","model.sig"],"method":"files"}},"predicateType":"https://model_signing/signature/v1.0","subject":[{"digest":{"sha256":"5156d1c237be82636f8031df49c5ee54810597b3f16f60d62ffe243696b238aa"},"name":"tiny"}]}"#
    );
    let b = sign_with(&key, &payload);
    assert_eq!(
        crate::hex(&Sha256::digest(&b)),
        "f0150c7eea72b362e272a4d006a82dbf1deaccd4b917edb190cfa853d4cceff5",
        "{}",
        String::from_utf8_lossy(&b)
    );
    if std::env::var_os("GKQ_PRINT_GOLDEN").is_some() {
        println!("{}", String::from_utf8_lossy(&b));
    }
    let signed = open(&b, &trusted()).expect("the golden bundle opens");
    assert_eq!(signed.signer, public.hint());
    assert_eq!(signed.name, "tiny");
    assert_eq!(signed.resources[0].name, "config.json");
    signed.check_knot(golden_id()).expect("signs the knot");
}

#[test]
fn another_key_and_a_spoofed_hint_are_refused() {
    let payload = statement("tiny", &golden_resources(), golden_id());
    let theirs = sign_with(&other_key(), &payload);
    let hint = PublicKey::from_key(*other_key().verifying_key()).hint;
    assert_eq!(
        failure(open(&theirs, &trusted())),
        SigFailure::UnknownKey { hint }
    );
    // the attacker's signature under the trusted key's hint
    let mine = PublicKey::from_key(*test_key().verifying_key()).hint;
    let sig: Signature = other_key().sign(&pae(&payload));
    let spoofed = bundle(&payload, sig.to_der().as_bytes(), &mine);
    assert_eq!(
        failure(open(&spoofed, &trusted())),
        SigFailure::BadSignature { hint: Some(mine) }
    );
    // rotation: both keys trusted, the old key's signature is accepted
    let both = [
        trusted(),
        vec![PublicKey::from_key(*other_key().verifying_key())],
    ]
    .concat();
    open(&theirs, &both).expect("a rotated-in key is trusted");
}

#[test]
fn another_knot_and_no_knot_are_refused() {
    let payload = statement("tiny", &golden_resources(), golden_id());
    let signed = open(&sign_with(&test_key(), &payload), &trusted()).expect("opens");
    let other = KnotId::from_digest([0x22; 32]);
    assert!(matches!(
        signed.check_knot(other),
        Err(Error::Signature(SigFailure::OtherKnot { .. }))
    ));
    let mut doc: Value = serde_json::from_slice(&payload).expect("json");
    doc["predicate"]
        .as_object_mut()
        .expect("object")
        .remove("gkq");
    let bare = serde_json::to_vec(&doc).expect("json");
    let signed = open(&sign_with(&test_key(), &bare), &trusted()).expect("an OMS statement opens");
    assert!(matches!(
        signed.check_knot(golden_id()),
        Err(Error::Signature(SigFailure::NoKnotId))
    ));
}

fn edited(edit: impl Fn(&mut Value)) -> Vec<u8> {
    let payload = statement("tiny", &golden_resources(), golden_id());
    let mut doc: Value = serde_json::from_slice(&sign_with(&test_key(), &payload)).expect("json");
    edit(&mut doc);
    serde_json::to_vec(&doc).expect("json")
}

fn restated(edit: impl Fn(&mut Value)) -> Vec<u8> {
    let payload = statement("tiny", &golden_resources(), golden_id());
    let mut doc: Value = serde_json::from_slice(&payload).expect("json");
    edit(&mut doc);
    sign_with(&test_key(), &serde_json::to_vec(&doc).expect("json"))
}

#[test]
fn envelopes_and_statements_that_break_a_rule() {
    let b = sign_with(
        &test_key(),
        &statement("tiny", &golden_resources(), golden_id()),
    );
    let two = edited(|d| {
        let s = d["dsseEnvelope"]["signatures"][0].clone();
        d["dsseEnvelope"]["signatures"] = json!([s.clone(), s]);
    });
    assert_eq!(failure(open(&two, &trusted())), SigFailure::Signatures(2));
    let none = edited(|d| d["dsseEnvelope"]["signatures"] = json!([]));
    assert_eq!(failure(open(&none, &trusted())), SigFailure::Signatures(0));
    let media = edited(|d| d["mediaType"] = json!("application/json"));
    assert!(matches!(
        failure(open(&media, &trusted())),
        SigFailure::Field {
            field: "mediaType",
            ..
        }
    ));
    let ptype = edited(|d| d["dsseEnvelope"]["payloadType"] = json!("text/plain"));
    assert!(matches!(
        failure(open(&ptype, &trusted())),
        SigFailure::Field {
            field: "payloadType",
            ..
        }
    ));
    assert!(matches!(
        failure(open(&b[..b.len() / 2], &trusted())),
        SigFailure::Malformed(_)
    ));
    assert!(matches!(
        failure(open(b"\x00garbage", &trusted())),
        SigFailure::Malformed(_)
    ));
    let extra = restated(|d| {
        let s = d["subject"][0].clone();
        d["subject"] = json!([s.clone(), s]);
    });
    assert_eq!(failure(open(&extra, &trusted())), SigFailure::Subjects(2));
    let missing = restated(|d| d["subject"] = json!([]));
    assert_eq!(failure(open(&missing, &trusted())), SigFailure::Subjects(0));
    let dropped = restated(|d| {
        d["predicate"]["resources"]
            .as_array_mut()
            .expect("array")
            .pop();
    });
    assert!(matches!(
        failure(open(&dropped, &trusted())),
        SigFailure::Inconsistent { .. }
    ));
    // a statement edited after signing
    let tampered = edited(|d| {
        let other = statement("tiny", &golden_resources(), KnotId::from_digest([0x22; 32]));
        d["dsseEnvelope"]["payload"] = json!(STANDARD.encode(other));
    });
    assert_eq!(
        failure(open(&tampered, &trusted())),
        SigFailure::BadSignature {
            hint: Some(trusted()[0].hint.clone())
        }
    );
}

#[test]
fn keys_in_the_wrong_format_are_refused() {
    let private = "-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n";
    for pem in [
        private,
        "not a key",
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
    ] {
        assert!(
            matches!(
                PublicKey::from_pem(pem),
                Err(Error::Signature(SigFailure::KeyFormat(_)))
            ),
            "{pem}"
        );
    }
    let pem = test_key()
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .expect("pem");
    assert_eq!(
        PublicKey::from_pem(&pem).expect("a public key"),
        trusted()[0]
    );
}

#[test]
fn resources_sort_by_path_component() {
    let mut r: Vec<Resource> = ["a.txt", "a/b", "b"]
        .iter()
        .map(|n| Resource {
            name: (*n).into(),
            digest: [0; 32],
        })
        .collect();
    sort_resources(&mut r);
    let names: Vec<&str> = r.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a/b", "a.txt", "b"]);
}

/// Issue 42's spec decisions (FORMAT.md 9b, round 5), each a mutation of
/// the golden statement that is refused: a knot id or digest not in the
/// canonical form, resources out of order or twice, a serialization that
/// is not by files with sha256, a package name that is not one or that
/// the subject does not carry. `keyid` is ignored, whatever it holds.
#[test]
fn round_5_statement_decisions() {
    let malformed = |b: Vec<u8>, what: &str| match failure(open(&b, &trusted())) {
        SigFailure::Malformed(m) => assert!(m.contains(what), "{what}: {m}"),
        other => panic!("{what}: {other:?}"),
    };
    let id = golden_id().to_string();
    malformed(
        restated(|d| d["predicate"]["gkq"]["knot_id"] = json!(format!("{id} "))),
        "is not 64 hex digits",
    );
    malformed(
        restated(|d| d["predicate"]["gkq"]["knot_id"] = json!("AB".repeat(32))),
        "is not 64 hex digits",
    );
    let upper = restated(|d| {
        let r = &mut d["predicate"]["resources"][0]["digest"];
        *r = json!(r.as_str().expect("digest").to_ascii_uppercase());
    });
    malformed(upper, "is not 64 hex digits");
    let swapped = restated(|d| {
        d["predicate"]["resources"]
            .as_array_mut()
            .expect("array")
            .swap(0, 1);
    });
    malformed(swapped, "not sorted by path component");
    let twice = restated(|d| {
        let r = d["predicate"]["resources"][0].clone();
        d["predicate"]["resources"] = json!([r.clone(), r]);
    });
    malformed(twice, "twice");
    malformed(
        restated(|d| d["predicate"]["serialization"]["method"] = json!("shards")),
        "serialization.method",
    );
    malformed(
        restated(|d| {
            d["predicate"]
                .as_object_mut()
                .expect("object")
                .remove("serialization");
        }),
        "no predicate.serialization",
    );
    malformed(
        restated(|d| d["predicate"]["gkq"]["name"] = json!("m/../v1")),
        "predicate.gkq.name",
    );
    malformed(
        restated(|d| d["predicate"]["gkq"]["name"] = json!("other/v1")),
        "is not the package name",
    );
    for keyid in [json!("anything"), json!(null)] {
        let b = edited(|d| d["dsseEnvelope"]["signatures"][0]["keyid"] = keyid.clone());
        assert!(open(&b, &trusted()).is_ok(), "keyid {keyid}");
    }
    let named = statement_for("tiny", &golden_resources(), golden_id(), Some("tiny/v1"));
    let signed = open(&sign_with(&test_key(), &named), &trusted()).expect("named");
    assert_eq!(signed.package.as_deref(), Some("tiny/v1"));
    assert_eq!(signed.name, "tiny/v1");
}

/// Issue 57 (a gap the second reader of FORMAT.md found): `"name": null`
/// is malformed, not an unnamed statement, and so is a name of another
/// JSON type; a name absent is unnamed.
#[test]
fn a_null_package_name_is_malformed() {
    for name in [json!(null), json!(7), json!(["a/v1"])] {
        let b = restated(|d| d["predicate"]["gkq"]["name"] = name.clone());
        match failure(open(&b, &trusted())) {
            SigFailure::Malformed(m) => assert!(m.contains("predicate.gkq.name"), "{name}: {m}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    let b = restated(|d| {
        d["predicate"]["gkq"]
            .as_object_mut()
            .expect("object")
            .remove("name");
    });
    assert_eq!(open(&b, &trusted()).expect("unnamed").package, None);
}

/// Issue 58: a key of another kind is named as that kind (an RSA key was
/// reported as "unsupported OID 1.2.840.10045.2.1", the EC OID).
#[test]
fn a_key_of_another_kind_is_named() {
    for (pem, kind) in [
        (
            r"-----BEGIN PUBLIC KEY-----
MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQC/3EFSb9xqCHzk2kgLxLS8mF7B
CV5DR+h4WpWVvQdYcuO22f3hm0eCZwcA0vjOr+2pc8VBcgVU7Lxktn5TPWcn9cTE
BjUoBrz7RkyvV8TSTf3p+6Rpy1QF5p8pbCfzFeX31tSj/cvOBtqu3JfWfK0FVAlR
YEbpxcMR0/LL/6GLHQIDAQAB
-----END PUBLIC KEY-----",
            "this is an RSA key",
        ),
        (
            r"-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAfANd7yQFzoSuPbQ2ojsxpvymdCzLsUEzfFh+T9hP3Z0=
-----END PUBLIC KEY-----",
            "this is an Ed25519 key",
        ),
        (
            r"-----BEGIN PUBLIC KEY-----
MHYwEAYHKoZIzj0CAQYFK4EEACIDYgAEf0wVKQrACoFjlavjnF2oDnHGLex51S3e
2vZ3icPCzXC4u86lDd+gYFkD+yx9QIVImUD+3c5oZ/chsu5f9cvCJUGyPfbL9pcP
WmSx7GuBnL3/CQq0hjrlajeE5HNXRBER
-----END PUBLIC KEY-----",
            "this is an EC key on P-384",
        ),
    ] {
        let e = PublicKey::from_pem(pem).expect_err("not P-256").to_string();
        assert!(e.contains(kind) && e.contains("prime256v1"), "{e}");
    }
}
