//! The companion files (`package.files`: config, tokenizer): found in the
//! model directory, hashed for the header, and copied into the package,
//! checked again on the way.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{IoContext, PackError, Result};
use crate::options::COMPANION_FILES;
use crate::output::{Output, flush_file, write_all};
use crate::report::CompanionReport;

/// Bytes read per step.
const CHUNK: usize = 8 << 20;

/// A companion file of the model directory, or one made from the source
/// (a GGUF's `metadata.gguf` and derived `config.json`).
pub(crate) struct Companion {
    pub(crate) name: String,
    /// Where it is read from (unused for a made one).
    pub(crate) path: PathBuf,
    bytes: u64,
    pub(crate) sha256: String,
    made: Option<Vec<u8>>,
}

impl Companion {
    /// A companion made by the packer: `name` with `bytes`.
    pub(crate) fn made(name: &str, bytes: Vec<u8>) -> Companion {
        Companion {
            name: name.to_owned(),
            path: PathBuf::from(name),
            bytes: bytes.len() as u64,
            sha256: gkq_format::hex(&Sha256::digest(&bytes)),
            made: Some(bytes),
        }
    }
}

/// The companions of a GGUF source: its metadata as `metadata.gguf`, and
/// the `config.json` derived from it (replacing one found in the
/// directory) for the architectures gkq-decode runs; `package.files` in
/// name order.
pub(crate) fn gguf_companions(
    src: &gkq_source::SourceModel,
    roles: &crate::roles::RolePlan,
    found: &mut Vec<Companion>,
) -> Result<()> {
    let Some(g) = &src.gguf else {
        return Ok(());
    };
    found.push(Companion::made("metadata.gguf", g.metadata_file()));
    let embed = src
        .tensor(&roles.embed)
        .map(|t| t.shape.clone())
        .unwrap_or_default();
    if let Some(cfg) = g.derived_config(&embed, roles.tied)? {
        found.retain(|c| c.name != "config.json");
        let text = serde_json::to_string_pretty(&cfg).expect("a JSON value") + "\n";
        found.push(Companion::made("config.json", text.into_bytes()));
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(())
}

/// The companion files present in `dir`, hashed: each a regular file (a
/// snapshot's files are links into `blobs/`, followed); one that is there
/// but is not (a FIFO, a device, a directory, a link to nothing) is
/// refused by name, never left out in silence.
pub(crate) fn find_companions(dir: &Path) -> Result<Vec<Companion>> {
    let mut out = Vec::new();
    for name in COMPANION_FILES {
        let path = dir.join(name);
        if std::fs::symlink_metadata(&path).is_err() {
            continue; // absent
        }
        let (bytes, sha256) = hash_file(&path)?;
        out.push(Companion {
            name: (*name).to_owned(),
            path,
            bytes,
            sha256,
            made: None,
        });
    }
    Ok(out)
}

/// Copies a companion file into the package, checking that it did not
/// change since it was hashed for the header.
pub(crate) fn copy_companion(out: &mut Output, c: &Companion) -> Result<(File, PathBuf)> {
    let (path, mut w) = out.create(&c.name)?;
    if let Some(bytes) = &c.made {
        write_all(&mut w, bytes, &path)?;
        return Ok((flush_file(w, &path)?, path));
    }
    let mut src = File::open(&c.path).at(&c.path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = src.read(&mut buf).at(&c.path)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        write_all(&mut w, &buf[..n], &path)?;
    }
    let digest = gkq_format::hex(&h.finalize());
    if digest != c.sha256 {
        return Err(PackError::Changed {
            path: c.path.clone(),
        });
    }
    Ok((flush_file(w, &path)?, path))
}

/// The length and SHA-256 of the regular file at `path` (a link to one
/// followed; anything else refused without blocking).
pub(crate) fn hash_file(path: &Path) -> Result<(u64, String)> {
    let (mut f, _) = gkq_files::open_regular(path, gkq_files::Follow::Yes)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf).at(path)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        total += n as u64;
    }
    Ok((total, gkq_format::hex(&h.finalize())))
}

/// The companion files' lines of the report.
pub(crate) fn companion_reports(companions: &[Companion], out_dir: &Path) -> Vec<CompanionReport> {
    companions
        .iter()
        .map(|c| CompanionReport {
            name: c.name.clone(),
            path: out_dir.join(&c.name),
            bytes: c.bytes,
            sha256: c.sha256.clone(),
        })
        .collect()
}
