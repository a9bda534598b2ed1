//! The `package` check: the companion files (`package.files`: config,
//! tokenizer) present, regular, and hashing to the digests the knot records.

use std::path::Path;

use gkq_format::{Knot, hex, keys};
use sha2::{Digest, Sha256};

use crate::files::open_regular;
use crate::report::{CheckFindings, Finding};

/// The findings, and how many files the knot lists; `None` when it lists none.
pub(crate) fn check(knot: &Knot<'_>, dir: &Path) -> Option<(CheckFindings, usize)> {
    let h = knot.header().header();
    let files = h.meta_list(keys::PACKAGE_FILES)?;
    let mut acc = CheckFindings::default();
    for (name, want) in h.package_files() {
        let path = dir.join(name);
        let shown = path.display().to_string();
        let mut f = match open_regular(&path) {
            Ok((f, _)) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let what = "companion file";
                let object = name.to_owned();
                acc.fail(shown, gkq_format::Error::ObjectMissing { what, object });
                continue;
            }
            Err(e) => {
                acc.fail(shown, Finding::CompanionUnreadable(e));
                continue;
            }
        };
        let mut hasher = Sha256::new();
        match std::io::copy(&mut f, &mut hasher) {
            Ok(n) => acc.bytes += n,
            Err(e) => {
                acc.fail(shown, e);
                continue;
            }
        }
        let found = hex(&hasher.finalize());
        if found != *want {
            let e = gkq_format::Error::CompanionDigest {
                name: name.to_owned(),
                stored: want.to_owned(),
                computed: found,
            };
            acc.fail(shown, e);
        }
    }
    Some((acc, files.len()))
}
