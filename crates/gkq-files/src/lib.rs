//! Files as the GKQ tools open them, the one home of that policy:
//!
//! - **regular files only**: a FIFO would block a reader forever, a
//!   device (`/dev/zero`) never end, so both are refused at open, which
//!   never blocks (`O_NONBLOCK`);
//! - **the length is known before a byte is read**, and a file that must be
//!   held in memory whole is refused above a limit the caller names (a
//!   signature, a key, a tokenizer), with that limit in the message;
//! - **no link is followed** out of a package: a file a package holds is
//!   opened with `O_NOFOLLOW` ([`Follow::No`]); a file the user names on
//!   the command line (a key) may be a link ([`Follow::Yes`]).
//!
//! A file is read to its end, but never past the caller's limit: one that
//! grows while it is read costs no more memory than the limit, and one
//! whose length the file system does not know (`/proc/self/status`, length
//! 0 by `stat`) is read whole.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// Why a file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// It cannot be opened, examined or read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// Not a regular file: a FIFO, a device, a socket, a directory, or a
    /// link where none may be followed.
    #[error("{}: {what}, not a regular file (a FIFO, device, directory or link is refused)", path.display())]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is.
        what: &'static str,
    },
    /// Longer than what the caller will hold in memory (`len` is at least
    /// its length: what was read before the limit stopped it).
    #[error("{}: {len} bytes, over the limit of {limit} bytes for {what}", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The limit.
        limit: u64,
        /// What the file was read as (`a signature object`, `a public key`).
        what: &'static str,
    },
    /// A key file that holds no key the format accepts.
    #[error("{}: {error}", path.display())]
    Key {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        error: Box<gkq_format::Error>,
    },
}

/// The public keys a checker trusts (`--trust-key`), one ECDSA P-256 key
/// in PEM per file, each at most [`MAX_KEY_LEN`] bytes.
pub fn load_trusted_keys(paths: &[PathBuf]) -> Result<Vec<gkq_format::sig::PublicKey>> {
    paths
        .iter()
        .map(|path| {
            let pem = read_text(path, MAX_KEY_LEN, "a public key", Follow::Yes)?;
            gkq_format::sig::PublicKey::from_pem(&pem).map_err(|error| FileError::Key {
                path: path.clone(),
                error: Box::new(error),
            })
        })
        .collect()
}

/// The largest key file read: 64 KiB (a P-256 key in PEM is about 180 bytes).
pub const MAX_KEY_LEN: u64 = 64 << 10;

/// `Result` with [`FileError`].
pub type Result<T, E = FileError> = std::result::Result<T, E>;

/// Whether a symbolic link at the path itself is followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Follow {
    /// A file the user named: a link to a regular file is fine.
    Yes,
    /// A file inside a package: a link is refused, never followed out of it.
    No,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |error| FileError::Io {
        path: path.to_owned(),
        error,
    }
}

/// What a file type is, for messages.
fn kind(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a file"
    }
}

/// Opens `path` as a regular file without blocking (a FIFO is refused,
/// not waited on); with its length.
pub fn open_regular(path: &Path, follow: Follow) -> Result<(File, u64)> {
    let mut flags = libc::O_NONBLOCK;
    if follow == Follow::No {
        flags |= libc::O_NOFOLLOW;
    }
    let f = match File::options().read(true).custom_flags(flags).open(path) {
        Ok(f) => f,
        // O_NOFOLLOW on a link fails with ELOOP
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) && follow == Follow::No => {
            return Err(FileError::NotRegular {
                path: path.to_owned(),
                what: "a symbolic link",
            });
        }
        Err(e) => return Err(io(path)(e)),
    };
    let meta = f.metadata().map_err(io(path))?;
    if !meta.is_file() {
        return Err(FileError::NotRegular {
            path: path.to_owned(),
            what: kind(meta.file_type()),
        });
    }
    Ok((f, meta.len()))
}

/// The bytes of the regular file at `path`, refused when it is longer than
/// `limit`: before a byte is read when its length says so, else once more
/// than `limit` bytes were read (a file that grows, or a `/proc` file whose
/// length is 0 by `stat`). `what` names the file in the refusal (`a
/// signature object`).
pub fn read_bounded(
    path: &Path,
    limit: u64,
    what: &'static str,
    follow: Follow,
) -> Result<Vec<u8>> {
    let (f, len) = open_regular(path, follow)?;
    if len > limit {
        return Err(FileError::TooLarge {
            path: path.to_owned(),
            len,
            limit,
            what,
        });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    f.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io(path))?;
    if bytes.len() as u64 > limit {
        return Err(FileError::TooLarge {
            path: path.to_owned(),
            len: bytes.len() as u64,
            limit,
            what,
        });
    }
    Ok(bytes)
}

/// As [`read_bounded`], as UTF-8 text.
pub fn read_text(path: &Path, limit: u64, what: &'static str, follow: Follow) -> Result<String> {
    let bytes = read_bounded(path, limit, what, follow)?;
    String::from_utf8(bytes).map_err(|e| {
        io(path)(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text ({e})"),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_a_regular_file_and_what_is_too_long() {
        let tmp = tempfile::tempdir().expect("tmp");
        let ok = tmp.path().join("ok");
        std::fs::write(&ok, b"abc").expect("write");
        assert_eq!(
            read_bounded(&ok, 3, "a test file", Follow::No).expect("read"),
            b"abc"
        );
        let e = read_bounded(&ok, 2, "a test file", Follow::No).expect_err("too long");
        assert!(
            e.to_string()
                .contains("3 bytes, over the limit of 2 bytes for a test file"),
            "{e}"
        );
        let e = read_bounded(Path::new("/dev/zero"), 1 << 20, "a key", Follow::Yes)
            .expect_err("device");
        assert!(
            e.to_string().contains("a device, not a regular file"),
            "{e}"
        );
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).expect("symlink");
        let e = read_bounded(&link, 1 << 20, "a key", Follow::Yes).expect_err("link to device");
        assert!(e.to_string().contains("a device"), "{e}");
        let e = read_bounded(&link, 1 << 20, "a key", Follow::No).expect_err("link");
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        let fifo = tmp.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        // returns at once: a FIFO is refused, not waited on
        let e = read_bounded(&fifo, 1 << 20, "a key", Follow::No).expect_err("fifo");
        assert!(e.to_string().contains("a FIFO"), "{e}");
        let e = read_bounded(tmp.path(), 1 << 20, "a key", Follow::Yes).expect_err("dir");
        assert!(e.to_string().contains("a directory"), "{e}");
    }

    /// Issue 57, J11: a file whose length `stat` gives as 0 is read to its
    /// end, within the limit.
    #[test]
    fn a_file_of_unknown_length_is_read_to_its_end_within_the_limit() {
        let status = Path::new("/proc/self/status");
        assert_eq!(std::fs::metadata(status).expect("stat").len(), 0);
        let text = read_text(status, 1 << 20, "a status", Follow::Yes).expect("read");
        assert!(text.contains("Threads:"), "{text}");
        let e = read_bounded(status, 16, "a status", Follow::Yes).expect_err("over");
        assert!(
            e.to_string()
                .contains("17 bytes, over the limit of 16 bytes"),
            "{e}"
        );
    }
}
