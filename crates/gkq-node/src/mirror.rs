//! `gkq-mirror URL DIR`: a verified copy of a published package in a
//! directory that any HTTP server can serve (a regional mirror, an
//! air-gapped site).
//!
//! The knot is opened as a node opens it (its trust policy: `--trust-key`,
//! `--knot-id`); every object it names is then fetched in parallel parts
//! and written under a temporary name, renamed only once its digest is the
//! one the knot records (row files, companions; the knot itself against
//! its id and every payload digest). Row files first, the knot and its
//! signature last, so that a directory without `model.knot` is visibly
//! unfinished; a file already there with the right digest is kept, so an
//! interrupted mirror resumes where it stopped. The finished copy passes
//! gkq-verify's local checks (proof, runs and warm objects rebuilt from the rows)
//! before the command succeeds.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use gkq_format::sig::{self, SIGNATURE_NAME};
use gkq_format::{KNOT_NAME, hex};
use gkq_reader::{Reader, ReaderConfig, Serve, Trusted};
use gkq_store::blocking::Runtime;
use gkq_store::{RangeRead, ReadCheck, Store, StoreError};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::NodeError;

/// Bytes fetched per step of an object (each step in parallel parts).
const STEP: u64 = 64 << 20;

/// One object of the package.
#[derive(Clone, Debug, Serialize)]
pub struct MirroredObject {
    /// Its name in the package.
    pub name: String,
    /// Its length.
    pub bytes: u64,
    /// `fetched`, or `kept` (already in DIR with the right digest).
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
}

/// An object to copy: its name, length (0: its HEAD's) and the digest
/// the knot records (`None`: checked by the final verification).
struct Wanted {
    name: String,
    len: u64,
    sha256: Option<[u8; 32]>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> NodeError + '_ {
    move |error| NodeError::Io {
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

/// Fetches `url` (of `len` bytes, or its HEAD's length when 0) into
/// `path`, whole or not at all; with its SHA-256 and length.
async fn fetch(
    store: &Store,
    url: &str,
    len: u64,
    path: &Path,
) -> Result<([u8; 32], u64), NodeError> {
    let len = if len == 0 {
        store.head(url).await?.len
    } else {
        len
    };
    let tmp = path.with_file_name(format!(
        ".{}.part",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    ));
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    let mut h = Sha256::new();
    let mut at = 0;
    while at < len {
        let n = STEP.min(len - at);
        let bytes = store
            .read_checked(url, (at, n), Some(len), ReadCheck::None)
            .await?;
        h.update(&bytes);
        f.write_all(&bytes).map_err(io(&tmp))?;
        at += n;
    }
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io(path))?;
    Ok((h.finalize().into(), len))
}

/// Copies one object unless DIR already holds it with its digest.
async fn copy(
    store: &Store,
    (base, id): (&str, gkq_format::KnotId),
    dir: &Path,
    w: &Wanted,
) -> Result<MirroredObject, NodeError> {
    let path = dir.join(&w.name);
    let url = gkq_store::url::sibling(base, &w.name);
    let have = std::fs::metadata(&path).map(|m| m.len()).ok();
    let kept = match (w.sha256, have) {
        (Some(want), Some(len)) => {
            (w.len == 0 || len == w.len) && gkq_sign::sha_file(&path).ok() == Some(want)
        }
        // a proof, runs or warm object, or the knot, of the right length: the
        // final verification rebuilds it from the rows (and deletes a
        // knot that fails, so that the next run fetches it again)
        (None, Some(len)) => {
            len == w.len && (w.name != KNOT_NAME || gkq_sign::knot_id_of(dir).ok() == Some(id))
        }
        (_, None) => false,
    };
    if kept {
        return Ok(MirroredObject {
            name: w.name.clone(),
            bytes: have.unwrap_or(0),
            status: "kept",
        });
    }
    let (digest, len) = fetch(store, &url, w.len, &path).await?;
    if let Some(want) = w.sha256
        && digest != want
    {
        let _ = std::fs::remove_file(&path);
        return Err(NodeError::Object {
            url,
            reason: format!(
                "sha256 {}, but the knot records {}",
                hex(&digest),
                hex(&want)
            ),
        });
    }
    Ok(MirroredObject {
        name: w.name.clone(),
        bytes: len,
        status: "fetched",
    })
}

/// The package's signature object into DIR, when it has one; refused when
/// it does not name this knot.
async fn copy_signature(
    store: &Store,
    base: &str,
    dir: &Path,
    id: gkq_format::KnotId,
) -> Result<Option<MirroredObject>, NodeError> {
    let url = gkq_store::url::sibling(base, SIGNATURE_NAME);
    let bytes = match store.read_prefix(&url, sig::MAX_SIGNATURE_LEN).await {
        Ok((b, _)) => b,
        Err(StoreError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if sig::claimed_knot(&bytes)? != Some(id) {
        return Err(NodeError::Object {
            url,
            reason: format!("a signature object that does not name knot {id}"),
        });
    }
    let path = dir.join(SIGNATURE_NAME);
    std::fs::write(&path, &bytes).map_err(io(&path))?;
    Ok(Some(MirroredObject {
        name: SIGNATURE_NAME.to_owned(),
        bytes: bytes.len() as u64,
        status: "fetched",
    }))
}

/// Mirrors the package of the knot at `url` into `dir` (see the module
/// docs).
pub fn mirror(url: &str, dir: &Path, config: ReaderConfig) -> Result<MirrorReport, NodeError> {
    let store_config = config.store.clone();
    let reader = Reader::open(url, config, Serve::NONE)?;
    let base = reader.knot().location().to_owned();
    let id = reader.knot().id();
    let wanted = wanted(&reader);
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let rt = Runtime::new("gkq_node::mirror::mirror", "an async caller")?;
    let store = Store::new(store_config)?;
    let objects = rt.block_on("gkq_node::mirror::mirror", "an async caller", async {
        let mut objects = Vec::new();
        for w in &wanted {
            objects.push(copy(&store, (base.as_str(), id), dir, w).await?);
        }
        if let Some(s) = copy_signature(&store, &base, dir, id).await? {
            objects.push(s);
        }
        Ok::<_, NodeError>(objects)
    })??;
    check(dir, id)?;
    Ok(MirrorReport {
        knot_id: id.to_string(),
        trusted: reader.knot().trusted().clone(),
        fetched_bytes: store.stats().payload_bytes,
        objects,
    })
}

/// The copy, checked as the release gate checks a package, and its knot
/// the one opened.
fn check(dir: &Path, id: gkq_format::KnotId) -> Result<(), NodeError> {
    let knot_path: PathBuf = dir.join(KNOT_NAME);
    let report = gkq_verify::verify(&gkq_verify::VerifyOptions::new(&knot_path)).map_err(|e| {
        NodeError::Verify {
            dir: dir.to_owned(),
            failures: vec![e.to_string()],
        }
    })?;
    let copied = gkq_sign::knot_id_of(dir).ok();
    let mut failures = report.failure_lines();
    if copied != Some(id) {
        failures.push(format!("{KNOT_NAME}: not knot {id}"));
    }
    if failures.is_empty() {
        return Ok(());
    }
    let _ = std::fs::remove_file(&knot_path);
    Err(NodeError::Verify {
        dir: dir.to_owned(),
        failures,
    })
}
