//! The persistent verified cache: what a node pulled, kept on disk across
//! restarts, content-addressed so that a new model revision sharing
//! unchanged blocks reuses them.
//!
//! ```text
//! DIR/v1/header/<knot id>          the knot header (bytes 0..header_end)
//! DIR/v1/blob/<sha256>             block payloads, row files pulled whole, companion files
//! DIR/v1/table/<merkle root>       chunk tables of row proofs
//! DIR/v1/rows/<merkle root>/<row>  a verified row and its path record
//! DIR/v1/hint/<sha256 of a URL>    the header length last seen there (a size hint)
//! DIR/v1/tmp/                      entries being written
//! ```
//!
//! What it guarantees:
//! - **Nothing outside its directory.** A key is a digest (64 lowercase hex
//!   digits) or, for rows, a digest and a row number; anything else is
//!   refused before it becomes a path.
//! - **Bounded reads.** An entry is opened without following a link and
//!   without blocking (a FIFO), must be a regular file of the length the
//!   reader expects (a payload's, a row and its record, a table's; a header
//!   and a companion file at most a bound), and is read no further. A link,
//!   a special file, a directory or a file of another length where an entry
//!   belongs is removed (the link itself, never its target) and is a miss.
//! - **Verified reads.** Every entry is verified again when it is read (by
//!   the caller's check: its digest, its Merkle root, its knot id). One
//!   that fails is deleted, with a warning, and reported as a miss.
//! - **Atomic writes.** Entries are written to `tmp/` and renamed into
//!   place, so processes sharing one directory never see a torn entry. A
//!   temp file whose write fails is removed; temp files of writers that died
//!   (or older than [`STALE_TMP_AGE`]) are swept at open and at each
//!   eviction.
//! - **Bounded size.** Everything under the directory counts against the
//!   maximum (hints and temp files too); once over it, the least recently
//!   used entries (by modification time, which a hit refreshes) go.
//! - **Best effort.** A failure to write or evict is a warning, never an
//!   error of the read that asked for it. A directory that cannot be used
//!   at all is an error when it was asked for explicitly (`--cache-dir`),
//!   else a warning, and the node runs uncached.

mod entry;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use bytes::Bytes;
use gkq_store::bump;

use entry::Found;
pub use entry::STALE_TMP_AGE;
pub(crate) use entry::Size;

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
    /// The directory was asked for explicitly (`--cache-dir`): when it
    /// cannot be used, opening fails, naming it. Otherwise (the default
    /// directory) that is a warning, and the reader runs uncached.
    pub explicit: bool,
}

impl Default for CacheConfig {
    /// Off: a library does not write to the user's home unless asked.
    fn default() -> Self {
        CacheConfig {
            dir: None,
            max_bytes: DEFAULT_CACHE_MAX_BYTES,
            explicit: false,
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
    /// read, never trusted for content), by the SHA-256 of the URL without
    /// its query string.
    Hint,
    /// A signature object (FORMAT.md section 7c) that checked, by knot id.
    Signature,
}

const KINDS: [Kind; 6] = [
    Kind::Header,
    Kind::Blob,
    Kind::Table,
    Kind::Row,
    Kind::Hint,
    Kind::Signature,
];

impl Kind {
    fn dir(self) -> &'static str {
        match self {
            Kind::Header => "header",
            Kind::Blob => "blob",
            Kind::Table => "table",
            Kind::Row => "rows",
            Kind::Hint => "hint",
            Kind::Signature => "sig",
        }
    }
}

gkq_store::stats! {
    /// Counters of the disk cache.
    pub struct DiskStats live Counters {
        /// Entries read and verified.
        pub hits,
        /// Entries looked for and not there.
        pub misses,
        /// Entries that failed verification (or were not files of the
        /// expected length) and were deleted.
        pub corrupt,
        /// Bytes read from verified entries.
        pub bytes_read,
        /// Bytes written.
        pub bytes_written,
        /// Entries evicted to keep the bound (stale temp files included).
        pub evicted,
    }
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

/// Every file the cache holds: its entries, hints and temp files.
fn entries(root: &Path) -> Vec<(SystemTime, u64, PathBuf)> {
    let mut dirs: Vec<PathBuf> = KINDS.iter().map(|k| root.join(k.dir())).collect();
    dirs.push(root.join("tmp"));
    entry::files(dirs)
}

/// Removes the stale temp files under `root/tmp`; returns how many.
fn sweep_tmp(root: &Path) -> u64 {
    let now = SystemTime::now();
    let Ok(rd) = std::fs::read_dir(root.join("tmp")) else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        let modified = e
            .metadata()
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let name = e.file_name();
        if entry::stale_tmp(&name.to_string_lossy(), modified, now) {
            entry::clear(&e.path());
            n += 1;
        }
    }
    n
}

static NEXT_TMP: AtomicU64 = AtomicU64::new(0);

/// Whether `key` is a key of a digest-named entry (not a row).
#[cfg(test)]
pub(crate) fn valid_key(key: &str) -> bool {
    entry::valid_key(key, false)
}

impl DiskCache {
    /// Opens (creating it) the cache under `dir`, sweeps its stale temp
    /// files, and checks that it can be written.
    pub(crate) fn open(dir: &Path, max_bytes: u64) -> std::io::Result<DiskCache> {
        let root = dir.join("v1");
        for k in KINDS {
            std::fs::create_dir_all(root.join(k.dir()))?;
        }
        std::fs::create_dir_all(root.join("tmp"))?;
        let probe = root.join("tmp").join(entry::tmp_name("probe", 0));
        std::fs::write(&probe, b"")?;
        std::fs::remove_file(&probe)?;
        let swept = sweep_tmp(&root);
        let total = entries(&root).iter().map(|e| e.1).sum();
        let c = DiskCache {
            root,
            max_bytes,
            total: AtomicU64::new(total),
            counters: Arc::new(Counters::default()),
        };
        bump(&c.counters.evicted, swept);
        Ok(c)
    }

    /// The counters so far.
    pub(crate) fn stats(&self) -> DiskStats {
        self.counters.snapshot()
    }

    /// The path of entry `key`, or `None` when `key` is not a key of `kind`
    /// (so nothing outside the directory is ever touched).
    fn path(&self, kind: Kind, key: &str) -> Option<PathBuf> {
        if !entry::valid_key(key, kind == Kind::Row) {
            tracing::warn!(kind = ?kind, key, "not a cache key: ignored");
            return None;
        }
        Some(self.root.join(kind.dir()).join(key))
    }

    /// Whether an entry is there (not verified: [`DiskCache::get`] does that).
    pub(crate) fn contains(&self, kind: Kind, key: &str) -> bool {
        self.path(kind, key)
            .is_some_and(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file()))
    }

    /// The entry `key` of `kind`, if it is there, of a length `size`
    /// admits, and passes `verify`. Anything else found there is deleted
    /// and reported as a miss.
    pub(crate) async fn get(
        &self,
        kind: Kind,
        key: &str,
        size: Size,
        verify: impl FnOnce(&[u8]) -> bool + Send + 'static,
    ) -> Option<Bytes> {
        let path = self.path(kind, key)?;
        let counters = self.counters.clone();
        let task = tokio::task::spawn_blocking(move || {
            let bytes = match entry::read(&path, size) {
                Found::Bytes(b) => b,
                Found::Absent => {
                    bump(&counters.misses, 1);
                    return None;
                }
                Found::Removed(why) => {
                    bump(&counters.corrupt, 1);
                    tracing::warn!(entry = %path.display(), %why, "a cache entry was not a file of the expected length: removed, fetching it again");
                    return None;
                }
            };
            if !verify(&bytes) {
                bump(&counters.corrupt, 1);
                tracing::warn!(entry = %path.display(), bytes = bytes.len(), "a cache entry failed verification: deleted, fetching it again");
                entry::clear(&path);
                return None;
            }
            entry::touch(&path);
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
        self.put_many(kind, vec![(key.to_owned(), bytes)]).await;
    }

    /// Stores several entries of `kind` in one go (rows of one fetch). An
    /// entry that cannot be written is skipped (with a warning); the others
    /// are still written.
    pub(crate) async fn put_many(&self, kind: Kind, items: Vec<(String, Bytes)>) {
        let items: Vec<(PathBuf, Bytes)> = items
            .into_iter()
            .filter_map(|(k, b)| Some((self.path(kind, &k)?, b)))
            .collect();
        if items.is_empty() {
            return;
        }
        let tmp_dir = self.root.join("tmp");
        let write = tokio::task::spawn_blocking(move || {
            let mut written = 0u64;
            let mut failed: Option<(PathBuf, std::io::Error)> = None;
            for (path, bytes) in items {
                let n = NEXT_TMP.fetch_add(1, Ordering::Relaxed);
                let tmp = tmp_dir.join(entry::tmp_name(kind.dir(), n));
                match entry::write(&tmp, &path, &bytes) {
                    Ok(()) => written += bytes.len() as u64,
                    Err(e) => failed = failed.or(Some((path, e))),
                }
            }
            (written, failed)
        });
        let Ok((n, failed)) = write.await else {
            return;
        };
        if let Some((path, e)) = failed {
            tracing::warn!(kind = ?kind, entry = %path.display(), error = %e, "could not write a cache entry");
        }
        bump(&self.counters.bytes_written, n);
        let total = self.total.fetch_add(n, Ordering::Relaxed) + n;
        if total > self.max_bytes {
            self.evict().await;
        }
    }

    /// Sweeps stale temp files, then deletes the least recently used
    /// entries until the cache is within its bound.
    async fn evict(&self) {
        let root = self.root.clone();
        let max = self.max_bytes;
        let r = tokio::task::spawn_blocking(move || {
            let mut evicted = sweep_tmp(&root);
            let mut all = entries(&root);
            let mut total: u64 = all.iter().map(|e| e.1).sum();
            all.sort();
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
mod tests;
