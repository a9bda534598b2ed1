//! A whole object copied to a file and checked as it streams: read in
//! steps (each in parallel parts), hashed and written in turn, so that
//! memory stays at one step whatever the object's length, and the file
//! takes its name only once its SHA-256 is the one wanted (the mirror's
//! staging, r2-upload's stage of a package given by URL).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use gkq_format::hex;
use gkq_format::progress::Progress;
use sha2::{Digest, Sha256};

use crate::{RangeRead, ReadCheck, ReadChecked, Result, StoreError};

use gkq_format::layout::COPY_STEP as STEP;

/// Copies `url` (`len` bytes, or its HEAD's length when 0) to `path`:
/// written under a temporary name beside it (`.NAME.part`), renamed only
/// when its SHA-256 is `want` (when one is given); its length. Other bytes
/// are [`StoreError::Digest`], and the temporary file is removed. Each
/// step written is reported to `progress`.
pub async fn copy_to_file<R: RangeRead + ?Sized>(
    store: &R,
    url: &str,
    (len, want): (u64, Option<[u8; 32]>),
    path: &Path,
    progress: &dyn Progress,
) -> Result<u64> {
    let len = if len == 0 {
        store.head(url).await?.len
    } else {
        len
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.part"));
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    let mut h = Sha256::new();
    let mut at = 0;
    while at < len {
        let n = STEP.min(len - at);
        let bytes = store
            .read_checked(url, (at, n), Some(len), ReadCheck::None)
            .await?;
        h.update(&bytes);
        f.write_all(&bytes).map_err(io(&tmp))?;
        progress.advance(n);
        at += n;
    }
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    let digest: [u8; 32] = h.finalize().into();
    if let Some(want) = want
        && digest != want
    {
        let _ = std::fs::remove_file(&tmp);
        return Err(StoreError::Digest {
            url: url.to_owned(),
            start: 0,
            end: len.saturating_sub(1),
            expected: hex(&want),
            found: hex(&digest),
        });
    }
    std::fs::rename(&tmp, path).map_err(io(path))?;
    Ok(len)
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |error| StoreError::Io {
        path: PathBuf::from(path),
        error,
    }
}
