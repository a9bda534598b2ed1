//! `gkq-verify URL`: a published package checked in place, with no local
//! copy of one's own. The knot's header comes first (two bounded reads);
//! every object it names is then streamed, a step at a time
//! ([`gkq_store::copy_to_file`]), into a
//! temporary directory, never more of an object than the knot says it
//! holds; then the release gate's local checks run on that copy and the
//! `remote` check on the URL, so the report and the exit codes are those
//! of a local check. The directory is removed when the check ends.

use std::path::{Path, PathBuf};

use gkq_format::progress::Progress;
use gkq_format::sig::SIGNATURE_NAME;
use gkq_format::{KNOT_NAME, Prefix, parse_prefix};
use gkq_store::StoreError;
use gkq_store::url::join;

use super::Http;
use crate::VerifyError;

use gkq_format::layout::{FIRST_READ, MAX_COMPANION};

/// The copy of a package at a URL.
pub(crate) struct Fetched {
    /// The temporary directory (removed on drop).
    pub(crate) dir: tempfile::TempDir,
    /// The base URL of the package (without the trailing `/`).
    pub(crate) base: String,
}

impl Fetched {
    /// The copied knot.
    pub(crate) fn knot(&self) -> PathBuf {
        self.dir.path().join(KNOT_NAME)
    }
}

/// `URL/model.knot`, `URL/` or `URL`: the base URL of the package.
pub(crate) fn base_of(url: &str) -> String {
    let path = gkq_store::url::without_query(url).trim_end_matches('/');
    path.strip_suffix(KNOT_NAME)
        .map_or(path, |b| b.trim_end_matches('/'))
        .to_owned()
}

fn fail(url: &str, error: impl std::fmt::Display) -> VerifyError {
    VerifyError::Fetch {
        url: url.to_owned(),
        error: error.to_string(),
    }
}

/// Copies the package published at `url` (see the module docs).
pub(crate) fn fetch(
    http: &Http,
    url: &str,
    progress: &dyn Progress,
) -> Result<Fetched, VerifyError> {
    let base = base_of(url);
    let dir = tempfile::Builder::new()
        .prefix("gkq-verify-")
        .tempdir()
        .map_err(|e| fail(&base, format!("a temporary directory: {e}")))?;
    let knot_url = join(&base, KNOT_NAME);
    let head = http.head(&knot_url).map_err(|e| fail(&knot_url, e))?;
    let mut prefix = http
        .prefix(&knot_url, FIRST_READ)
        .map_err(|e| fail(&knot_url, e))?;
    if let Ok(Prefix::NeedBytes { total }) = parse_prefix(&prefix) {
        prefix = http
            .prefix(&knot_url, total)
            .map_err(|e| fail(&knot_url, e))?;
    }
    let header = match parse_prefix(&prefix) {
        Ok(Prefix::Complete(h)) => h,
        // the local check reports what is wrong with what was served
        _ => {
            write(&dir.path().join(KNOT_NAME), &prefix)?;
            return Ok(Fetched { dir, base });
        }
    };
    // never more than the knot declares; the remote check reports a
    // Content-Length that disagrees
    let knot_len = head.len.min(header.preamble().file_len);
    let objects = header.header().objects();
    progress.start(knot_len + objects.iter().filter_map(|o| o.len).sum::<u64>());
    http.copy_to_file(&knot_url, knot_len, &dir.path().join(KNOT_NAME), progress)
        .map_err(|e| fail(&knot_url, e))?;
    for o in objects {
        let url = join(&base, &o.name);
        let len = match http.head(&url) {
            Ok(h) => h.len.min(o.len.unwrap_or(MAX_COMPANION)),
            // a missing object: the local check names it
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(fail(&url, e)),
        };
        http.copy_to_file(&url, len, &dir.path().join(&o.name), progress)
            .map_err(|e| fail(&url, e))?;
    }
    let sig_url = join(&base, SIGNATURE_NAME);
    match http.signature(&knot_url) {
        Ok(Some(bytes)) => write(&dir.path().join(SIGNATURE_NAME), &bytes)?,
        Ok(None) => {}
        Err(e) => return Err(fail(&sig_url, e)),
    }
    Ok(Fetched { dir, base })
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), VerifyError> {
    std::fs::write(path, bytes).map_err(|e| fail(&path.display().to_string(), e))
}
