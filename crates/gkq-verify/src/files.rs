//! Files as the gate opens them: regular files only, and the one place in
//! the workspace where a knot is memory-mapped (the gate reads every byte
//! of it; the uploader uses this too).
//!
//! # Safety contract of the map
//!
//! The knot is mapped read-only and privately, and this process never
//! writes it. If another process changes the file while it is mapped, the
//! bytes read may change under the checks: verification then reports
//! whatever mismatch that causes (a digest, a row), never undefined
//! behaviour in safe code that only reads `&[u8]`. Pages already checked
//! are given back to the kernel ([`Pages::release`]); touching them again
//! reads the file again.

use std::fs::File;
use std::path::{Path, PathBuf};

/// Opens `path` only if it is a regular file (a FIFO would block forever,
/// a device never end). Returns the file and its length.
pub(crate) fn open_regular(path: &Path) -> std::io::Result<(File, u64)> {
    let m = std::fs::metadata(path)?;
    if !m.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, device or directory is refused)",
        ));
    }
    let f = File::open(path)?;
    let len = f.metadata()?.len();
    Ok((f, len))
}

/// The knot path for a target that is a directory or a knot.
pub fn knot_path(target: &Path) -> PathBuf {
    if target.is_dir() {
        target.join(gkq_format::KNOT_NAME)
    } else {
        target.to_path_buf()
    }
}

/// A knot mapped into memory (see the module's safety contract).
#[derive(Debug)]
pub struct KnotMap {
    map: memmap2::Mmap,
    path: PathBuf,
}

impl KnotMap {
    /// Maps the regular file at `path`.
    pub fn open(path: &Path) -> std::io::Result<KnotMap> {
        let (file, _) = open_regular(path)?;
        // SAFETY: a read-only private map of a file this process never
        // writes; a concurrent writer can only change the bytes the checks
        // see (see the module docs), which they then report.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        Ok(KnotMap {
            map,
            path: path.to_path_buf(),
        })
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pages of this map, to give back as they are checked.
    pub(crate) fn pages(&self) -> Pages<'_> {
        Pages(&self.map)
    }
}

/// The knot's map, whose pages go back to the kernel once a chunk has been
/// checked, so that the gate's resident memory stays bounded whatever the
/// knot's size.
pub(crate) struct Pages<'m>(&'m memmap2::Mmap);

impl Pages<'_> {
    /// Drops the whole pages of `chunk` (a slice of the map) from this
    /// process's resident set.
    pub(crate) fn release(&self, chunk: &[u8]) {
        const PAGE: usize = 4096;
        let start = (chunk.as_ptr() as usize).wrapping_sub(self.0.as_ptr() as usize);
        if start >= self.0.len() {
            return;
        }
        let end = start.saturating_add(chunk.len()).min(self.0.len());
        let (a, b) = (start.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
        if b > a {
            // SAFETY: a private read-only mapping of a file this process
            // never writes: MADV_DONTNEED only drops clean pages, which the
            // next access reads from the file again.
            #[allow(unsafe_code)]
            let _ = unsafe {
                self.0
                    .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a, b - a)
            };
        }
    }
}
