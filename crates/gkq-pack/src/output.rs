//! Atomic output: everything is written under temporary names inside the
//! output directory and renamed into place only when all of it succeeded,
//! row files first and the knot last. On failure (or drop before commit)
//! the temporary files are removed, and a directory this run created is
//! removed again.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{IoContext, PackError, Result};

/// Final name of the knot in the output directory.
pub const KNOT_NAME: &str = "model.knot";

/// The files being written and where they go.
pub(crate) struct Output {
    dir: PathBuf,
    created_dir: bool,
    /// `(temporary, final)`, knot last.
    files: Vec<(PathBuf, PathBuf)>,
    committed: bool,
}

fn tmp_name(name: &str) -> String {
    format!(".{name}.gkq-tmp")
}

impl Output {
    /// Checks `dir` (it must not exist unless `force`) and creates it.
    pub(crate) fn prepare(dir: &Path, force: bool) -> Result<Output> {
        let exists = dir.exists();
        if exists && !force {
            return Err(PackError::OutDirExists {
                path: dir.to_path_buf(),
            });
        }
        if exists {
            // leftovers of an interrupted run
            for entry in fs::read_dir(dir).at(dir)? {
                let p = entry.at(dir)?.path();
                if p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with('.') && n.ends_with(".gkq-tmp"))
                {
                    fs::remove_file(&p).at(&p)?;
                }
            }
        } else {
            fs::create_dir_all(dir).at(dir)?;
        }
        Ok(Output {
            dir: dir.to_path_buf(),
            created_dir: !exists,
            files: Vec::new(),
            committed: false,
        })
    }

    /// Creates the temporary file for final name `name`.
    pub(crate) fn create(&mut self, name: &str) -> Result<(PathBuf, BufWriter<File>)> {
        let tmp = self.dir.join(tmp_name(name));
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .at(&tmp)?;
        self.files.push((tmp.clone(), self.dir.join(name)));
        Ok((tmp, BufWriter::with_capacity(1 << 20, f)))
    }

    /// Renames every file into place: the old knot is removed first (so no
    /// knot ever points at rows it was not made with), then the row files,
    /// then the new knot; then the directory is synced.
    pub(crate) fn commit(mut self) -> Result<()> {
        let knot = self.dir.join(KNOT_NAME);
        if knot.exists() {
            fs::remove_file(&knot).at(&knot)?;
        }
        self.files.sort_by_key(|(_, dst)| dst == &knot);
        for (tmp, dst) in &self.files {
            fs::rename(tmp, dst).at(dst)?;
        }
        // row files of an earlier run that this knot does not reference
        for entry in fs::read_dir(&self.dir).at(&self.dir)? {
            let p = entry.at(&self.dir)?.path();
            let stale = p.extension().is_some_and(|e| e == "rows")
                && !self.files.iter().any(|(_, dst)| dst == &p);
            if stale {
                fs::remove_file(&p).at(&p)?;
            }
        }
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .at(&self.dir)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        for (tmp, _) in &self.files {
            let _ = fs::remove_file(tmp);
        }
        if self.created_dir {
            let _ = fs::remove_dir(&self.dir);
        }
    }
}

/// Flushes a writer into its file (the caller syncs it before commit).
pub(crate) fn flush_file(w: BufWriter<File>, path: &Path) -> Result<File> {
    w.into_inner().map_err(|e| PackError::Io {
        path: path.to_path_buf(),
        error: e.into_error(),
    })
}

/// Writes all of `bytes`, naming `path` on failure.
pub(crate) fn write_all(w: &mut impl Write, bytes: &[u8], path: &Path) -> Result<()> {
    w.write_all(bytes).at(path)
}
