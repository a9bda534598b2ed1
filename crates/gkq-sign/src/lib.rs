//! Signing a package in the publishing pipeline, and checking a signed
//! directory file by file.
//!
//! - [`sign_package`] writes `model.sig` (docs/FORMAT.md section 7c) next
//!   to the knot: OpenSSF Model Signing's envelope over every file of the
//!   directory, whose predicate also names the knot id, so that a node
//!   checks it from the knot header alone and `model_signing verify key`
//!   checks the whole directory.
//! - [`verify_package`] checks a directory against its signature as
//!   `model_signing verify` does (every file, none missing, none extra),
//!   and the knot id when the statement names one. It accepts signatures
//!   made by `model_signing sign key` too.
//!
//! The private key stays in this process: it is never printed, and no
//! error or report holds any of it.
#![forbid(unsafe_code)]

use std::io::Read as _;
use std::path::{Path, PathBuf};

use gkq_format::sig::{self, PublicKey, Resource, SIGNATURE_NAME};
use gkq_format::{KnotId, hex};
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::{Signature, SigningKey};
use sha2::{Digest, Sha256};

mod key;

pub use key::{DEFAULT_PASSWORD_ENV, load_signing_key};

/// What can go wrong while signing or checking a package.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    /// A file that cannot be read or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// A private key that cannot be used (never holds any of the key).
    #[error("{}: {reason}", path.display())]
    Key {
        /// The key file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A signature, a trusted key or a knot that the format refuses.
    #[error("{}: {error}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// The rule.
        error: Box<gkq_format::Error>,
    },
    /// A symbolic link in the package (`allow_symlinks: false`).
    #[error("{}: a symbolic link; a signed package holds regular files only", path.display())]
    Symlink {
        /// The link.
        path: PathBuf,
    },
    /// A file refused before it is read: not a regular file, a link, or
    /// longer than what is held in memory for it.
    #[error(transparent)]
    File(#[from] gkq_files::FileError),
    /// A package name that FORMAT.md 7c does not allow.
    #[error("--name: {reason}")]
    Name {
        /// Why.
        reason: String,
    },
    /// Files that are not as signed.
    #[error("{}: the package is not the one signed: {}", dir.display(), problems.join("; "))]
    Mismatch {
        /// The package directory.
        dir: PathBuf,
        /// One line per file: missing, extra, or another digest.
        problems: Vec<String>,
    },
}

/// `Result` with [`SignError`].
pub type Result<T, E = SignError> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SignError + '_ {
    move |error| SignError::Io {
        path: path.to_owned(),
        error,
    }
}

/// What a signing or a check did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SignReport {
    /// The signature object.
    pub signature: PathBuf,
    /// The fingerprint of the signing key (OMS's `hint`).
    pub signer: String,
    /// The knot id signed (absent for a `model_signing` signature).
    pub knot_id: Option<String>,
    /// The package name signed (`gkq-sign --name`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
    /// Files covered.
    pub files: usize,
}

/// The package directory of `target`: itself, or the directory of a
/// knot path (`PKG/model.knot`), as every other tool takes either.
pub fn package_dir(target: &Path) -> PathBuf {
    if target
        .file_name()
        .is_some_and(|n| n == gkq_format::KNOT_NAME)
        && !target.is_dir()
    {
        return target
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
    }
    target.to_path_buf()
}

/// The knot id of the package `dir` (or of the knot path `dir`), from its
/// preamble and header checksum.
pub fn knot_id_of(dir: &Path) -> Result<KnotId> {
    let path = package_dir(dir).join(gkq_format::KNOT_NAME);
    let (mut f, _) = gkq_files::open_regular(&path, gkq_files::Follow::No)?;
    let mut bytes = Vec::new();
    loop {
        let need = match gkq_format::prefix_id(&bytes) {
            Ok(Ok(id)) => return Ok(id),
            Ok(Err(total)) => total,
            Err(error) => {
                return Err(SignError::Format {
                    path,
                    error: Box::new(error),
                });
            }
        };
        let have = bytes.len() as u64;
        let got = (&mut f)
            .take(need - have)
            .read_to_end(&mut bytes)
            .map_err(io(&path))?;
        if got == 0 {
            let error = gkq_format::Error::Truncated {
                needed: need,
                available: have,
            };
            return Err(SignError::Format {
                path,
                error: Box::new(error),
            });
        }
    }
}

/// Every file of the package directory as `model_signing` lists it (its
/// `files` serialization): regular files below `dir`, relative `/` paths,
/// SHA-256 of each, without [`sig::IGNORE_PATHS`] at the top.
pub fn resources(dir: &Path) -> Result<Vec<Resource>> {
    let mut out = Vec::new();
    walk(dir, "", &mut out)?;
    sig::sort_resources(&mut out);
    Ok(out)
}

fn walk(dir: &Path, rel: &str, out: &mut Vec<Resource>) -> Result<()> {
    let here = dir.join(rel);
    let entries = std::fs::read_dir(&here).map_err(io(&here))?;
    for entry in entries {
        let entry = entry.map_err(io(&here))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if rel.is_empty() && sig::IGNORE_PATHS.contains(&name.as_str()) {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type().map_err(io(&path))?;
        let child = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        if kind.is_symlink() {
            return Err(SignError::Symlink { path });
        } else if kind.is_dir() {
            walk(dir, &child, out)?;
        } else {
            out.push(Resource {
                digest: sha_file(&path)?,
                name: child,
            });
        }
    }
    Ok(())
}

/// The SHA-256 of a file's bytes, read in 1 MiB steps.
pub fn sha_file(path: &Path) -> Result<[u8; 32]> {
    let (mut f, _) = gkq_files::open_regular(path, gkq_files::Follow::No)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            return Ok(h.finalize().into());
        }
        h.update(&buf[..n]);
    }
}

/// Signs the package in `dir` with `key`: writes `dir/model.sig` (whole,
/// or not at all) over every file and the knot id. It names no package:
/// a node accepts its header from the origin only, or with a pinned id
/// ([`sign_named`] binds the package's name).
pub fn sign_package(dir: &Path, key: &SigningKey) -> Result<SignReport> {
    sign_named(dir, key, None)
}

/// As [`sign_package`], naming the package `package` (`MODEL/VERSION`, the
/// path it is published under): a node asked for another package refuses
/// this signature, whoever serves it (FORMAT.md 7c).
pub fn sign_named(dir: &Path, key: &SigningKey, package: Option<&str>) -> Result<SignReport> {
    if let Some(p) = package {
        sig::check_package_name(p).map_err(|reason| SignError::Name { reason })?;
    }
    let dir = &package_dir(dir);
    let id = knot_id_of(dir)?;
    let files = resources(dir)?;
    let name = std::fs::canonicalize(dir)
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let payload = sig::statement_for(&name, &files, id, package);
    let signature: Signature = key.sign(&sig::pae(&payload));
    let signer = PublicKey::from_key(*key.verifying_key());
    let bundle = sig::bundle(&payload, signature.to_der().as_bytes(), signer.hint());
    let path = dir.join(SIGNATURE_NAME);
    let tmp = dir.join(format!(".{SIGNATURE_NAME}.tmp"));
    std::fs::write(&tmp, &bundle).map_err(io(&tmp))?;
    if let Err(error) = std::fs::rename(&tmp, &path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(SignError::Io { path, error });
    }
    Ok(SignReport {
        signature: path,
        signer: signer.hint().to_owned(),
        knot_id: Some(id.to_string()),
        package: package.map(str::to_owned),
        files: files.len(),
    })
}

/// Checks `dir` against `dir/model.sig` with the trusted keys: the
/// signature, every file (none missing, none extra, each digest), and the
/// knot id when the statement names one.
pub fn verify_package(dir: &Path, trusted: &[PublicKey]) -> Result<SignReport> {
    let dir = &package_dir(dir);
    let path = dir.join(SIGNATURE_NAME);
    let bytes = gkq_files::read_bounded(
        &path,
        sig::MAX_SIGNATURE_LEN,
        "a signature object",
        gkq_files::Follow::No,
    )?;
    let format = |error| SignError::Format {
        path: path.clone(),
        error: Box::new(error),
    };
    let signed = sig::open(&bytes, trusted).map_err(format)?;
    if let Some(want) = signed.knot_id {
        let knot = knot_id_of(dir)?;
        signed.check_knot(knot).map_err(format)?;
        debug_assert_eq!(want, knot);
    }
    let actual = resources(dir)?;
    let problems = compare(&signed.resources, &actual);
    if !problems.is_empty() {
        return Err(SignError::Mismatch {
            dir: dir.to_owned(),
            problems,
        });
    }
    Ok(SignReport {
        signature: path,
        signer: signed.signer,
        knot_id: signed.knot_id.map(|k| k.to_string()),
        package: signed.package,
        files: actual.len(),
    })
}

/// What differs between the signed files and the directory's.
fn compare(signed: &[Resource], actual: &[Resource]) -> Vec<String> {
    let mut problems = Vec::new();
    for s in signed {
        match actual.iter().find(|a| a.name == s.name) {
            None => problems.push(format!("{} is signed but missing", s.name)),
            Some(a) if a.digest != s.digest => problems.push(format!(
                "{} has sha256 {}, signed {}",
                s.name,
                hex(&a.digest),
                hex(&s.digest)
            )),
            Some(_) => {}
        }
    }
    for a in actual {
        if !signed.iter().any(|s| s.name == a.name) {
            problems.push(format!("{} is not signed", a.name));
        }
    }
    problems
}
