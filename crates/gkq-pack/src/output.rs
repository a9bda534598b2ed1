//! Atomic output: at every instant `OUT_DIR` holds a complete package, the
//! old one or the new one, never a mix and never nothing.
//!
//! The new package is written into a staging directory next to `OUT_DIR`
//! (`.NAME.gkq-new`, same file system), synced, and then swapped with the
//! old directory in one `renameat2(RENAME_EXCHANGE)`; the old package, now
//! under the staging name, is removed afterwards. A new `OUT_DIR` is a plain
//! rename of the staging directory. Files in an existing `OUT_DIR` that are
//! not part of a package (anything but `model.knot`, `*.rows`, their
//! `*.rows.proof`, the companion files and temporary files) are hard-linked into the staging directory first, so they survive.
//!
//! A run killed at any point leaves `OUT_DIR` complete and at most a
//! staging (`.NAME.gkq-new`) or retired (`.NAME.gkq-old`) sibling, which the
//! next run removes. On file systems without `RENAME_EXCHANGE` the old
//! directory is renamed to `.NAME.gkq-old` first, leaving a window of two
//! renames in which `OUT_DIR` does not exist (never one with a partial
//! package).
//!
//! Test hook: a test may set a function that runs just before each step of
//! [`CommitStep`] ([`set_commit_hook`]); the crash tests abort the process
//! there (no destructors, like a kill). Nothing sets it in the tools.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{IoContext, PackError, Result};

pub(crate) use gkq_format::KNOT_NAME;

/// The steps of a commit, in order (for the crash tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitStep {
    /// Link the files of the old directory that are not part of a package.
    Carry,
    /// Swap (or rename) the staging directory into place.
    Swap,
    /// Remove the retired old package.
    Clean,
    /// Sync the parent directory.
    SyncParent,
}

impl CommitStep {
    /// Every step, in order.
    pub const ALL: [CommitStep; 4] = [
        CommitStep::Carry,
        CommitStep::Swap,
        CommitStep::Clean,
        CommitStep::SyncParent,
    ];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            CommitStep::Carry => "carry",
            CommitStep::Swap => "swap",
            CommitStep::Clean => "clean",
            CommitStep::SyncParent => "sync-parent",
        }
    }
}

/// The function a test set to run before each commit step.
static COMMIT_HOOK: std::sync::OnceLock<fn(CommitStep)> = std::sync::OnceLock::new();

/// Sets, once per process, a function that runs just before each step of
/// a commit (for crash tests: it aborts the process at the step they
/// choose). Nothing in the tools sets one.
pub fn set_commit_hook(hook: fn(CommitStep)) {
    let _ = COMMIT_HOOK.set(hook);
}

fn fault_point(step: CommitStep) {
    if let Some(hook) = COMMIT_HOOK.get() {
        hook(step);
    }
}

/// The package being written and where it goes.
pub(crate) struct Output {
    dir: PathBuf,
    staging: PathBuf,
    retired: PathBuf,
    /// Final names of the files written, knot included.
    files: Vec<String>,
    committed: bool,
}

fn sibling(dir: &Path, suffix: &str) -> Result<PathBuf> {
    let name = dir
        .file_name()
        .ok_or_else(|| PackError::Io {
            path: dir.to_path_buf(),
            error: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the output directory needs a name (not / or ..)",
            ),
        })?
        .to_string_lossy();
    Ok(dir.with_file_name(format!(".{name}.{suffix}")))
}

/// Removes a leftover staging or retired directory of an interrupted run.
fn remove_leftover(p: &Path) -> Result<()> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(p).at(p),
        Ok(_) => fs::remove_file(p).at(p),
        Err(_) => Ok(()),
    }
}

/// Whether `name` in an old output directory belongs to a package (and is
/// therefore replaced, not carried over).
fn is_package_file(name: &str) -> bool {
    name == KNOT_NAME
        || name.ends_with(".rows")
        || name.ends_with(".rows.proof")
        || name.ends_with(".rows.runs")
        || name.ends_with(".rows.warm")
        || name.ends_with(".gkq-tmp")
        || crate::COMPANION_FILES.contains(&name)
}

fn sync_dir(p: &Path) -> Result<()> {
    File::open(p).and_then(|d| d.sync_all()).at(p)
}

impl Output {
    /// Checks `dir` (it must not exist unless `force`) and creates the
    /// staging directory next to it.
    pub(crate) fn prepare(dir: &Path, force: bool) -> Result<Output> {
        if dir.exists() && !force {
            return Err(PackError::OutDirExists {
                path: dir.to_path_buf(),
            });
        }
        let staging = sibling(dir, "gkq-new")?;
        let retired = sibling(dir, "gkq-old")?;
        remove_leftover(&staging)?;
        remove_leftover(&retired)?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).at(parent)?;
        }
        fs::create_dir(&staging).at(&staging)?;
        Ok(Output {
            dir: dir.to_path_buf(),
            staging,
            retired,
            files: Vec::new(),
            committed: false,
        })
    }

    /// Creates the file that will be `name` in the output directory.
    pub(crate) fn create(&mut self, name: &str) -> Result<(PathBuf, BufWriter<File>)> {
        let path = self.staging.join(name);
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .at(&path)?;
        self.files.push(name.to_owned());
        Ok((path, BufWriter::with_capacity(1 << 20, f)))
    }

    /// Leaves the old directory's `name` behind: it is not carried over
    /// into the new package. Whether there was one.
    pub(crate) fn leave_behind(&mut self, name: &str) -> bool {
        self.files.push(name.to_owned());
        self.dir.join(name).exists()
    }

    /// The old package's knot id, when the directory holds one whose
    /// preamble and header checksum agree.
    pub(crate) fn old_knot_id(&self) -> Option<gkq_format::KnotId> {
        use std::io::Read;
        let path = self.dir.join(KNOT_NAME);
        let mut f = File::open(path).ok()?;
        let mut bytes = Vec::new();
        loop {
            let total = match gkq_format::prefix_id(&bytes).ok()? {
                Ok(id) => return Some(id),
                Err(total) => total,
            };
            let have = bytes.len() as u64;
            (&mut f).take(total - have).read_to_end(&mut bytes).ok()?;
            if bytes.len() as u64 != total {
                return None;
            }
        }
    }

    /// Puts the package in place (the caller has synced every file).
    pub(crate) fn commit(mut self) -> Result<()> {
        sync_dir(&self.staging)?;
        let parent = self
            .dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        if self.dir.exists() {
            fault_point(CommitStep::Carry);
            self.carry_over()?;
            sync_dir(&self.staging)?;
            fault_point(CommitStep::Swap);
            let swapped = rustix::fs::renameat_with(
                rustix::fs::CWD,
                &self.staging,
                rustix::fs::CWD,
                &self.dir,
                rustix::fs::RenameFlags::EXCHANGE,
            );
            match swapped {
                Ok(()) => {
                    // the old package now lives under the staging name
                    fs::rename(&self.staging, &self.retired).at(&self.retired)?;
                }
                Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOSYS => {
                    fs::rename(&self.dir, &self.retired).at(&self.dir)?;
                    fs::rename(&self.staging, &self.dir).at(&self.dir)?;
                }
                Err(e) => {
                    return Err(PackError::Io {
                        path: self.dir.clone(),
                        error: e.into(),
                    });
                }
            }
            self.committed = true;
            fault_point(CommitStep::Clean);
            fs::remove_dir_all(&self.retired).at(&self.retired)?;
        } else {
            fault_point(CommitStep::Swap);
            fs::rename(&self.staging, &self.dir).at(&self.dir)?;
            self.committed = true;
        }
        fault_point(CommitStep::SyncParent);
        sync_dir(&parent)
    }

    /// Hard-links (or, across devices, copies) into the staging directory
    /// every entry of the old directory that is not part of a package.
    fn carry_over(&self) -> Result<()> {
        for entry in fs::read_dir(&self.dir).at(&self.dir)? {
            let entry = entry.at(&self.dir)?;
            let name = entry.file_name();
            let name_str = name.to_string_lossy();
            if is_package_file(&name_str) || self.files.iter().any(|f| *f == name_str) {
                continue;
            }
            let from = entry.path();
            let to = self.staging.join(&name);
            let kind = entry.file_type().at(&from)?;
            if kind.is_dir() {
                copy_tree(&from, &to)?;
            } else if fs::hard_link(&from, &to).is_err() {
                if kind.is_symlink() {
                    let target = fs::read_link(&from).at(&from)?;
                    std::os::unix::fs::symlink(target, &to).at(&to)?;
                } else {
                    fs::copy(&from, &to).at(&to)?;
                }
            }
        }
        Ok(())
    }
}

/// Copies a directory tree, hard-linking files where possible.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir(to).at(to)?;
    for entry in fs::read_dir(from).at(from)? {
        let entry = entry.at(from)?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type().at(&src)?.is_dir() {
            copy_tree(&src, &dst)?;
        } else if fs::hard_link(&src, &dst).is_err() {
            fs::copy(&src, &dst).at(&dst)?;
        }
    }
    Ok(())
}

impl Drop for Output {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.staging);
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

/// Refuses an output directory inside the model directory (packing would
/// read its own output next time, and `--force` could delete source files).
pub(crate) fn check_out_outside(model: &Path, out: &Path) -> Result<()> {
    let abs = |p: &Path| {
        p.canonicalize().unwrap_or_else(|_| {
            std::env::current_dir()
                .map(|c| c.join(p))
                .unwrap_or_else(|_| p.to_path_buf())
        })
    };
    let (m, o) = (abs(model), abs(out));
    if model.is_file() {
        // a GGUF file: the package may sit beside it, not around it
        if m.starts_with(&o) {
            return Err(PackError::OutInsideModel {
                out: out.to_path_buf(),
                model: model.to_path_buf(),
            });
        }
        return Ok(());
    }
    // `out` may not exist yet: compare its nearest existing ancestor too
    let o_parent = out
        .ancestors()
        .find(|a| !a.as_os_str().is_empty() && a.exists())
        .map(abs);
    if o.starts_with(&m) || o_parent.is_some_and(|p| p.starts_with(&m)) {
        return Err(PackError::OutInsideModel {
            out: out.to_path_buf(),
            model: model.to_path_buf(),
        });
    }
    Ok(())
}
