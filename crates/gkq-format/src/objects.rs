//! Every object a package's knot names next to it, in one list: what a
//! publisher uploads, a mirror copies and a verifier expects (the knot
//! itself and `model.sig` aside).

use crate::merkle::{proof_object_len, proof_object_name};
use crate::model::Header;
use crate::runs::{RunsLayout, runs_object_name};
use crate::warm::{WarmLayout, warm_object_name};

/// What an object of a package is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectKind {
    /// A row file (section 7).
    Rows,
    /// A row file's proof object (7a).
    Proof,
    /// A row file's runs object (7b), listed in `columnar.runs`.
    Runs,
    /// A row file's warm object (7d), listed in `columnar.warm`.
    Warm,
    /// A companion file (`package.files`).
    Companion,
    /// The knot (section 2), named by none of the others.
    Knot,
    /// The signature object `model.sig` (7c), named by none of the others.
    Signature,
}

/// One object of a package.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackageObject {
    /// Its name next to the knot.
    pub name: String,
    /// What it is.
    pub kind: ObjectKind,
    /// Its length, when the knot fixes it (every kind but companions).
    pub len: Option<u64>,
    /// Its SHA-256, when the knot records one (row files and companions).
    pub sha256: Option<[u8; 32]>,
}

impl Header {
    /// The objects the knot names: each row file in table order followed
    /// by its proof object and, when listed, its runs and warm objects;
    /// then the companion files.
    pub fn objects(&self) -> Vec<PackageObject> {
        let warm = self.warm_rows().len() as u64;
        let mut out = Vec::new();
        for d in self.blocks.iter().flat_map(|b| &b.columnar) {
            out.push(PackageObject {
                name: d.object.clone(),
                kind: ObjectKind::Rows,
                len: Some(d.byte_len),
                sha256: Some(d.sha256),
            });
            let derived = [
                (
                    proof_object_name(&d.object),
                    ObjectKind::Proof,
                    proof_object_len(d),
                ),
                (
                    runs_object_name(&d.object),
                    ObjectKind::Runs,
                    RunsLayout::of(d)
                        .filter(|_| self.has_runs(&d.object))
                        .and_then(|l| l.object_len()),
                ),
                (
                    warm_object_name(&d.object),
                    ObjectKind::Warm,
                    WarmLayout::of(d, warm)
                        .filter(|_| self.has_warm(&d.object))
                        .and_then(|l| l.object_len()),
                ),
            ];
            for (name, kind, len) in derived {
                if let Some(len) = len {
                    out.push(PackageObject {
                        name,
                        kind,
                        len: Some(len),
                        sha256: None,
                    });
                }
            }
        }
        for (name, sha) in self.package_files() {
            out.push(PackageObject {
                name: name.to_owned(),
                kind: ObjectKind::Companion,
                len: None,
                sha256: crate::KnotId::parse(sha).ok().map(|id| *id.digest()),
            });
        }
        out
    }
}
