//! The local side: verify the package with the gkq-verify checks, then
//! list the objects to publish with their digests, row files first and the
//! knot last.

use std::path::{Path, PathBuf};

use gkq_format::{Knot, hex};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{BoxError, Result, UploadError};
use gkq_format::ObjectKind;

/// One file to publish.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LocalObject {
    /// Object key (prefix + file name).
    pub key: String,
    /// Local path.
    pub path: PathBuf,
    /// Length.
    pub bytes: u64,
    /// Hex SHA-256 of the file.
    pub sha256: String,
    /// Rows, companion or knot.
    pub kind: ObjectKind,
}

impl LocalObject {
    /// The `Content-Type` it is served with.
    pub fn content_type(&self) -> &'static str {
        let name = self.path.to_string_lossy();
        if name.ends_with(".json") {
            "application/json"
        } else if name.ends_with(".txt") {
            "text/plain; charset=utf-8"
        } else {
            CONTENT_TYPE
        }
    }
}

/// `Content-Type` of the knot and row files (JSON and text companion files get their own).
pub(crate) const CONTENT_TYPE: &str = "application/octet-stream";

/// Joins a prefix and a file name into a key (`prefix/name`, no double slash).
pub(crate) fn key(prefix: &str, name: &str) -> String {
    let p = prefix.trim_matches('/');
    if p.is_empty() {
        name.to_owned()
    } else {
        format!("{p}/{name}")
    }
}

/// Hex SHA-256 of a file (the one file hasher, gkq-sign's).
fn sha_file(path: &Path) -> Result<String> {
    match gkq_sign::sha_file(path) {
        Ok(d) => Ok(hex(&d)),
        Err(gkq_sign::SignError::Io { path, error }) => Err(UploadError::Io { path, error }),
        Err(e) => Err(UploadError::Io {
            path: path.to_path_buf(),
            error: std::io::Error::other(e.to_string()),
        }),
    }
}

/// Every object the knot names (row files with their proof, runs and
/// warm objects, then the companions), as objects to publish: their
/// digests are the knot's where it records one, else computed (the local
/// verify has just checked them against the rows).
fn package_objects(knot: &Knot<'_>, dir: &Path, prefix: &str) -> Result<Vec<LocalObject>> {
    let mut out = Vec::new();
    for o in knot.header().header().objects() {
        let path = dir.join(&o.name);
        let bytes = match o.len {
            Some(len) => len,
            None => std::fs::metadata(&path)
                .map_err(|error| UploadError::Io {
                    path: path.clone(),
                    error,
                })?
                .len(),
        };
        out.push(LocalObject {
            key: key(prefix, &o.name),
            sha256: match o.sha256 {
                Some(d) => hex(&d),
                None => sha_file(&path)?,
            },
            path,
            bytes,
            kind: o.kind,
        });
    }
    Ok(out)
}

/// Runs the local gkq-verify checks on `out_dir` and returns the objects to
/// publish, row files first (in knot order), then the companion files
/// (`package.files`), and the knot last. Row file
/// digests come from the knot's descriptors (which verification has just
/// confirmed); the knot's own digest is computed while verification runs.
pub fn prepare(out_dir: &Path, prefix: &str) -> Result<Vec<LocalObject>> {
    let knot_path = gkq_verify::knot_path(out_dir);
    let dir = knot_path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let map = gkq_verify::KnotMap::open(&knot_path).map_err(|e| UploadError::NoKnot {
        path: knot_path.clone(),
        source: e.into(),
    })?;
    let bytes = map.bytes();
    let knot = Knot::parse(bytes).map_err(|e| UploadError::BadKnot {
        path: knot_path.clone(),
        source: Box::new(e),
    })?;
    let opts = gkq_verify::VerifyOptions::new(&knot_path);
    let (report, knot_sha) = rayon::join(|| gkq_verify::verify(&opts), || sha_file(&knot_path));
    let report = report.map_err(|e| UploadError::NoKnot {
        path: knot_path.clone(),
        source: e.into(),
    })?;
    if !report.passed {
        return Err(UploadError::LocalCheck {
            dir,
            failures: report.failure_lines(),
        });
    }
    let mut out = package_objects(&knot, &dir, prefix)?;
    let name = knot_path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("model.knot");
    out.push(LocalObject {
        key: key(prefix, name),
        path: knot_path.clone(),
        bytes: bytes.len() as u64,
        sha256: knot_sha?,
        kind: ObjectKind::Knot,
    });
    if let Some(sig) = signature_object(&dir, &knot, prefix)? {
        out.push(sig);
    }
    Ok(out)
}

/// `model.sig` when the package has one, last: refused when its statement
/// names another knot (a signature left over from an earlier pack).
fn signature_object(dir: &Path, knot: &Knot<'_>, prefix: &str) -> Result<Option<LocalObject>> {
    let path = dir.join(gkq_format::sig::SIGNATURE_NAME);
    let read = gkq_files::read_bounded(
        &path,
        gkq_format::sig::MAX_SIGNATURE_LEN,
        "a signature object",
        gkq_files::Follow::No,
    );
    let bytes = match read {
        Ok(b) => b,
        Err(gkq_files::FileError::Io { error, .. })
            if error.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(None);
        }
        Err(e) => return Err(UploadError::File(e)),
    };
    let id = knot.header().id();
    match gkq_format::sig::claimed_knot(&bytes) {
        Ok(Some(signed)) if signed == id => {}
        Ok(claimed) => {
            return Err(UploadError::StaleSignature {
                path,
                knot: id.to_string(),
                signed: claimed.map_or_else(|| "no knot id".to_owned(), |k| k.to_string()),
            });
        }
        Err(e) => {
            return Err(UploadError::BadSignature {
                path,
                source: Box::new(e),
            });
        }
    }
    // a named signature goes under its name: a node derives the name it
    // asks for from the URL's path (FORMAT.md 7c)
    if let Ok(Some(name)) = gkq_format::sig::claimed_package(&bytes)
        && !gkq_format::sig::Asked::UrlPath(prefix.to_owned()).matches(&name)
    {
        return Err(UploadError::PackageName {
            path,
            name,
            prefix: prefix.to_owned(),
        });
    }
    Ok(Some(LocalObject {
        key: key(prefix, gkq_format::sig::SIGNATURE_NAME),
        bytes: bytes.len() as u64,
        sha256: hex(&Sha256::digest(&bytes)),
        path,
        kind: ObjectKind::Signature,
    }))
}

/// The knot id of the package in `out_dir`: hex of its preamble's
/// `header_sha256` (what a node pins with `--knot-id`). Reads the header only.
pub fn knot_id(out_dir: &Path) -> Result<String> {
    use std::io::Read as _;
    let path = gkq_verify::knot_path(out_dir);
    let no_knot = |source: BoxError| UploadError::NoKnot {
        path: path.clone(),
        source,
    };
    let (mut f, _) =
        gkq_files::open_regular(&path, gkq_files::Follow::No).map_err(|e| no_knot(e.into()))?;
    let mut buf = Vec::new();
    loop {
        match gkq_format::parse_prefix(&buf).map_err(|e| UploadError::BadKnot {
            path: path.clone(),
            source: Box::new(e),
        })? {
            gkq_format::Prefix::Complete(h) => return Ok(hex(&h.preamble().header_sha256)),
            gkq_format::Prefix::NeedBytes { total } => {
                let have = buf.len();
                let total = usize::try_from(total).map_err(|e| no_knot(e.into()))?;
                if total <= have {
                    return Err(no_knot("header does not parse".into()));
                }
                buf.resize(total, 0);
                f.read_exact(&mut buf[have..])
                    .map_err(|e| no_knot(format!("reading the header: {e}").into()))?;
            }
        }
    }
}
