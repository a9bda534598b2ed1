//! Priority resolution, per tensor, as the columnar-embed design proposal
//! ("Compatibility with GKQ v2"; not in this repository) lays it down:
//! 1. a columnar URL is configured, the block has the columnar bit, and a
//!    HEAD of the URL reports Content-Length = rows × row_bytes ⇒ columnar;
//! 2. else the dense block of the knot;
//! 3. spectral blocks are returned untouched.
//!
//! The result says which path was chosen and why the others were not.

use gkq_format::{Block, ColumnarDescriptor, DType, Encoding};
use serde::Serialize;

use gkq_store::{RangeRead, Store};

use crate::error::Result;
use crate::knot::KnotHandle;

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
    /// For the columnar path: the runs object the rows are fetched from,
    /// each run with its records in one range (FORMAT.md 7b), when the
    /// package has one.
    #[serde(skip)]
    pub runs: Option<String>,
}

/// The URL of the runs object of the row file at `url` (FORMAT.md 7b).
pub(crate) fn runs_url(url: &str) -> String {
    gkq_store::url::with_suffix(url, gkq_format::runs::RUNS_SUFFIX)
}

fn dense(tensor: &str, reason: String) -> Resolution {
    Resolution {
        tensor: tensor.to_owned(),
        runs: None,
        path: ReadPath::Dense,
        reason,
        columnar: None,
    }
}

/// Picks the descriptor a URL names: its last path segment is the object
/// name; otherwise, unless it looks like a row file name (`*.rows`, then a
/// typo is reported rather than guessed), it is the package's base URL,
/// with or without the trailing `/`, and the row file is `dtype` if given,
/// else the narrowest `BLOCK_EXACT` one (FORMAT.md 3.4). Returns the URL,
/// the descriptor and why it was chosen.
fn pick<'d>(
    url: &str,
    block: &'d Block,
    dtype: Option<DType>,
) -> std::result::Result<(String, &'d ColumnarDescriptor, String), String> {
    let descs = &block.columnar;
    let path = gkq_store::url::without_query(url);
    let last = path.rsplit('/').next().unwrap_or("");
    let names = || {
        descs
            .iter()
            .map(|d| d.object.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(d) = descs.iter().find(|d| d.object == last) {
        return Ok((url.to_owned(), d, format!("{} named by the URL", d.object)));
    }
    if last.ends_with(".rows") {
        return Err(format!(
            "{url} names none of the row files of {:?} ({})",
            block.name,
            names()
        ));
    }
    let base = path.trim_end_matches('/');
    let (d, why) = if let Some(want) = dtype {
        let d = descs.iter().find(|d| d.dtype == want).ok_or_else(|| {
            format!(
                "--embed-dtype {want}: block {:?} has no {want} row file ({})",
                block.name,
                names()
            )
        })?;
        let exact = if d.is_block_exact() {
            format!("its values widen to the {} block exactly", block.dtype)
        } else {
            format!(
                "NOT exact: its values differ from the {} block's (no BLOCK_EXACT)",
                block.dtype
            )
        };
        (d, format!("{} forced by --embed-dtype; {exact}", d.object))
    } else {
        let widest = descs.iter().map(|d| d.row_bytes).max().unwrap_or(0);
        let d = descs
            .iter()
            .filter(|d| d.is_block_exact())
            .min_by_key(|d| d.row_bytes)
            .ok_or_else(|| format!("block {:?} has no BLOCK_EXACT row file", block.name))?;
        let of_source = if d.is_source_exact() {
            " and to the source's"
        } else {
            ""
        };
        let why = if d.row_bytes < widest {
            format!(
                "{} rows are exact for this {} block{of_source}: {} B/row instead of {widest}",
                d.dtype, block.dtype, d.row_bytes
            )
        } else {
            format!(
                "{} rows are the narrowest exact row file of the {} block ({} B/row)",
                d.dtype, block.dtype, d.row_bytes
            )
        };
        (d, why)
    };
    Ok((format!("{base}/{}", d.object), d, why))
}

/// The runs object of the row file at `url` by HEAD: the resolution's
/// reason when its length is right, else why it cannot be used.
async fn runs_head(
    store: &Store,
    url: &str,
    desc: &ColumnarDescriptor,
    layout: gkq_format::runs::RunsLayout,
) -> std::result::Result<String, String> {
    let at = runs_url(url);
    let want = layout.object_len().unwrap_or(0);
    match store.head(&at).await.map(|h| h.len) {
        Ok(len) if len == want => Ok(format!(
            "fetched from its runs object {at} (Content-Length {len} = {} rows × {} bytes of row and record): one range per run of rows, every row verified against the knot's Merkle root",
            desc.rows,
            layout.stride()
        )),
        Ok(len) => Err(format!(
            "; its runs object {at} has Content-Length {len} ≠ {want}, so rows and their records come from two objects"
        )),
        Err(e) => Err(format!(
            "; no runs object ({e}), so rows and their records come from two objects"
        )),
    }
}

/// Resolves block `name` of `knot`.
pub(crate) async fn resolve(
    knot: &KnotHandle,
    name: &str,
    columnar_url: Option<&str>,
    embed_dtype: Option<DType>,
    store: &Store,
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
            runs: None,
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
    let (url, desc, why) = match pick(url, block, embed_dtype) {
        Ok(p) => p,
        Err(reason) => return Ok(dense(name, reason)),
    };
    if desc.proof.is_none() {
        return Ok(dense(
            name,
            format!(
                "{url}: the knot (format version 2) has no row proofs, so rows fetched by range cannot be verified (FORMAT.md 9a); repack with this gkq-pack"
            ),
        ));
    }
    columnar_path(knot, store, name, (&url, desc, &why)).await
}

/// The columnar path for row file `desc` at `url`, by HEAD of its runs
/// object (when the knot lists one) or of the row file, or the pinned
/// header's word; the dense block when the length is wrong.
async fn columnar_path(
    knot: &KnotHandle,
    store: &Store,
    name: &str,
    (url, desc, why): (&str, &ColumnarDescriptor, &str),
) -> Result<Resolution> {
    let url = url.to_owned();
    let runs = knot
        .header()
        .header()
        .has_runs(&desc.object)
        .then(|| gkq_format::runs::RunsLayout::of(desc))
        .flatten();
    let columnar = |reason: String, runs: Option<String>| Resolution {
        tensor: name.to_owned(),
        path: ReadPath::Columnar,
        reason,
        columnar: Some((url.clone(), desc.clone())),
        runs,
    };
    if knot.header_from_cache() {
        // a pinned knot opened from the disk cache: no request is made at
        // open, and every row is verified against the pinned root anyway
        let how = if runs.is_some() {
            "; each run of rows with its records in one range"
        } else {
            ""
        };
        return Ok(columnar(
            format!(
                "{url}: {why}; the knot is pinned (--knot-id) and its header came from the cache, so the row file's length is not asked for; every row verified against the knot's Merkle root{how}"
            ),
            runs.map(|_| runs_url(&url)),
        ));
    }
    let no_runs = match runs {
        Some(layout) => match runs_head(store, &url, desc, layout).await {
            Ok(how) => {
                return Ok(columnar(
                    format!("{url}: {why}; {how}"),
                    Some(runs_url(&url)),
                ));
            }
            Err(why) => why,
        },
        None => String::new(),
    };
    match store.head(&url).await.map(|h| h.len) {
        Err(e) => Ok(dense(name, format!("HEAD {url} failed: {e}"))),
        Ok(len) if len != desc.byte_len => Ok(dense(
            name,
            format!(
                "{url}: Content-Length {len} ≠ expected {} ({} rows × {} bytes)",
                desc.byte_len, desc.rows, desc.row_bytes
            ),
        )),
        Ok(len) => Ok(columnar(
            format!(
                "{url}: {why}; Content-Length {len} = {} rows × {} bytes; every row verified against the knot's Merkle root{no_runs}",
                desc.rows, desc.row_bytes
            ),
            None,
        )),
    }
}
