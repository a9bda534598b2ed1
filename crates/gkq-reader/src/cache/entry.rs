//! The file operations of the disk cache, each bounded to what the cache
//! owns: keys are checked before they become paths, entries are opened
//! without following links and without blocking on special files, read
//! no further than their expected length, and written through temp files
//! that are removed when a write fails (and swept when a writer died).

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A temp file older than this is stale even when a process with its
/// writer's pid is alive (the pid was reused): no entry takes that long to
/// write, since each is written from memory in one go.
pub const STALE_TMP_AGE: Duration = Duration::from_secs(3600);

/// How long an entry must be, as the reader knows before it opens it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Size {
    /// Exactly this many bytes (a payload, a row and its record, a table).
    Exact(u64),
    /// At most this many (a header, a companion file).
    AtMost(u64),
}

impl Size {
    fn admits(self, len: u64) -> bool {
        match self {
            Size::Exact(n) => len == n,
            Size::AtMost(n) => len <= n,
        }
    }
}

/// Whether `key` is a key of the cache: one name of 64 lowercase hex
/// digits, or (rows) such a name, `/`, and a decimal row number. Anything
/// else (`..`, an absolute path, a separator elsewhere) is refused before
/// it becomes a path, so no operation can reach outside the directory.
pub(crate) fn valid_key(key: &str, row: bool) -> bool {
    let hex = |s: &str| s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    match key.split_once('/') {
        None => !row && hex(key),
        Some((root, n)) => {
            row && hex(root)
                && !n.is_empty()
                && n.len() <= 20
                && n.bytes().all(|b| b.is_ascii_digit())
        }
    }
}

/// What was found where an entry belongs.
pub(crate) enum Found {
    /// Nothing.
    Absent,
    /// A regular file of an admissible length, read whole.
    Bytes(Vec<u8>),
    /// Something else (a link, a FIFO, a device, a directory, a file of the
    /// wrong length, an unreadable file), removed: a miss.
    Removed(String),
}

/// Reads the entry at `path`: opened without following a link and without
/// blocking (a FIFO), accepted only as a regular file whose length `size`
/// admits, and read no further than that length. Anything else is removed
/// (the path is inside the cache: its key was checked).
pub(crate) fn read(path: &Path, size: Size) -> Found {
    let opened = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let f = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Found::Absent,
        Err(e) => return remove(path, format!("cannot be opened as a file ({e})")),
    };
    let meta = match f.metadata() {
        Ok(m) => m,
        Err(e) => return remove(path, format!("cannot be examined ({e})")),
    };
    if !meta.is_file() {
        let what = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return remove(path, what.to_owned());
    }
    if !size.admits(meta.len()) {
        return remove(path, format!("{} bytes, expected {size:?}", meta.len()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    match f.take(meta.len()).read_to_end(&mut bytes) {
        Ok(_) if bytes.len() as u64 == meta.len() => Found::Bytes(bytes),
        Ok(_) => remove(path, "changed while it was read".into()),
        Err(e) => remove(path, format!("cannot be read ({e})")),
    }
}

/// Removes whatever stands at `path` (a link itself, not its target; a
/// directory with its contents), and says why it went.
fn remove(path: &Path, why: String) -> Found {
    clear(path);
    Found::Removed(why)
}

/// Removes whatever stands at `path`, never following a link.
pub(crate) fn clear(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(path);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
}

/// Marks a hit as recent use (eviction goes by modification time).
pub(crate) fn touch(path: &Path) {
    if let Ok(f) = File::options()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// Makes `dir` (under `root`) a real directory: a link or a file in its
/// place is removed first, so that nothing is written through a link.
fn real_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => clear(dir),
        Err(_) => {}
    }
    std::fs::create_dir(dir).or_else(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => Ok(()),
        _ => Err(e),
    })
}

/// Writes `bytes` to `tmp`, then renames it to `path` (whatever stood
/// there, a directory included, is replaced). A temp file whose write or
/// rename failed is removed, so a full disk does not stay full.
pub(crate) fn write(tmp: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let r = (|| {
        if let Some(parent) = path.parent() {
            real_dir(parent)?;
        }
        let mut f = File::options()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp)?;
        f.write_all(bytes)?;
        drop(f);
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
            clear(path);
        }
        std::fs::rename(tmp, path)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    r
}

/// The name of a temp file: `<what>.<pid>.<n>`, so that a sweep can tell a
/// live writer's file from a dead one's.
pub(crate) fn tmp_name(what: &str, n: u64) -> String {
    format!("{what}.{}.{n}", std::process::id())
}

/// Whether the temp file `name` (modified at `modified`) is stale: its
/// writer is not a live process, or it is older than [`STALE_TMP_AGE`].
pub(crate) fn stale_tmp(name: &str, modified: SystemTime, now: SystemTime) -> bool {
    let old = now
        .duration_since(modified)
        .is_ok_and(|age| age > STALE_TMP_AGE);
    let pid = name.rsplit('.').nth(1).and_then(|p| p.parse::<u32>().ok());
    let alive =
        pid.is_some_and(|p| p == std::process::id() || Path::new(&format!("/proc/{p}")).exists());
    old || !alive
}

/// Every file under `dirs` (recursively), links and special files
/// included: `(modified, bytes, path)`; a link or special file counts 0
/// bytes and the oldest time, so eviction takes it first.
pub(crate) fn files(dirs: Vec<PathBuf>) -> Vec<(SystemTime, u64, PathBuf)> {
    let mut out = Vec::new();
    let mut dirs = dirs;
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            // DirEntry::metadata does not follow links
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                dirs.push(e.path());
            } else if m.is_file() {
                let t = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                out.push((t, m.len(), e.path()));
            } else {
                out.push((SystemTime::UNIX_EPOCH, 0, e.path()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_digests_or_rows_of_a_digest() {
        let h = "ab".repeat(32);
        assert!(valid_key(&h, false));
        assert!(valid_key(&format!("{h}/17"), true));
        for bad in [
            "../../../victim.txt",
            "/etc/passwd",
            "",
            &h[..63],
            &h.to_ascii_uppercase(),
            &format!("{h}/../x"),
            &format!("{h}/"),
            &format!("{h}/1/2"),
            &format!("../{h}"),
        ] {
            assert!(!valid_key(bad, false) && !valid_key(bad, true), "{bad}");
        }
        assert!(
            !valid_key(&format!("{h}/17"), false),
            "a row key is not a blob key"
        );
        assert!(!valid_key(&h, true), "a blob key is not a row key");
    }

    #[test]
    fn temp_files_of_dead_writers_or_old_ones_are_stale() {
        let now = SystemTime::now();
        let mine = tmp_name("blob", 3);
        assert!(!stale_tmp(&mine, now, now));
        assert!(stale_tmp(
            &mine,
            now - STALE_TMP_AGE - Duration::from_secs(1),
            now
        ));
        // pid 4194304 is above Linux's pid_max
        assert!(stale_tmp("blob.4194304.1", now, now));
        assert!(stale_tmp("garbage", now, now));
    }
}
