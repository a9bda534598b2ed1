//! A model that is not a package yet: a GGUF file, or a Hugging Face model
//! directory (`config.json` and safetensors), given where a knot belongs,
//! as llama.cpp's users give `-m model.gguf`. It is packed with gkq-pack's
//! defaults (no runs objects: they serve the network) and the package is
//! decoded as any other, so a local run and a published one are the same
//! code and give the same tokens.
//!
//! The package goes to the cache directory, `DIR/packed/<key>/`, where
//! `<key>` names the source's path; `DIR/packed/<key>.source` records what
//! was packed (the path, each file's length and modification time, the
//! packer's version). A later run whose record still holds reuses the
//! package; a source that changed is packed again over it, so the cache
//! keeps one package per source path. Without a cache the package goes to
//! a temporary directory, removed when the run ends.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, UNIX_EPOCH};

use gkq_format::{KNOT_NAME, hex};
use sha2::{Digest, Sha256};

use crate::{DecodeError, Result};

/// A source packed for this run.
#[derive(Debug)]
pub struct Packed {
    /// The source as given.
    pub source: PathBuf,
    /// The package directory.
    pub dir: PathBuf,
    /// How long the pack took; `None`: an earlier run's package was reused.
    pub took: Option<Duration>,
    /// The temporary directory holding the package (no cache), removed on
    /// drop.
    _temp: Option<tempfile::TempDir>,
}

/// The model source `arg` names, when it is one rather than a package: a
/// local `.gguf` file, or a directory without a knot holding a GGUF or a
/// `config.json` with safetensors. `None` for a URL, a knot or a package.
pub fn source_of(arg: &str) -> Option<PathBuf> {
    if arg.contains("://") {
        return None;
    }
    let path = Path::new(arg);
    let meta = std::fs::metadata(path).ok()?;
    let gguf = |p: &Path| {
        p.extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    };
    if meta.is_file() {
        return gguf(path).then(|| path.to_path_buf());
    }
    if !meta.is_dir() || path.join(KNOT_NAME).exists() {
        return None;
    }
    let names: Vec<PathBuf> = std::fs::read_dir(path)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    let safetensors = names
        .iter()
        .any(|p| p.extension().is_some_and(|e| e == "safetensors"));
    let hf = safetensors && path.join("config.json").is_file();
    (hf || names.iter().any(|p| gguf(p))).then(|| path.to_path_buf())
}

/// `source` packed into `cache` (`DIR/packed/`, see the module docs), or
/// into a temporary directory without one; an earlier run's package is
/// reused while its record holds.
pub fn pack(
    source: &Path,
    cache: Option<&Path>,
    progress: &dyn gkq_pack::Progress,
) -> Result<Packed> {
    let Some(cache) = cache else {
        let temp = tempfile::Builder::new()
            .prefix("gkq-decode-packed-")
            .tempdir()
            .map_err(|error| io(std::env::temp_dir(), error))?;
        let dir = temp.path().join("package");
        let took = pack_into(source, &dir, progress)?;
        return Ok(Packed {
            source: source.to_path_buf(),
            dir,
            took: Some(took),
            _temp: Some(temp),
        });
    };
    let root = cache.join("packed");
    let canonical = source
        .canonicalize()
        .map_err(|error| io(source.to_path_buf(), error))?;
    let key = hex(&Sha256::digest(canonical.as_os_str().as_encoded_bytes())[..8]);
    let (dir, stamp_path) = (root.join(&key), root.join(format!("{key}.source")));
    let stamp = stamp(&canonical)?;
    let held = std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp);
    if held && dir.join(KNOT_NAME).is_file() {
        return Ok(Packed {
            source: source.to_path_buf(),
            dir,
            took: None,
            _temp: None,
        });
    }
    std::fs::create_dir_all(&root).map_err(|error| io(root.clone(), error))?;
    // no record while the package is replaced: an interrupted pack is
    // packed again by the next run
    let _ = std::fs::remove_file(&stamp_path);
    let took = pack_into(source, &dir, progress)?;
    let temp = root.join(format!("{key}.source.tmp"));
    std::fs::write(&temp, &stamp)
        .and_then(|()| std::fs::rename(&temp, &stamp_path))
        .map_err(|error| io(stamp_path, error))?;
    Ok(Packed {
        source: source.to_path_buf(),
        dir,
        took: Some(took),
        _temp: None,
    })
}

/// Packs `source` into `dir` (replacing what is there) with gkq-pack's
/// defaults, without runs objects.
fn pack_into(source: &Path, dir: &Path, progress: &dyn gkq_pack::Progress) -> Result<Duration> {
    let started = Instant::now();
    let mut opts = gkq_pack::PackOptions::new(source, dir);
    opts.force = true;
    opts.runs = false;
    gkq_pack::pack(&opts, progress).map_err(|e| {
        DecodeError::Config(format!(
            "{} is a model, not a GKQ package, and packing it failed: {e}",
            source.display()
        ))
    })?;
    Ok(started.elapsed())
}

/// The record of what is packed: the path, each file's name, length and
/// modification time (a directory's files, not its subdirectories), and
/// the packer's version.
fn stamp(canonical: &Path) -> Result<String> {
    let mut files = vec![canonical.to_path_buf()];
    if canonical.is_dir() {
        files = std::fs::read_dir(canonical)
            .map_err(|error| io(canonical.to_path_buf(), error))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        files.sort();
    }
    let mut out = format!("{}\n{}\n", gkq_pack::TOOL, canonical.display());
    for f in files {
        let meta = std::fs::metadata(&f).map_err(|error| io(f.clone(), error))?;
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        out.push_str(&format!("{} {} {modified}\n", f.display(), meta.len()));
    }
    Ok(out)
}

fn io(path: PathBuf, error: std::io::Error) -> DecodeError {
    DecodeError::Io { path, error }
}
