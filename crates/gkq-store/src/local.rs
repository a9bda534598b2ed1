//! The local-file backend: positioned reads (`pread`) on the blocking pool,
//! with the same strictness as the network ones (a short file is an error
//! naming the path and the range, never a silently short buffer).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::gate::Gate;
use crate::range::check_dest;
use crate::read::{BoxFuture, Head, RangeRead, ReadOptions};

/// The largest read into one buffer of the blocking pool.
const PIECE: usize = 1 << 20;

/// Reads of local files.
#[derive(Debug)]
pub struct LocalStore {
    max_read_bytes: u64,
    gate: Gate,
}

fn io(path: &Path, error: std::io::Error) -> StoreError {
    if error.kind() == std::io::ErrorKind::NotFound {
        return StoreError::NotFound {
            url: path.display().to_string(),
            how: format!("no such file{}", url_hint(&path.display().to_string())),
        };
    }
    StoreError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// For a path that is not there and looks like a URL gone wrong, what was
/// probably meant: a scheme with one slash (`http:/h/…`), or none
/// (`127.0.0.1:8080/…`, `host.example/…`).
fn url_hint(path: &str) -> String {
    for scheme in ["http:/", "https:/", "s3:/"] {
        if let Some(rest) = path.strip_prefix(scheme).filter(|r| !r.starts_with('/')) {
            return format!("; a URL has two slashes after its scheme: {scheme}/{rest}");
        }
    }
    let first = path.split('/').next().unwrap_or_default();
    let host = first.contains(':') || (first.contains('.') && !first.starts_with('.'));
    if path.contains('/') && host && !Path::new(first).exists() {
        return format!("; for a URL, give its scheme: http://{path}");
    }
    String::new()
}

/// Opens `path` only if it is a regular file (a FIFO would block forever,
/// a device never end, a directory is not an object). Returns its length.
fn open_regular(path: &Path) -> Result<(File, u64)> {
    let m = std::fs::metadata(path).map_err(|e| io(path, e))?;
    if !m.is_file() {
        let what = if m.is_dir() {
            "a directory, not a file"
        } else {
            "not a regular file (a FIFO or device is refused)"
        };
        return Err(io(
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidInput, what),
        ));
    }
    let f = File::open(path).map_err(|e| io(path, e))?;
    let len = f.metadata().map_err(|e| io(path, e))?.len();
    Ok((f, len))
}

/// Runs a file operation on the blocking pool.
async fn blocking<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io(path, std::io::Error::other(e)))?
}

impl LocalStore {
    /// Reads under `config` (its largest read and parallel parts).
    pub fn new(config: &StoreConfig) -> LocalStore {
        LocalStore {
            max_read_bytes: config.max_read_bytes,
            gate: Gate::new(config.parallel),
        }
    }
}

impl RangeRead for LocalStore {
    fn head<'a>(&'a self, location: &'a str) -> BoxFuture<'a, Result<Head>> {
        Box::pin(async move {
            let path = PathBuf::from(location);
            let p = path.clone();
            let (_, len) = blocking(&path, move || open_regular(&p)).await?;
            Ok(Head {
                len,
                etag: None,
                sha256: None,
            })
        })
    }

    fn read_into<'a>(
        &'a self,
        location: &'a str,
        start: u64,
        dest: &'a mut [u8],
        opts: ReadOptions,
    ) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            check_dest(location, start, dest.len() as u64, self.max_read_bytes)?;
            let path = PathBuf::from(location);
            let p = path.clone();
            let (f, total) = blocking(&path, move || open_regular(&p)).await?;
            if let Some(t) = opts.total.filter(|&t| t != total) {
                return Err(StoreError::ObjectLength {
                    url: path.display().to_string(),
                    expected: t,
                    found: total,
                });
            }
            let end = start.saturating_add(dest.len() as u64).saturating_sub(1);
            if end >= total {
                return Err(StoreError::PastEnd {
                    url: path.display().to_string(),
                    start,
                    end,
                    len: total,
                });
            }
            // the blocking pool needs owned buffers: read a piece into one,
            // then copy it (local reads run at memory speed; the network path
            // writes in place). Pieces, not the whole range: a part's buffer
            // of its own size, freed into the allocator's arenas, stayed in
            // the process's memory (Gemma 3's lm_head: 117 MB at the peak)
            // (one buffer, handed to each piece's read and back)
            let f = std::sync::Arc::new(f);
            let mut buf = Vec::with_capacity(dest.len().min(PIECE));
            for (i, piece) in dest.chunks_mut(PIECE).enumerate() {
                let (f, p, n) = (f.clone(), path.clone(), piece.len());
                let at = start + (i * PIECE) as u64;
                buf = blocking(&path, move || {
                    buf.resize(n, 0);
                    f.read_exact_at(&mut buf, at).map_err(|e| io(&p, e))?;
                    Ok(buf)
                })
                .await?;
                piece.copy_from_slice(&buf);
            }
            Ok(total)
        })
    }

    fn read_prefix<'a>(
        &'a self,
        location: &'a str,
        max: u64,
    ) -> BoxFuture<'a, Result<(Vec<u8>, u64)>> {
        Box::pin(async move {
            check_dest(location, 0, max, self.max_read_bytes)?;
            let path = PathBuf::from(location);
            let p = path.clone();
            blocking(&path, move || {
                let (f, total) = open_regular(&p)?;
                let n = usize::try_from(max.min(total)).unwrap_or(usize::MAX);
                let mut buf = vec![0u8; n];
                f.read_exact_at(&mut buf, 0).map_err(|e| io(&p, e))?;
                Ok((buf, total))
            })
            .await
        })
    }

    fn max_read_bytes(&self) -> u64 {
        self.max_read_bytes
    }

    fn gate(&self) -> &Gate {
        &self.gate
    }
}

#[cfg(test)]
mod tests {
    use super::url_hint;

    /// Issue 58: a URL missing a slash or a scheme is answered as such.
    #[test]
    fn a_path_that_is_a_url_gone_wrong_says_so() {
        assert_eq!(
            url_hint("http:/127.0.0.1:8080/m/v1/"),
            "; a URL has two slashes after its scheme: http://127.0.0.1:8080/m/v1/"
        );
        assert_eq!(
            url_hint("127.0.0.1:8080/m/v1/"),
            "; for a URL, give its scheme: http://127.0.0.1:8080/m/v1/"
        );
        assert_eq!(
            url_hint("models.example.com/m/v1/model.knot"),
            "; for a URL, give its scheme: http://models.example.com/m/v1/model.knot"
        );
        assert_eq!(url_hint("out/v1/model.knot"), "");
        assert_eq!(url_hint("model.knot"), "");
    }
}
