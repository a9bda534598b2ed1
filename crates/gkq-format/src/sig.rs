//! The signature object of a package (docs/FORMAT.md section 7c): the
//! envelope OpenSSF Model Signing uses (a Sigstore bundle v0.3 holding a
//! DSSE envelope over an in-toto Statement, signed with an ECDSA P-256
//! key), whose predicate also names the knot id, so that a node checks it
//! with the knot header alone while `model_signing verify` checks every
//! file of the directory.
//!
//! This module parses, builds and checks the object's bytes; reading the
//! package's files and holding a private key are the callers' business.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use p256::ecdsa::signature::Verifier as _;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::{DecodePublicKey, EncodePublicKey, LineEnding};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{Error, KnotId, Result};
use doc::{BundleDoc, Predicate, ResourceDoc, StatementDoc};
pub use failure::SigFailure;

/// The signature object's name, next to the knot (OMS's default name).
pub const SIGNATURE_NAME: &str = "model.sig";
/// The largest signature object a reader accepts: 4 MiB.
pub const MAX_SIGNATURE_LEN: u64 = 4 << 20;
/// The bundle's `mediaType`.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The DSSE `payloadType`.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The statement's `_type`.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The statement's `predicateType` (OMS v1.0).
pub const PREDICATE_TYPE: &str = "https://model_signing/signature/v1.0";
/// Paths a signature leaves out of the package, as `model_signing sign`
/// does with `--signature PKG/model.sig`.
pub const IGNORE_PATHS: [&str; 5] = [
    ".git",
    ".gitattributes",
    ".github",
    ".gitignore",
    SIGNATURE_NAME,
];

fn fail<T>(f: SigFailure) -> Result<T> {
    Err(Error::Signature(f))
}

fn malformed(why: impl std::fmt::Display) -> Error {
    Error::Signature(SigFailure::Malformed(why.to_string()))
}

/// A trusted public key and its fingerprint (OMS's `hint`: the SHA-256, in
/// hex, of the key's SubjectPublicKeyInfo PEM text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    key: VerifyingKey,
    hint: String,
}

/// What kind of public key a PEM holds that is not a P-256 one, from its
/// SubjectPublicKeyInfo's algorithm (and, for EC, its curve).
fn key_kind(pem: &str) -> Option<&'static str> {
    use p256::pkcs8::der::{Decode, pem::PemLabel};
    let (label, der) = p256::pkcs8::der::pem::decode_vec(pem.trim().as_bytes()).ok()?;
    if label != p256::pkcs8::spki::SubjectPublicKeyInfoRef::PEM_LABEL {
        return None;
    }
    let spki = p256::pkcs8::spki::SubjectPublicKeyInfoRef::from_der(&der).ok()?;
    let curve = spki.algorithm.parameters_oid().ok().map(|o| o.to_string());
    Some(
        match (spki.algorithm.oid.to_string().as_str(), curve.as_deref()) {
            ("1.2.840.113549.1.1.1", _) => "an RSA key",
            ("1.3.101.112", _) => "an Ed25519 key",
            ("1.2.840.10045.2.1", Some("1.3.132.0.34")) => "an EC key on P-384",
            ("1.2.840.10045.2.1", Some("1.3.132.0.35")) => "an EC key on P-521",
            ("1.2.840.10045.2.1", Some("1.3.132.0.10")) => "an EC key on secp256k1",
            ("1.2.840.10045.2.1", _) => "an EC key on a curve other than P-256",
            _ => "a key of another algorithm",
        },
    )
}

impl PublicKey {
    /// A key from its PEM text.
    pub fn from_pem(pem: &str) -> Result<PublicKey> {
        if pem.contains("PRIVATE KEY-----") {
            return fail(SigFailure::KeyFormat(
                "this is a private key; give its public half (openssl ec -in KEY.pem -pubout)"
                    .into(),
            ));
        }
        match VerifyingKey::from_public_key_pem(pem.trim()) {
            Ok(key) => Ok(PublicKey::from_key(key)),
            Err(e) => fail(SigFailure::KeyFormat(match key_kind(pem) {
                Some(kind) => format!(
                    "this is {kind}; a package is signed with an ECDSA P-256 key (openssl ecparam -name prime256v1 -genkey -noout -out key.pem)"
                ),
                None => e.to_string(),
            })),
        }
    }

    /// The public key of a verifying key.
    pub fn from_key(key: VerifyingKey) -> PublicKey {
        let pem = key.to_public_key_pem(LineEnding::LF).unwrap_or_default();
        let hint = crate::hex(&Sha256::digest(pem.as_bytes()));
        PublicKey { key, hint }
    }

    /// The fingerprint, as the bundle's `hint` spells it.
    pub fn hint(&self) -> &str {
        &self.hint
    }
}

/// One file of the package as the statement lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    /// Its path relative to the package directory, `/`-separated.
    pub name: String,
    /// The SHA-256 of its bytes.
    pub digest: [u8; 32],
}

/// What a checked signature object says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signed {
    /// The fingerprint of the trusted key that signed it.
    pub signer: String,
    /// The subject's name (the package directory's name when signed).
    pub name: String,
    /// Every file signed, in the statement's order.
    pub resources: Vec<Resource>,
    /// The knot id the statement names (`predicate.gkq.knot_id`).
    pub knot_id: Option<KnotId>,
    /// The package name the statement names (`predicate.gkq.name`).
    pub package: Option<String>,
}

/// The package a reader was asked for, to hold a signed name against
/// (FORMAT.md 7c, "The package asked for").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Asked {
    /// A name given (`--package NAME`): the signed name must equal it.
    Name(String),
    /// The path a package is published under: the directory of the knot's
    /// URL (`https://h/models/a/v1/model.knot`: `models/a/v1`; for
    /// `s3://bucket/key`, the key's directory). The signed name must equal
    /// all of it: a shorter name never matches a longer path by its tail.
    UrlPath(String),
    /// A local directory (no `--package`): a local path has no root to
    /// compare with, so the signed name's components must be its last
    /// ones (`/srv/models/a/v1` holds `a/v1` or `v1`, never `b/v1`).
    LocalDir(String),
}

impl std::fmt::Display for Asked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Asked::Name(n) => write!(f, "package {n:?}"),
            Asked::UrlPath(p) => write!(f, "package {:?} (the path of the URL)", trim_slashes(p)),
            Asked::LocalDir(d) => write!(f, "the package in the directory {d:?}"),
        }
    }
}

/// `p` without its leading and trailing slashes.
fn trim_slashes(p: &str) -> &str {
    p.trim_matches('/')
}

impl Asked {
    /// Whether the signed package name `signed` is the one asked for.
    pub fn matches(&self, signed: &str) -> bool {
        match self {
            Asked::Name(n) => n == signed,
            Asked::UrlPath(p) => trim_slashes(p) == signed,
            Asked::LocalDir(d) => {
                let path: Vec<&str> = d.split('/').filter(|c| !c.is_empty()).collect();
                let name: Vec<&str> = signed.split('/').collect();
                path.ends_with(&name)
            }
        }
    }

    /// Whether a statement naming `package` (or none) is for the package
    /// asked for: a name must match; an unnamed statement is accepted only
    /// when the header came from the origin (`served_by` is `None`), else
    /// it is [`SigFailure::Unnamed`] naming who served it. `knot` names the
    /// knot in the refusal.
    pub fn check(&self, package: Option<&str>, served_by: Option<&str>, knot: &str) -> Result<()> {
        match (package, served_by) {
            (Some(p), _) if !self.matches(p) => fail(SigFailure::OtherPackage {
                signed: p.to_owned(),
                asked: self.to_string(),
                knot: knot.to_owned(),
            }),
            (Some(_), _) | (None, None) => Ok(()),
            (None, Some(by)) => fail(SigFailure::Unnamed {
                asked: self.to_string(),
                served_by: by.to_owned(),
                knot: knot.to_owned(),
            }),
        }
    }
}

/// The longest package name: 256 bytes.
pub const MAX_PACKAGE_NAME: usize = 256;

/// Checks a package name (`predicate.gkq.name`, `gkq-sign --name`): 1 to
/// [`MAX_PACKAGE_NAME`] bytes of `/`-separated components, each of ASCII
/// letters, digits, `.`, `_` and `-`, none empty, `.` or `..`.
pub fn check_package_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > MAX_PACKAGE_NAME {
        return Err(format!(
            "a package name is 1 to {MAX_PACKAGE_NAME} bytes, not {}",
            name.len()
        ));
    }
    for c in name.split('/') {
        let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
        if c.is_empty() || c == "." || c == ".." || !c.bytes().all(ok) {
            return Err(format!(
                "{name:?}: a package name is path components (MODEL/VERSION) of letters, digits, '.', '_' and '-', none empty, '.' or '..'"
            ));
        }
    }
    Ok(())
}

impl Signed {
    /// Whether the statement signs the package asked for
    /// ([`Asked::check`]).
    pub fn check_package(&self, asked: &Asked, served_by: Option<&str>) -> Result<()> {
        let knot = self
            .knot_id
            .map_or_else(|| "(none named)".to_owned(), |k| k.to_string());
        asked.check(self.package.as_deref(), served_by, &knot)
    }

    /// Whether the statement signs the knot `id`.
    pub fn check_knot(&self, id: KnotId) -> Result<()> {
        match self.knot_id {
            None => fail(SigFailure::NoKnotId),
            Some(signed) if signed != id => fail(SigFailure::OtherKnot {
                signed: signed.to_string(),
                knot: id.to_string(),
            }),
            Some(_) => Ok(()),
        }
    }
}

/// DSSE's pre-authentication encoding of an in-toto payload: what the
/// ECDSA signature covers.
pub fn pae(payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {PAYLOAD_TYPE} {} ",
        PAYLOAD_TYPE.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// The order `model_signing` lists files in: by path component.
pub fn sort_resources(resources: &mut [Resource]) {
    resources.sort_by(|a, b| a.name.split('/').cmp(b.name.split('/')));
}

/// The subject digest: SHA-256 over the resources' raw digests, in order.
fn root_digest(resources: &[Resource]) -> String {
    let mut h = Sha256::new();
    for r in resources {
        h.update(r.digest);
    }
    crate::hex(&h.finalize())
}

/// The statement (the DSSE payload) for a package named `name` holding
/// `resources` (sorted here) whose knot id is `knot_id`: compact JSON with
/// keys in byte order. It names no package ([`statement_for`] does).
pub fn statement(name: &str, resources: &[Resource], knot_id: KnotId) -> Vec<u8> {
    statement_for(name, resources, knot_id, None)
}

/// As [`statement`], naming the package `package` (`predicate.gkq.name`,
/// and the subject's name) when given: what binds the signature to the
/// package a node asks for (section 7c).
pub fn statement_for(
    name: &str,
    resources: &[Resource],
    knot_id: KnotId,
    package: Option<&str>,
) -> Vec<u8> {
    let mut sorted = resources.to_vec();
    sort_resources(&mut sorted);
    let listed: Vec<Value> = sorted
        .iter()
        .map(|r| json!({"algorithm": "sha256", "digest": crate::hex(&r.digest), "name": r.name}))
        .collect();
    let gkq = match package {
        Some(p) => json!({"knot_id": knot_id.to_string(), "name": p}),
        None => json!({"knot_id": knot_id.to_string()}),
    };
    let name = package.unwrap_or(name);
    let doc = json!({
        "_type": STATEMENT_TYPE,
        "predicate": {
            "gkq": gkq,
            "resources": listed,
            "serialization": {
                "allow_symlinks": false,
                "hash_type": "sha256",
                "ignore_paths": IGNORE_PATHS,
                "method": "files",
            },
        },
        "predicateType": PREDICATE_TYPE,
        "subject": [{"digest": {"sha256": root_digest(&sorted)}, "name": name}],
    });
    serde_json::to_vec(&doc).unwrap_or_default()
}

/// The bundle holding `payload` and its DER signature by the key `hint`.
pub fn bundle(payload: &[u8], der_signature: &[u8], hint: &str) -> Vec<u8> {
    let doc = json!({
        "dsseEnvelope": {
            "payload": STANDARD.encode(payload),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"keyid": "", "sig": STANDARD.encode(der_signature)}],
        },
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": hint}, "tlogEntries": []},
    });
    let mut out = serde_json::to_vec(&doc).unwrap_or_default();
    out.push(b'\n');
    out
}

fn field(field: &'static str, found: &str, want: &str) -> Result<()> {
    if found == want {
        return Ok(());
    }
    fail(SigFailure::Field {
        field,
        found: found.to_owned(),
    })
}

/// The envelope's payload, once its one signature verifies with a trusted
/// key; with that key's fingerprint.
fn verified_payload(doc: &BundleDoc, trusted: &[PublicKey]) -> Result<(Vec<u8>, String)> {
    field("mediaType", &doc.media_type, BUNDLE_MEDIA_TYPE)?;
    let env = &doc.dsse_envelope;
    field("payloadType", &env.payload_type, PAYLOAD_TYPE)?;
    let [one] = env.signatures.as_slice() else {
        return fail(SigFailure::Signatures(env.signatures.len()));
    };
    let payload = STANDARD
        .decode(&env.payload)
        .map_err(|e| malformed(format!("dsseEnvelope.payload: {e}")))?;
    let der = STANDARD
        .decode(&one.sig)
        .map_err(|e| malformed(format!("the signature's base64: {e}")))?;
    let sig = Signature::from_der(&der)
        .map_err(|e| malformed(format!("the signature is not DER ECDSA: {e}")))?;
    let hint = doc
        .verification_material
        .public_key
        .as_ref()
        .and_then(|k| k.hint.clone());
    let candidates: Vec<&PublicKey> = match &hint {
        Some(h) => trusted.iter().filter(|k| &k.hint == h).collect(),
        None => trusted.iter().collect(),
    };
    if let (Some(h), true) = (&hint, candidates.is_empty()) {
        return fail(SigFailure::UnknownKey { hint: h.clone() });
    }
    let message = pae(&payload);
    match candidates
        .iter()
        .find(|k| k.key.verify(&message, &sig).is_ok())
    {
        Some(k) => Ok((payload, k.hint.clone())),
        None => fail(SigFailure::BadSignature { hint }),
    }
}

fn resource(r: &ResourceDoc) -> Result<Resource> {
    if r.algorithm != "sha256" {
        return Err(malformed(format!(
            "resource {:?}: algorithm {:?}, not sha256",
            r.name, r.algorithm
        )));
    }
    let digest = KnotId::parse(&r.digest).map_err(|_| {
        malformed(format!(
            "resource {:?}: digest {:?} is not 64 hex digits",
            r.name, r.digest
        ))
    })?;
    Ok(Resource {
        name: r.name.clone(),
        digest: *digest.digest(),
    })
}

/// Section 7c: the statement lists files (`serialization.method` is
/// `files`, hashed with `sha256`), each once, sorted by path component.
fn check_listing(p: &Predicate, resources: &[Resource]) -> Result<()> {
    let s = p
        .serialization
        .as_ref()
        .ok_or_else(|| malformed("the statement has no predicate.serialization"))?;
    for (field, value, want) in [
        ("method", &s.method, "files"),
        ("hash_type", &s.hash_type, "sha256"),
    ] {
        if value.as_deref() != Some(want) {
            return Err(malformed(format!(
                "predicate.serialization.{field} is {value:?}, not {want:?}"
            )));
        }
    }
    let mut sorted = resources.to_vec();
    sort_resources(&mut sorted);
    if sorted.as_slice() != resources {
        return Err(malformed(
            "predicate.resources are not sorted by path component",
        ));
    }
    if let Some(w) = resources
        .windows(2)
        .find(|w| w.first().map(|r| &r.name) == w.get(1).map(|r| &r.name))
    {
        let name = w.first().map_or("", |r| r.name.as_str());
        return Err(malformed(format!(
            "predicate.resources list {name:?} twice"
        )));
    }
    Ok(())
}

fn statement_doc(payload: &[u8]) -> Result<StatementDoc> {
    serde_json::from_slice(payload).map_err(|e| malformed(format!("the statement: {e}")))
}

fn claim(st: &StatementDoc) -> Result<Option<KnotId>> {
    match &st.predicate.gkq {
        Some(c) => KnotId::parse(&c.knot_id).map(Some).map_err(|_| {
            malformed(format!(
                "predicate.gkq.knot_id {:?} is not 64 hex digits",
                c.knot_id
            ))
        }),
        None => Ok(None),
    }
}

/// The knot id a signature object's statement names, its signature NOT
/// checked: a publisher's test that `model.sig` is not left over from an
/// earlier pack, before it is uploaded.
pub fn claimed_knot(bytes: &[u8]) -> Result<Option<KnotId>> {
    let doc: BundleDoc = serde_json::from_slice(bytes).map_err(malformed)?;
    let payload = STANDARD
        .decode(&doc.dsse_envelope.payload)
        .map_err(|e| malformed(format!("dsseEnvelope.payload: {e}")))?;
    claim(&statement_doc(&payload)?)
}

/// The package name a signature object's statement names, its signature
/// NOT checked: a publisher's test that the upload's prefix is the name
/// signed, before anything is uploaded.
pub fn claimed_package(bytes: &[u8]) -> Result<Option<String>> {
    let doc: BundleDoc = serde_json::from_slice(bytes).map_err(malformed)?;
    let payload = STANDARD
        .decode(&doc.dsse_envelope.payload)
        .map_err(|e| malformed(format!("dsseEnvelope.payload: {e}")))?;
    Ok(statement_doc(&payload)?.predicate.gkq.and_then(|c| c.name))
}

/// Checks a signature object against the trusted keys: its envelope, its
/// one signature, its statement and the statement's consistency (the
/// subject digest). What the statement signs is the caller's to compare
/// ([`Signed::check_knot`], or every file).
pub fn open(bytes: &[u8], trusted: &[PublicKey]) -> Result<Signed> {
    if bytes.len() as u64 > MAX_SIGNATURE_LEN {
        return Err(malformed(format!(
            "{} bytes, over the limit of {MAX_SIGNATURE_LEN}",
            bytes.len()
        )));
    }
    let doc: BundleDoc = serde_json::from_slice(bytes).map_err(malformed)?;
    let (payload, signer) = verified_payload(&doc, trusted)?;
    let st = statement_doc(&payload)?;
    field("_type", &st.kind, STATEMENT_TYPE)?;
    field("predicateType", &st.predicate_type, PREDICATE_TYPE)?;
    let [subject] = st.subject.as_slice() else {
        return fail(SigFailure::Subjects(st.subject.len()));
    };
    let resources = st
        .predicate
        .resources
        .iter()
        .map(resource)
        .collect::<Result<Vec<_>>>()?;
    check_listing(&st.predicate, &resources)?;
    let root = root_digest(&resources);
    let claimed = subject.digest.get("sha256").cloned().unwrap_or_default();
    if claimed != root {
        return fail(SigFailure::Inconsistent {
            subject: claimed,
            resources: root,
        });
    }
    let knot_id = claim(&st)?;
    let package = match st.predicate.gkq.as_ref().and_then(|c| c.name.clone()) {
        Some(p) => {
            check_package_name(&p)
                .map_err(|why| malformed(format!("predicate.gkq.name: {why}")))?;
            if subject.name != p {
                return Err(malformed(format!(
                    "the subject's name {:?} is not the package name {p:?} (predicate.gkq.name)",
                    subject.name
                )));
            }
            Some(p)
        }
        None => None,
    };
    Ok(Signed {
        signer,
        name: subject.name.clone(),
        resources,
        knot_id,
        package,
    })
}

mod doc;
mod failure;
#[cfg(test)]
mod tests;
