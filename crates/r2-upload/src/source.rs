//! What to publish: a gkq-pack output directory, or a package already
//! published elsewhere (its knot's URL), which `gkq-mirror`'s engine first
//! copies into a staging directory, verified against the knot (and the
//! publisher's signature or a pinned id), before the same upload path
//! publishes it: a regional mirror in a bucket of its own.

use std::path::{Path, PathBuf};

use gkq_mirror::MirrorReport;
use gkq_reader::ReaderConfig;

use crate::error::{Result, UploadError};

/// The package's directory, and what the mirror did when it was copied.
#[derive(Debug)]
pub struct Staged {
    /// The directory to publish.
    pub dir: PathBuf,
    /// The mirror's report, when the package came from a URL.
    pub mirrored: Option<MirrorReport>,
    /// A staging directory of our own, removed once published.
    temporary: bool,
}

impl Staged {
    /// Removes a staging directory of our own (after the upload succeeded).
    pub fn finish(self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The staging directory of a URL when none is given: one per URL under
/// the system's temporary directory, so that a second run resumes.
fn default_staging(url: &str) -> PathBuf {
    use sha2::{Digest, Sha256};
    let bare = gkq_store::url::without_query(url);
    let h = gkq_format::hex(&Sha256::digest(bare.as_bytes()));
    std::env::temp_dir().join(format!("gkq-upload-{}", &h[..16]))
}

/// `package` as a directory to publish: itself when it is a path; a URL's
/// package copied into `staging` (or a directory of its own under the
/// system's temporary directory, one per URL) with `config`'s
/// trust (`--trust-key`, `--knot-id`).
pub fn stage(package: &str, staging: Option<&Path>, config: ReaderConfig) -> Result<Staged> {
    if !gkq_store::is_remote(package) {
        return Ok(Staged {
            dir: PathBuf::from(package),
            mirrored: None,
            temporary: false,
        });
    }
    let dir = staging.map_or_else(|| default_staging(package), Path::to_path_buf);
    // a staging directory of this package only: another package's files are replaced
    let opts = gkq_mirror::MirrorOptions { replace: true };
    let report =
        gkq_mirror::mirror(package, &dir, config, opts).map_err(|source| UploadError::Mirror {
            url: gkq_store::url::redact(package),
            source: Box::new(source),
        })?;
    Ok(Staged {
        dir,
        mirrored: Some(report),
        temporary: staging.is_none(),
    })
}
