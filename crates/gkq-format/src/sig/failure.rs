//! Why a signature object is refused (FORMAT.md 7c), in words.

/// Why a signature object is refused, or a key cannot be one.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SigFailure {
    /// Not a bundle: bad JSON, a missing field, bad base64, too long.
    Malformed(String),
    /// A field whose value is not the one section 7c requires.
    Field {
        /// The field (`mediaType`, `payloadType`, `_type`, `predicateType`).
        field: &'static str,
        /// What it holds.
        found: String,
    },
    /// Not exactly one DSSE signature.
    Signatures(usize),
    /// Not exactly one subject.
    Subjects(usize),
    /// The subject's digest is not the hash of the resource digests.
    Inconsistent {
        /// The subject's digest.
        subject: String,
        /// What the resources hash to.
        resources: String,
    },
    /// Signed by a key that is not trusted (the bundle's hint).
    UnknownKey {
        /// The signer's fingerprint as the bundle spells it.
        hint: String,
    },
    /// The signature does not verify with the trusted key(s).
    BadSignature {
        /// The fingerprint of the key it was checked with, if one matched.
        hint: Option<String>,
    },
    /// The statement names no knot id (a `model_signing`-made signature:
    /// only a check of every file can use it).
    NoKnotId,
    /// The statement signs another knot.
    OtherKnot {
        /// The knot id signed.
        signed: String,
        /// The knot's own id.
        knot: String,
    },
    /// A trusted key that is not an ECDSA P-256 public key in PEM.
    KeyFormat(String),
    /// The statement names another package than the one asked for.
    OtherPackage {
        /// The package name signed (`predicate.gkq.name`).
        signed: String,
        /// What was asked for: the name given, or the URL's path.
        asked: String,
        /// The knot id signed.
        knot: String,
    },
    /// The statement names no package, and the header did not come from
    /// the origin: nothing binds it to what was asked for.
    Unnamed {
        /// What was asked for.
        asked: String,
        /// Who served it.
        served_by: String,
        /// The knot id signed.
        knot: String,
    },
}

impl std::fmt::Display for SigFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SigFailure::Malformed(why) => {
                write!(f, "signature object: not a Sigstore bundle: {why}")
            }
            SigFailure::Field { field, found } => write!(
                f,
                "signature object: {field} is {found:?}, not the one FORMAT.md section 7c requires"
            ),
            SigFailure::Signatures(n) => write!(
                f,
                "signature object: the DSSE envelope holds {n} signatures, not exactly 1"
            ),
            SigFailure::Subjects(n) => write!(
                f,
                "signature object: the statement has {n} subjects, not exactly 1"
            ),
            SigFailure::Inconsistent { subject, resources } => write!(
                f,
                "signature object: the subject digest {subject} is not the hash of the resources' digests ({resources})"
            ),
            SigFailure::UnknownKey { hint } => write!(
                f,
                "signed by key {hint}, which is not trusted (--trust-key)"
            ),
            SigFailure::BadSignature { hint: Some(h) } => {
                write!(f, "the signature does not verify with the trusted key {h}")
            }
            SigFailure::BadSignature { hint: None } => {
                write!(f, "the signature does not verify with any trusted key")
            }
            SigFailure::NoKnotId => write!(
                f,
                "signature object: the statement names no knot id (predicate.gkq.knot_id): it can only be checked file by file (gkq-verify PKG_DIR --trust-key)"
            ),
            SigFailure::OtherKnot { signed, knot } => write!(
                f,
                "the signature is for knot {signed}, not this knot {knot}: a signature of another package, or of this one before it was packed again (re-sign it with gkq-sign)"
            ),
            SigFailure::KeyFormat(why) => write!(
                f,
                "not an ECDSA P-256 public key in PEM (SubjectPublicKeyInfo, `-----BEGIN PUBLIC KEY-----`): {why}"
            ),
            SigFailure::OtherPackage {
                signed,
                asked,
                knot,
            } => write!(
                f,
                "the signature is for package {signed:?} (knot {knot}), but {asked} was asked for: another model signed by the same key (give --package {signed} if that is the package you mean)"
            ),
            SigFailure::Unnamed {
                asked,
                served_by,
                knot,
            } => write!(
                f,
                "{served_by} serves knot {knot} for {asked}, signed by a trusted key but naming no package: away from the origin nothing binds it to the package asked for (pin it with --knot-id, or sign the package with gkq-sign --name)"
            ),
        }
    }
}
