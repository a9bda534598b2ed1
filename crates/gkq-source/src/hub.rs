//! Where a model directory comes from: a plain directory, a Hugging Face
//! cache snapshot (`…/models--ORG--NAME/snapshots/REV/`), or a model id
//! `ORG/NAME` looked up in the local Hugging Face cache. Nothing is
//! downloaded.

use std::path::{Component, Path, PathBuf};

use crate::error::{Result, SourceError};

/// A located model directory and what its location says about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    /// The directory holding `config.json` and the safetensors files (or
    /// the GGUF file and its tokenizer files).
    pub dir: PathBuf,
    /// What to open: the directory, or the `.gguf` file given.
    pub source: PathBuf,
    /// `ORG/NAME` when the directory is a Hugging Face cache snapshot.
    pub model_id: Option<String>,
    /// The snapshot's revision (commit hash) when it is one.
    pub revision: Option<String>,
}

/// The Hugging Face hub cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
/// `~/.cache/huggingface/hub` (the rules of `huggingface_hub`).
pub fn hub_cache() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(c) = var("HF_HUB_CACHE") {
        return Some(PathBuf::from(c));
    }
    if let Some(h) = var("HF_HOME") {
        return Some(PathBuf::from(h).join("hub"));
    }
    let cache = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("huggingface").join("hub"))
}

/// `(ORG/NAME, REV)` when `dir` is `…/models--ORG--NAME/snapshots/REV`.
pub fn snapshot_identity(dir: &Path) -> Option<(String, String)> {
    let parts: Vec<&str> = dir
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    let [.., repo, snapshots, rev] = parts.as_slice() else {
        return None;
    };
    if *snapshots != "snapshots" {
        return None;
    }
    let id = repo.strip_prefix("models--")?.replacen("--", "/", 1);
    (!id.is_empty() && !rev.is_empty()).then(|| (id, (*rev).to_owned()))
}

/// Whether `arg` reads as a hub id `ORG/NAME` rather than a path.
fn looks_like_id(arg: &str) -> bool {
    let mut parts = arg.split('/');
    let (Some(org), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    ok(org) && ok(name)
}

/// Resolves the `MODEL_DIR` argument.
pub fn locate(arg: &Path) -> Result<Located> {
    if arg.is_file() && crate::gguf::is_gguf(arg) {
        let dir = arg
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        return Ok(Located {
            dir: dir.to_path_buf(),
            source: arg.to_path_buf(),
            model_id: None,
            revision: None,
        });
    }
    if arg.is_dir() {
        let canonical = arg.canonicalize().unwrap_or_else(|_| arg.to_path_buf());
        let (model_id, revision) = match snapshot_identity(&canonical) {
            Some((id, rev)) => (Some(id), Some(rev)),
            None => (None, None),
        };
        return Ok(Located {
            dir: arg.to_path_buf(),
            source: arg.to_path_buf(),
            model_id,
            revision,
        });
    }
    if arg.exists() {
        return Err(SourceError::NotADirectory {
            path: arg.to_path_buf(),
        });
    }
    if arg
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return Err(SourceError::NoGgufFile {
            path: arg.to_path_buf(),
            nearby: gguf_files_near(arg),
        });
    }
    let id = arg.to_str().filter(|s| looks_like_id(s));
    let (Some(id), Some(cache)) = (id, hub_cache()) else {
        return Err(SourceError::NoModelDir {
            path: arg.to_path_buf(),
        });
    };
    let repo = cache.join(format!("models--{}", id.replacen('/', "--", 1)));
    let not_cached = |reason: String| SourceError::NotInHubCache {
        id: id.to_owned(),
        cache: cache.clone(),
        reason,
    };
    let refs = repo.join("refs").join("main");
    // a revision is 40 hex digits: a larger file is not one
    let rev = gkq_files::read_text(&refs, 4096, "refs/main", gkq_files::Follow::Yes)
        .map_err(|e| not_cached(e.to_string()))?
        .trim()
        .to_owned();
    let dir = repo.join("snapshots").join(&rev);
    if rev.is_empty() || !dir.is_dir() {
        return Err(not_cached(format!(
            "refs/main names revision {rev:?}, but {} is not a directory",
            dir.display()
        )));
    }
    Ok(Located {
        source: dir.clone(),
        dir,
        model_id: Some(id.to_owned()),
        revision: Some(rev),
    })
}

/// What the directory of a missing `.gguf` path holds: its GGUF files (the
/// first eight), or why there are none to offer.
fn gguf_files_near(path: &Path) -> String {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return format!("{} does not exist either", dir.display());
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.to_ascii_lowercase().ends_with(".gguf"))
        .collect();
    names.sort();
    if names.is_empty() {
        return format!("{} holds no .gguf file", dir.display());
    }
    let more = if names.len() > 8 { ", …" } else { "" };
    names.truncate(8);
    format!(
        "the .gguf files in {}: {}{more}",
        dir.display(),
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_paths_name_model_and_revision() {
        assert_eq!(
            snapshot_identity(Path::new(
                "/h/hub/models--sentence-transformers--all-MiniLM-L6-v2/snapshots/c9745ed1"
            )),
            Some((
                "sentence-transformers/all-MiniLM-L6-v2".into(),
                "c9745ed1".into()
            ))
        );
        assert_eq!(
            snapshot_identity(Path::new("/x/models--gpt2/snapshots/abc")),
            Some(("gpt2".into(), "abc".into()))
        );
        assert_eq!(
            snapshot_identity(Path::new("/x/models--a--b/refs/main")),
            None
        );
        assert_eq!(snapshot_identity(Path::new("/x/a/b/c")), None);
    }

    #[test]
    fn ids_and_paths() {
        assert!(looks_like_id("Qwen/Qwen2.5-0.5B"));
        assert!(!looks_like_id("./model"));
        assert!(!looks_like_id("a/b/c"));
        assert!(!looks_like_id("/abs"));
        assert!(!looks_like_id("model"));
    }

    #[test]
    fn directories_and_mistakes() {
        let dir = tempfile::tempdir().expect("tmp");
        let snap = dir.path().join("models--org--m/snapshots/rev1");
        std::fs::create_dir_all(&snap).expect("snapshot");
        let l = locate(&snap).expect("a directory");
        assert_eq!(l.model_id.as_deref(), Some("org/m"));
        assert_eq!(l.revision.as_deref(), Some("rev1"));
        let plain = locate(dir.path()).expect("a plain directory");
        assert_eq!((plain.model_id, plain.revision), (None, None));
        let file = dir.path().join("f");
        std::fs::write(&file, b"").expect("file");
        assert!(matches!(
            locate(&file),
            Err(SourceError::NotADirectory { .. })
        ));
        assert!(matches!(
            locate(&dir.path().join("nope/x/y")),
            Err(SourceError::NoModelDir { .. })
        ));
    }
}
