//! Priority resolution, per tensor, as the columnar-embed design proposal
//! ("Compatibility with GKQ v2"; not in this repository) lays it down:
//! 1. a columnar URL is configured, the block has the columnar bit, and a
//!    HEAD of the URL reports Content-Length = rows × row_bytes ⇒ columnar;
//! 2. else the dense block of the knot;
//! 3. spectral blocks are returned untouched.
//!
//! The result says which path was chosen and why the others were not.

use gkq_format::{ColumnarDescriptor, Encoding};
use serde::Serialize;

use crate::error::Result;
use crate::knot::KnotHandle;
use gkq_store::Store as Http;

/// The chosen read path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadPath {
    /// Rows from the row file over HTTP ranges.
    Columnar,
    /// The dense block of the knot.
    Dense,
    /// Spectral factors, untouched.
    Spectral,
}

/// A resolution decision and its reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Resolution {
    /// The tensor (block name).
    pub tensor: String,
    /// The chosen path.
    pub path: ReadPath,
    /// Why this path, and why not the ones before it.
    pub reason: String,
    /// For the columnar path: the row file URL and descriptor.
    #[serde(skip)]
    pub columnar: Option<(String, ColumnarDescriptor)>,
}

fn dense(tensor: &str, reason: String) -> Resolution {
    Resolution {
        tensor: tensor.to_owned(),
        path: ReadPath::Dense,
        reason,
        columnar: None,
    }
}

/// Picks the descriptor a URL names: its last path segment is the object
/// name; otherwise, unless it looks like a row file name (`*.rows`, then a
/// typo is reported rather than guessed), it is the package's base URL,
/// with or without the trailing `/`, and the block's first row file is used.
fn pick<'d>(
    url: &str,
    descs: &'d [ColumnarDescriptor],
) -> Option<(String, &'d ColumnarDescriptor)> {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let last = path.rsplit('/').next().unwrap_or("");
    if let Some(d) = descs.iter().find(|d| d.object == last) {
        return Some((url.to_owned(), d));
    }
    if last.ends_with(".rows") {
        return None;
    }
    let base = path.trim_end_matches('/');
    descs.first().map(|d| (format!("{base}/{}", d.object), d))
}

/// Resolves block `name` of `knot`.
pub fn resolve(
    knot: &KnotHandle,
    name: &str,
    columnar_url: Option<&str>,
    http: &Http,
) -> Result<Resolution> {
    let index = knot.index(name)?;
    let block = knot.data_block(index)?;
    if let Encoding::Spectral { rank, .. } = block.encoding {
        return Ok(Resolution {
            tensor: name.to_owned(),
            path: ReadPath::Spectral,
            reason: format!(
                "spectral block of rank {rank}: never columnar; block_payload returns the factors untouched, and rows are reconstructed as U·diag(S)·Vt (FORMAT.md section 5)"
            ),
            columnar: None,
        });
    }
    let Some(url) = columnar_url else {
        return Ok(dense(
            name,
            "no columnar URL configured (--columnar-embed)".into(),
        ));
    };
    if !block.is_columnar_eligible() || block.columnar.is_empty() {
        return Ok(dense(
            name,
            format!(
                "block {:?} does not have the COLUMNAR_ELIGIBLE flag",
                block.name
            ),
        ));
    }
    let Some((url, desc)) = pick(url, &block.columnar) else {
        let names: Vec<&str> = block.columnar.iter().map(|d| d.object.as_str()).collect();
        return Ok(dense(
            name,
            format!(
                "{url} names none of the row files of {:?} ({})",
                block.name,
                names.join(", ")
            ),
        ));
    };
    match http.content_length(&url) {
        Err(e) => Ok(dense(name, format!("HEAD {url} failed: {e}"))),
        Ok(len) if len != desc.byte_len => Ok(dense(
            name,
            format!(
                "{url}: Content-Length {len} ≠ expected {} ({} rows × {} bytes)",
                desc.byte_len, desc.rows, desc.row_bytes
            ),
        )),
        Ok(len) => Ok(Resolution {
            tensor: name.to_owned(),
            path: ReadPath::Columnar,
            reason: format!(
                "{url}: COLUMNAR_ELIGIBLE and Content-Length {len} = {} rows × {} bytes",
                desc.rows, desc.row_bytes
            ),
            columnar: Some((url, desc.clone())),
        }),
    }
}
