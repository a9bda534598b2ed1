//! A verified copy of a published package in a directory that any HTTP
//! server can serve (a regional mirror, an air-gapped site, the staging of
//! an upload of a package given by URL): `gkq-mirror URL DIR` and
//! r2-upload's `stage` both run [`mirror`].
//!
//! The knot is opened as a node opens it (its trust policy: `--trust-key`,
//! `--knot-id`). Every object it names is then fetched into a staging
//! directory inside DIR (`.gkq-mirror/`), an object with a recorded digest
//! (row files, companions) checked before it takes its name there; the
//! staged package must then pass gkq-verify's local checks (proof, runs
//! and warm objects rebuilt from the rows, the knot against its id and
//! every payload digest). Only then are the objects renamed into DIR: row
//! files first, the knot and its signature last. So no name in DIR ever
//! holds an unverified byte, whenever the process is killed, and a
//! directory without `model.knot` is visibly unfinished. A second run
//! resumes: what is staged and checks out is kept, and so is what DIR
//! already holds of this package.
//!
//! A directory that holds another package (another knot id, or files this
//! knot does not name) is refused, unless [`MirrorOptions::replace`]: then
//! it is replaced whole, the old knot removed first.

use std::path::{Path, PathBuf};

use gkq_format::progress::{NoProgress, Progress};
use gkq_format::sig::{self, SIGNATURE_NAME};
use gkq_format::{KNOT_NAME, KnotId};
use gkq_reader::{Reader, ReaderConfig, Serve, Trusted};
use gkq_store::blocking::Runtime;
use gkq_store::{Store, StoreError};
use serde::Serialize;

/// The staging directory inside DIR.
pub const STAGING: &str = ".gkq-mirror";

/// Why a mirror failed. Nothing under a final name in DIR is unverified.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MirrorError {
    /// Opening the knot (its trust included) failed.
    #[error(transparent)]
    Reader(#[from] gkq_reader::ReaderError),
    /// A read of the package failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A signature object that does not parse.
    #[error(transparent)]
    Format(#[from] gkq_format::Error),
    /// A file of DIR.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// An object that is not the one the knot names.
    #[error("{url}: {reason}")]
    Object {
        /// The object's URL.
        url: String,
        /// What is wrong (the expected and received digest).
        reason: String,
    },
    /// DIR holds another package.
    #[error("{}: holds another package ({found}), not knot {knot}: give another directory, or --replace to replace it whole", dir.display())]
    OtherPackage {
        /// The directory.
        dir: PathBuf,
        /// What it holds.
        found: String,
        /// The knot mirrored.
        knot: String,
    },
    /// The staged copy fails the release gate's checks.
    #[error("{}: the mirrored package fails verification (nothing was moved into the directory):\n{}", dir.display(), failures.join("\n"))]
    Verify {
        /// The mirror directory.
        dir: PathBuf,
        /// One line per failure.
        failures: Vec<String>,
    },
}

/// `Result` with [`MirrorError`].
pub type Result<T, E = MirrorError> = std::result::Result<T, E>;

/// How to mirror.
#[derive(Clone, Copy, Debug, Default)]
pub struct MirrorOptions {
    /// Replace a directory that holds another package, whole.
    pub replace: bool,
}

/// One object of the package.
#[derive(Clone, Debug, Serialize)]
pub struct MirroredObject {
    /// Its name in the package.
    pub name: String,
    /// Its length.
    pub bytes: u64,
    /// `fetched`, or `kept` (already staged or in DIR, and verified).
    pub status: &'static str,
}

/// What a mirror did.
#[derive(Clone, Debug, Serialize)]
pub struct MirrorReport {
    /// The knot id mirrored.
    pub knot_id: String,
    /// Why the knot was trusted.
    pub trusted: Trusted,
    /// Every object, in the order written.
    pub objects: Vec<MirroredObject>,
    /// Bytes fetched over the network.
    pub fetched_bytes: u64,
    /// Files of another package removed (`--replace`).
    pub replaced: Vec<String>,
}

/// An object to copy: its name, length (0: its HEAD's) and the digest
/// the knot records (`None`: checked by the verification of the whole).
struct Wanted {
    name: String,
    len: u64,
    sha256: Option<[u8; 32]>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> MirrorError + '_ {
    move |error| MirrorError::Io {
        path: path.to_owned(),
        error,
    }
}

/// The objects the knot names (row files with their proof, runs and warm
/// objects, then the companions), then the knot.
fn wanted(reader: &Reader) -> Vec<Wanted> {
    let header = reader.knot().header();
    let mut out: Vec<Wanted> = header
        .header()
        .objects()
        .into_iter()
        .map(|o| Wanted {
            name: o.name,
            len: o.len.unwrap_or(0),
            sha256: o.sha256,
        })
        .collect();
    out.push(Wanted {
        name: KNOT_NAME.to_owned(),
        len: header.preamble().file_len,
        sha256: None,
    });
    out
}

/// What DIR holds that is not this package: its knot's id when it is
/// another, and the files the knot does not name.
fn foreign(dir: &Path, id: KnotId, wanted: &[Wanted]) -> Result<Option<(String, Vec<String>)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(dir)(e)),
    };
    let mut files = Vec::new();
    for e in entries {
        let name = e
            .map_err(io(dir))?
            .file_name()
            .to_string_lossy()
            .into_owned();
        let ours =
            name == STAGING || name == SIGNATURE_NAME || wanted.iter().any(|w| w.name == name);
        if !ours {
            files.push(name);
        }
    }
    files.sort();
    let other_knot = match gkq_sign::knot_id_of(dir) {
        Ok(k) if k != id => Some(format!("knot {k}")),
        Ok(_) => None,
        Err(_) if dir.join(KNOT_NAME).exists() => Some("a model.knot that is not a knot".into()),
        Err(_) => None,
    };
    Ok(match (other_knot, files.is_empty()) {
        (None, true) => None,
        (Some(k), true) => Some((k, files)),
        (k, false) => {
            let listed = files.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
            let more = if files.len() > 5 { ", …" } else { "" };
            let what = format!(
                "{} files this knot does not name: {listed}{more}",
                files.len()
            );
            Some((
                k.map_or(what.clone(), |k| format!("{k}, and {what}")),
                files,
            ))
        }
    })
}

/// Fetches `url` into `path` (`gkq_store::copy_to_file`: renamed only
/// when its SHA-256 is the one the knot records); its length.
async fn fetch(
    store: &Store,
    url: &str,
    (len, want): (u64, Option<[u8; 32]>),
    path: &Path,
    progress: &dyn Progress,
) -> Result<u64> {
    match gkq_store::copy_to_file(store, url, (len, want), path, progress).await {
        Err(StoreError::Digest {
            url,
            expected,
            found,
            ..
        }) => Err(MirrorError::Object {
            url,
            reason: format!("sha256 {found}, but the knot records {expected}"),
        }),
        other => Ok(other?),
    }
}

/// Whether `path` holds `w`: its digest when the knot records one, else
/// its length (the verification of the whole checks the bytes).
fn holds(path: &Path, w: &Wanted) -> bool {
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return false;
    };
    if !m.is_file() || (w.len != 0 && m.len() != w.len) {
        return false;
    }
    match w.sha256 {
        Some(want) => gkq_sign::sha_file(path).ok() == Some(want),
        None => true,
    }
}

/// Stages one object: kept when staged already, linked from DIR when DIR
/// holds it, else fetched.
async fn stage(
    store: &Store,
    (base, dir, staging): (&str, &Path, &Path),
    w: &Wanted,
    this_package: bool,
    progress: &dyn Progress,
) -> Result<MirroredObject> {
    let staged = staging.join(&w.name);
    let kept = |bytes| {
        progress.advance(bytes);
        MirroredObject {
            name: w.name.clone(),
            bytes,
            status: "kept",
        }
    };
    if holds(&staged, w) {
        return Ok(kept(std::fs::metadata(&staged).map_or(0, |m| m.len())));
    }
    let final_path = dir.join(&w.name);
    // DIR's own copy of this package: checked again with the whole
    if this_package && holds(&final_path, w) && std::fs::hard_link(&final_path, &staged).is_ok() {
        return Ok(kept(std::fs::metadata(&staged).map_or(0, |m| m.len())));
    }
    let url = gkq_store::url::sibling(base, &w.name);
    let bytes = fetch(store, &url, (w.len, w.sha256), &staged, progress).await?;
    Ok(MirroredObject {
        name: w.name.clone(),
        bytes,
        status: "fetched",
    })
}

/// The package's signature object, staged when it has one; refused when
/// it does not name this knot.
async fn stage_signature(
    store: &Store,
    base: &str,
    staging: &Path,
    id: KnotId,
) -> Result<Option<MirroredObject>> {
    let url = gkq_store::url::sibling(base, SIGNATURE_NAME);
    let Some((bytes, _)) = gkq_store::read_signature(store, base).await? else {
        return Ok(None);
    };
    if sig::claimed_knot(&bytes)? != Some(id) {
        return Err(MirrorError::Object {
            url,
            reason: format!("a signature object that does not name knot {id}"),
        });
    }
    let path = staging.join(SIGNATURE_NAME);
    let tmp = staging.join(format!(".{SIGNATURE_NAME}.part"));
    std::fs::write(&tmp, &bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    Ok(Some(MirroredObject {
        name: SIGNATURE_NAME.to_owned(),
        bytes: bytes.len() as u64,
        status: "fetched",
    }))
}

/// Mirrors the package of the knot at `url` into `dir` (see the crate
/// docs).
pub fn mirror(
    url: &str,
    dir: &Path,
    config: ReaderConfig,
    opts: MirrorOptions,
) -> Result<MirrorReport> {
    let store_config = config.store.clone();
    // the bar of the copy (the reader pulls nothing here)
    let progress = config.progress.clone();
    let reader = Reader::open(url, config, Serve::NONE)?;
    let base = reader.knot().location().to_owned();
    let id = reader.knot().id();
    let wanted = wanted(&reader);
    let other = foreign(dir, id, &wanted)?;
    if let (Some((found, _)), false) = (&other, opts.replace) {
        return Err(MirrorError::OtherPackage {
            dir: dir.to_owned(),
            found: found.clone(),
            knot: id.to_string(),
        });
    }
    let this_package = other.is_none();
    let staging = dir.join(STAGING);
    std::fs::create_dir_all(&staging).map_err(io(&staging))?;
    let rt = Runtime::new("gkq_mirror::mirror", "an async caller")?;
    let store = Store::new(store_config)?;
    let progress: &dyn Progress = progress.as_ref().map_or(&NoProgress, |p| &*p.0);
    progress.start(wanted.iter().map(|w| w.len).sum());
    let objects = rt.block_on("gkq_mirror::mirror", "an async caller", async {
        let mut objects = Vec::new();
        for w in &wanted {
            let places = (base.as_str(), dir, staging.as_path());
            objects.push(stage(&store, places, w, this_package, progress).await?);
        }
        if let Some(s) = stage_signature(&store, &base, &staging, id).await? {
            objects.push(s);
        }
        Ok::<_, MirrorError>(objects)
    })??;
    check(dir, &staging, id, &wanted)?;
    let replaced = other.map(|(_, files)| files).unwrap_or_default();
    publish(dir, &staging, &objects, &replaced)?;
    Ok(MirrorReport {
        knot_id: id.to_string(),
        trusted: reader.knot().trusted().clone(),
        fetched_bytes: store.stats().payload_bytes,
        objects,
        replaced,
    })
}

/// The staged copy, checked as the release gate checks a package, and its
/// knot the one opened; on a failure the staged objects without a digest
/// of their own (the knot, proof, runs and warm objects) are removed, so
/// that the next run fetches them again.
fn check(dir: &Path, staging: &Path, id: KnotId, wanted: &[Wanted]) -> Result<()> {
    let knot_path = staging.join(KNOT_NAME);
    let mut failures = match gkq_verify::verify(&gkq_verify::VerifyOptions::new(&knot_path)) {
        Ok(report) => report.failure_lines(),
        Err(e) => vec![e.to_string()],
    };
    if gkq_sign::knot_id_of(staging).ok() != Some(id) {
        failures.push(format!("{KNOT_NAME}: not knot {id}"));
    }
    if failures.is_empty() {
        return Ok(());
    }
    for w in wanted.iter().filter(|w| w.sha256.is_none()) {
        let _ = std::fs::remove_file(staging.join(&w.name));
    }
    Err(MirrorError::Verify {
        dir: dir.to_owned(),
        failures,
    })
}

/// Moves the verified staged objects into `dir` (the knot and its
/// signature last), after removing the files of another package
/// (`replaced`: its knot first); then removes the staging directory.
fn publish(
    dir: &Path,
    staging: &Path,
    objects: &[MirroredObject],
    replaced: &[String],
) -> Result<()> {
    let knot = dir.join(KNOT_NAME);
    if !replaced.is_empty() || knot.exists() {
        // a directory without model.knot is visibly unfinished
        match std::fs::remove_file(&knot) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&knot)(e)),
        }
    }
    if !objects.iter().any(|o| o.name == SIGNATURE_NAME) {
        // not this package's: it has none
        let sig = dir.join(SIGNATURE_NAME);
        if std::fs::symlink_metadata(&sig).is_ok() {
            std::fs::remove_file(&sig).map_err(io(&sig))?;
        }
    }
    for name in replaced {
        let p = dir.join(name);
        let gone = match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p),
            Ok(_) => std::fs::remove_file(&p),
            Err(_) => Ok(()),
        };
        gone.map_err(io(&p))?;
    }
    let last = |n: &str| n == KNOT_NAME || n == SIGNATURE_NAME;
    let order = objects
        .iter()
        .filter(|o| !last(&o.name))
        .chain(objects.iter().filter(|o| o.name == KNOT_NAME))
        .chain(objects.iter().filter(|o| o.name == SIGNATURE_NAME));
    for o in order {
        let to = dir.join(&o.name);
        std::fs::rename(staging.join(&o.name), &to).map_err(io(&to))?;
    }
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    std::fs::remove_dir_all(staging).map_err(io(staging))?;
    Ok(())
}
