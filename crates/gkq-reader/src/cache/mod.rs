//! The persistent verified cache: what a node pulled, kept on disk across
//! restarts, content-addressed so that a new model revision sharing
//! unchanged blocks reuses them.
//!
//! ```text
//! DIR/v1/header/<knot id>          the knot header (bytes 0..header_end)
//! DIR/v1/blob/<sha256>             block payloads, row files pulled whole, companion files
//! DIR/v1/table/<merkle root>       chunk tables of row proofs
//! DIR/v1/rows/<merkle root>/<row>  a verified row and its path record
//! DIR/v1/tmp/                      entries being written
//! ```
//!
//! - Every entry is written to `tmp/` and renamed into place, so processes
//!   sharing one directory never see a torn entry.
//! - Every entry is verified again when it is read (by the caller's check:
//!   its digest, its Merkle root, its knot id). One that fails is deleted,
//!   with a warning, and reported as a miss: it is never used.
//! - The cache is bounded: once it holds more than its maximum, the least
//!   recently used entries (by modification time, which a hit refreshes) go.
//! - It is best effort: a failure to write or evict is a warning, never an
//!   error of the read that asked for it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use bytes::Bytes;
use serde::Serialize;

/// Default bound of the cache: 16 GiB.
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 16 << 30;

/// Where and how much to cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// The cache directory (`--cache-dir`); `None` turns the cache off
    /// (`--no-cache`). [`default_cache_dir`] is what the CLIs use.
    pub dir: Option<PathBuf>,
    /// The bound, in bytes (`--cache-max-bytes`).
    pub max_bytes: u64,
}

impl Default for CacheConfig {
    /// Off: a library does not write to the user's home unless asked.
    fn default() -> Self {
        CacheConfig {
            dir: None,
            max_bytes: DEFAULT_CACHE_MAX_BYTES,
        }
    }
}

/// `$XDG_CACHE_HOME/gkq`, else `~/.cache/gkq`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    env("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("gkq"))
}

/// What an entry is, and so where it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A knot header, by knot id.
    Header,
    /// Bytes by their SHA-256.
    Blob,
    /// A chunk table, by Merkle root.
    Table,
    /// A row and its path record, by Merkle root and row.
    Row,
    /// The header length last seen at a URL (a size hint for the first
    /// read, never trusted for content), by the URL's SHA-256.
    Hint,
}

impl Kind {
    fn dir(self) -> &'static str {
        match self {
            Kind::Header => "header",
            Kind::Blob => "blob",
            Kind::Table => "table",
            Kind::Row => "rows",
            Kind::Hint => "hint",
        }
    }
}

/// Counters of the disk cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DiskStats {
    /// Entries read and verified.
    pub hits: u64,
    /// Entries looked for and not there.
    pub misses: u64,
    /// Entries that failed verification and were deleted.
    pub corrupt: u64,
    /// Bytes read from verified entries.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Entries evicted to keep the bound.
    pub evicted: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    corrupt: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    evicted: AtomicU64,
}

/// An open cache directory.
#[derive(Debug)]
pub(crate) struct DiskCache {
    root: PathBuf,
    max_bytes: u64,
    /// What this process believes the cache holds (refreshed by each eviction scan).
    total: AtomicU64,
    counters: Arc<Counters>,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Every entry file under `root`: `(modified, bytes, path)`.
fn entries(root: &Path) -> Vec<(SystemTime, u64, PathBuf)> {
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = [Kind::Header, Kind::Blob, Kind::Table, Kind::Row]
        .iter()
        .map(|k| root.join(k.dir()))
        .collect();
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                dirs.push(e.path());
            } else if m.is_file() {
                let t = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                out.push((t, m.len(), e.path()));
            }
        }
    }
    out
}

impl DiskCache {
    /// Opens (creating it) the cache under `dir`.
    pub(crate) fn open(dir: &Path, max_bytes: u64) -> std::io::Result<DiskCache> {
        let root = dir.join("v1");
        for k in [Kind::Header, Kind::Blob, Kind::Table, Kind::Row] {
            std::fs::create_dir_all(root.join(k.dir()))?;
        }
        std::fs::create_dir_all(root.join("tmp"))?;
        let total = entries(&root).iter().map(|e| e.1).sum();
        Ok(DiskCache {
            root,
            max_bytes,
            total: AtomicU64::new(total),
            counters: Arc::new(Counters::default()),
        })
    }

    /// The counters so far.
    pub(crate) fn stats(&self) -> DiskStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DiskStats {
            hits: l(&c.hits),
            misses: l(&c.misses),
            corrupt: l(&c.corrupt),
            bytes_read: l(&c.bytes_read),
            bytes_written: l(&c.bytes_written),
            evicted: l(&c.evicted),
        }
    }

    fn path(&self, kind: Kind, key: &str) -> PathBuf {
        self.root.join(kind.dir()).join(key)
    }

    /// Whether an entry is there (not verified: [`DiskCache::get`] does that).
    pub(crate) fn contains(&self, kind: Kind, key: &str) -> bool {
        self.path(kind, key).is_file()
    }

    /// The entry `key` of `kind`, if it is there and passes `verify`. An
    /// entry that fails is deleted and reported as a miss.
    pub(crate) async fn get(
        &self,
        kind: Kind,
        key: &str,
        verify: impl FnOnce(&[u8]) -> bool + Send + 'static,
    ) -> Option<Bytes> {
        let path = self.path(kind, key);
        let counters = self.counters.clone();
        let task = tokio::task::spawn_blocking(move || {
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(_) => {
                    bump(&counters.misses, 1);
                    return None;
                }
            };
            if !verify(&bytes) {
                bump(&counters.corrupt, 1);
                tracing::warn!(entry = %path.display(), bytes = bytes.len(), "a cache entry failed verification: deleted, fetching it again");
                let _ = std::fs::remove_file(&path);
                return None;
            }
            // a hit is recent use: eviction goes by modification time
            if let Ok(f) = std::fs::File::options().write(true).open(&path) {
                let _ = f.set_modified(SystemTime::now());
            }
            bump(&counters.hits, 1);
            bump(&counters.bytes_read, bytes.len() as u64);
            Some(Bytes::from(bytes))
        });
        let got = task.await.ok().flatten();
        tracing::debug!(kind = ?kind, key, hit = got.is_some(), "disk cache lookup");
        got
    }

    /// Stores `bytes` as entry `key` of `kind` (atomically), then evicts
    /// what is over the bound.
    pub(crate) async fn put(&self, kind: Kind, key: &str, bytes: Bytes) {
        let path = self.path(kind, key);
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tmp = self.root.join("tmp").join(format!(
            "{}.{}.{}",
            key.replace('/', "-"),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let n = bytes.len() as u64;
        let write = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&tmp, &bytes)?;
            std::fs::rename(&tmp, &path).inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })
        });
        match write.await {
            Ok(Ok(())) => {
                bump(&self.counters.bytes_written, n);
                let total = self.total.fetch_add(n, Ordering::Relaxed) + n;
                if total > self.max_bytes {
                    self.evict().await;
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(kind = ?kind, key, error = %e, "could not write a cache entry")
            }
            Err(e) => {
                tracing::warn!(kind = ?kind, key, error = %e, "could not write a cache entry")
            }
        }
    }

    /// Stores several entries of `kind` in one go (rows of one fetch).
    pub(crate) async fn put_many(&self, kind: Kind, items: Vec<(String, Bytes)>) {
        if items.is_empty() {
            return;
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let root = self.root.clone();
        let base = NEXT.fetch_add(1, Ordering::Relaxed);
        let write = tokio::task::spawn_blocking(move || -> std::io::Result<u64> {
            let mut n = 0u64;
            for (i, (key, bytes)) in items.into_iter().enumerate() {
                let path = root.join(kind.dir()).join(&key);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                let tmp = root
                    .join("tmp")
                    .join(format!("many.{}.{base}.{i}", std::process::id()));
                std::fs::write(&tmp, &bytes)?;
                if let Err(e) = std::fs::rename(&tmp, &path) {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
                n += bytes.len() as u64;
            }
            Ok(n)
        });
        match write.await {
            Ok(Ok(n)) => {
                bump(&self.counters.bytes_written, n);
                let total = self.total.fetch_add(n, Ordering::Relaxed) + n;
                if total > self.max_bytes {
                    self.evict().await;
                }
            }
            Ok(Err(e)) => tracing::warn!(kind = ?kind, error = %e, "could not write cache entries"),
            Err(e) => tracing::warn!(kind = ?kind, error = %e, "could not write cache entries"),
        }
    }

    /// Deletes the least recently used entries until the cache is within its bound.
    async fn evict(&self) {
        let root = self.root.clone();
        let max = self.max_bytes;
        let r = tokio::task::spawn_blocking(move || {
            let mut all = entries(&root);
            let mut total: u64 = all.iter().map(|e| e.1).sum();
            all.sort();
            let mut evicted = 0u64;
            for (_, len, path) in all {
                if total <= max {
                    break;
                }
                if std::fs::remove_file(&path).is_ok() {
                    total -= len;
                    evicted += 1;
                }
            }
            (total, evicted)
        })
        .await;
        if let Ok((total, evicted)) = r {
            self.total.store(total, Ordering::Relaxed);
            bump(&self.counters.evicted, evicted);
            tracing::debug!(evicted, total, max, "disk cache evicted entries");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn entries_are_verified_on_read_and_bad_ones_deleted() {
        let tmp = tempfile::tempdir().expect("tmp");
        let c = DiskCache::open(tmp.path(), 1 << 20).expect("open");
        rt().block_on(async {
            assert_eq!(c.get(Kind::Blob, "k", |_| true).await, None);
            c.put(Kind::Blob, "k", Bytes::from_static(b"abc")).await;
            assert_eq!(
                c.get(Kind::Blob, "k", |b| b == b"abc").await.as_deref(),
                Some(&b"abc"[..])
            );
            // a check that fails: deleted, and a miss from then on
            assert_eq!(c.get(Kind::Blob, "k", |_| false).await, None);
            assert!(!tmp.path().join("v1/blob/k").exists());
            assert_eq!(c.get(Kind::Blob, "k", |_| true).await, None);
        });
        let s = c.stats();
        assert_eq!((s.hits, s.corrupt, s.misses), (1, 1, 2));
        assert_eq!(s.bytes_written, 3);
    }

    #[test]
    fn eviction_keeps_the_bound_and_drops_the_oldest() {
        let tmp = tempfile::tempdir().expect("tmp");
        let c = DiskCache::open(tmp.path(), 2500).expect("open");
        rt().block_on(async {
            for i in 0..5 {
                c.put(
                    Kind::Row,
                    &format!("r/{i}"),
                    Bytes::from(vec![i as u8; 1000]),
                )
                .await;
                // distinct modification times, oldest first
                let p = tmp.path().join(format!("v1/rows/r/{i}"));
                let f = std::fs::File::options()
                    .write(true)
                    .open(&p)
                    .expect("entry");
                f.set_modified(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(100 + i))
                    .expect("mtime");
            }
            c.put(Kind::Blob, "new", Bytes::from(vec![9; 100])).await;
        });
        let left: u64 = entries(&tmp.path().join("v1")).iter().map(|e| e.1).sum();
        assert!(left <= 2500, "{left}");
        assert!(tmp.path().join("v1/blob/new").exists());
        assert!(!tmp.path().join("v1/rows/r/0").exists(), "oldest first");
        assert!(c.stats().evicted >= 3);
    }
}
