//! Resolution, typed, for both roles (`resolve_role`), as the
//! columnar-embed design proposal ("Compatibility with GKQ v2"; not in this
//! repository) lays it down:
//! 1. a columnar URL is configured, the block has the columnar bit, and a
//!    HEAD of the URL reports Content-Length = rows × row_bytes ⇒ columnar;
//! 2. else the dense block of the knot;
//! 3. spectral blocks are returned untouched.
//!
//! The lm_head (read whole, kept resident) takes the narrowest exact row
//! file with fewer bytes per row than the block, next to the columnar base
//! URL or the knot; the embedding (read row by row) the narrowest exact
//! one. A [`ReadPath`] carries its cause; the reason a user reads is
//! rendered from it ([`Resolution::reason`]).

use gkq_format::{Block, ColumnarDescriptor, DType, Encoding, merkle};
use serde::Serialize;

use gkq_store::RangeRead;

use crate::error::Result;
use crate::knot::{KnotHandle, sibling};

/// How a role reads its tensor, and why: the path with its cause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadPath {
    /// Rows from a row file, each verified against the knot's Merkle root.
    Columnar(ColumnarPath),
    /// The dense block of the knot.
    Dense(DenseCause),
    /// A spectral block: factors untouched, values reconstructed.
    Spectral {
        /// Its rank.
        rank: u32,
    },
}

/// The kind of a [`ReadPath`], without its cause (`columnar` in JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PathKind {
    /// [`ReadPath::Columnar`].
    Columnar,
    /// [`ReadPath::Dense`].
    Dense,
    /// [`ReadPath::Spectral`].
    Spectral,
}

/// The columnar path: which row file, why that one, and how it was checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnarPath {
    /// The row file's URL (or path).
    pub url: String,
    /// Its descriptor.
    pub desc: ColumnarDescriptor,
    /// Why this row file.
    pub choice: Choice,
    /// How its presence was checked at open.
    pub checked: Checked,
}

impl ColumnarPath {
    /// The runs object rows are fetched from (FORMAT.md 7b), if any.
    pub fn runs(&self) -> Option<&str> {
        match &self.checked {
            Checked::Runs { url, .. } | Checked::Pinned { runs: Some(url) } => Some(url),
            _ => None,
        }
    }
}

/// Why a row file was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The URL names it.
    NamedByUrl,
    /// A flag forced its dtype (`--embed-dtype`, `--lm-head-dtype`).
    Forced {
        /// The flag.
        flag: &'static str,
        /// The block's dtype.
        block_dtype: DType,
    },
    /// The narrowest `BLOCK_EXACT` row file (rows looked up one by one).
    Narrowest {
        /// The block's dtype.
        block_dtype: DType,
        /// Bytes per row of the widest row file.
        widest: u64,
    },
    /// The narrowest `BLOCK_EXACT` row file with fewer bytes per row than
    /// the block (a resident lm_head, widened on the node).
    Narrower {
        /// The block's dtype.
        block_dtype: DType,
        /// Bytes per row of the block.
        block_row: u64,
    },
}

/// How a row file was found usable at open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    /// Its runs object answered a HEAD with the right length.
    Runs {
        /// The runs object.
        url: String,
        /// Its Content-Length.
        len: u64,
        /// Bytes of a row and its record.
        stride: u64,
    },
    /// The row file answered a HEAD with the right length.
    RowFile {
        /// Its Content-Length.
        len: u64,
        /// Why its runs object (listed in the knot) is not used, if it has one.
        runs: Option<NoRuns>,
    },
    /// The knot is pinned and its header came from the cache: no request
    /// at open; the runs object, when the knot lists one.
    Pinned {
        /// The runs object.
        runs: Option<String>,
    },
    /// Pulled whole in parallel parts, each chunk of this many rows checked
    /// against the chunk table (a resident lm_head).
    Chunks {
        /// Rows per chunk.
        chunk_rows: u64,
    },
}

/// Why a listed runs object is not used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoRuns {
    /// Its Content-Length is not rows × stride.
    Length {
        /// The runs object.
        url: String,
        /// Its length.
        len: u64,
        /// rows × stride.
        want: u64,
    },
    /// Its HEAD failed.
    Head {
        /// The error, in words.
        error: String,
    },
}

/// Why the dense block is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DenseCause {
    /// The dense block was asked for (`--dense`, [`crate::ReaderConfig::dense`]).
    Asked,
    /// The block has no `COLUMNAR_ELIGIBLE` flag (or no row file).
    NotEligible {
        /// The block.
        block: String,
    },
    /// The URL ends in a row file name the block does not have.
    UnknownRowFile {
        /// The URL.
        url: String,
        /// The block.
        block: String,
        /// Its row files.
        names: String,
    },
    /// A forced dtype the block has no row file of.
    NoSuchDtype {
        /// The flag.
        flag: &'static str,
        /// The dtype asked for.
        dtype: DType,
        /// The block.
        block: String,
        /// Its row files.
        names: String,
    },
    /// No row file is `BLOCK_EXACT`.
    NoExact {
        /// The block.
        block: String,
    },
    /// A version 2 descriptor: no row proof.
    NoProof {
        /// The row file.
        url: String,
    },
    /// The HEAD of the row file failed.
    Head {
        /// The row file.
        url: String,
        /// The error, in words.
        error: String,
        /// Whether it ran out of time (a stall, no answer).
        timeout: bool,
    },
    /// The row file's Content-Length is not rows × row_bytes.
    Length {
        /// The row file.
        url: String,
        /// Its length.
        len: u64,
        /// rows × row_bytes.
        expected: u64,
        /// Rows of the descriptor.
        rows: u64,
        /// Bytes per row.
        row_bytes: u64,
    },
    /// No exact row file narrower than the block: the block is pulled (a
    /// resident lm_head).
    Block {
        /// The block.
        block: String,
        /// Its dtype (a block type stays quantized on the node).
        dtype: DType,
        /// Bytes per row of the block.
        block_row: u64,
    },
    /// The columnar path failed at use, in a way the dense block avoids.
    FellBack {
        /// The failure, its causes on one line.
        error: String,
    },
}

/// What a role is resolved for: rows looked up one by one, or a matrix
/// pulled whole and kept resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// The embedding, or any tensor asked about.
    Rows,
    /// The lm_head.
    Resident,
}

/// A resolution decision: the tensor, its path and the path's cause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// The tensor (block name).
    pub tensor: String,
    /// The chosen path, with its cause.
    pub path: ReadPath,
    pub(crate) used: Use,
}

impl Serialize for Resolution {
    /// `{"tensor", "path": "columnar" | "dense" | "spectral", "reason"}`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Resolution", 3)?;
        st.serialize_field("tensor", &self.tensor)?;
        st.serialize_field("path", &self.kind())?;
        st.serialize_field("reason", &self.reason())?;
        st.end()
    }
}

impl Resolution {
    pub(crate) fn new(tensor: &str, used: Use, path: ReadPath) -> Resolution {
        Resolution {
            tensor: tensor.to_owned(),
            path,
            used,
        }
    }

    /// The kind of the path.
    pub fn kind(&self) -> PathKind {
        match self.path {
            ReadPath::Columnar(_) => PathKind::Columnar,
            ReadPath::Dense(_) => PathKind::Dense,
            ReadPath::Spectral { .. } => PathKind::Spectral,
        }
    }

    /// The columnar path, when that is the path.
    pub fn columnar(&self) -> Option<&ColumnarPath> {
        match &self.path {
            ReadPath::Columnar(c) => Some(c),
            _ => None,
        }
    }

    /// Whether a row file was meant but the dense block is read (one
    /// that is missing, of the wrong length, unreachable, without a
    /// proof, or that failed at use): worth a warning, since the dense
    /// path pulls the whole matrix. Not when `--dense` asked for it or the
    /// block has no row files.
    pub fn rows_unused(&self) -> bool {
        matches!(&self.path, ReadPath::Dense(c) if !matches!(c, DenseCause::Asked | DenseCause::NotEligible { .. }))
    }

    /// The same tensor read dense, after `error` at use.
    pub(crate) fn fell_back(&self, error: &(dyn std::error::Error + 'static)) -> Resolution {
        let error = gkq_format::error_chain(error);
        Resolution {
            path: ReadPath::Dense(DenseCause::FellBack { error }),
            ..self.clone()
        }
    }
}

/// What the configuration asks of a resolution.
pub(crate) struct Want<'a> {
    /// The columnar URL (a row file, or the package's base URL).
    pub(crate) url: Option<&'a str>,
    /// A forced row file dtype, and its flag.
    pub(crate) dtype: Option<(DType, &'static str)>,
    /// The dense block asked for.
    pub(crate) dense: bool,
}

/// Resolves block `index` of `knot` for `used` (the embedding's rows, the
/// lm_head's resident matrix, or any tensor asked about).
pub(crate) async fn resolve_role(
    knot: &KnotHandle,
    index: usize,
    used: Use,
    want: Want<'_>,
    store: &dyn RangeRead,
) -> Result<Resolution> {
    let block = knot.data_block(index)?;
    let tensor = knot
        .header()
        .header()
        .blocks
        .get(index)
        .map_or_else(|| block.name.clone(), |b| b.name.clone());
    let done = |path| Ok(Resolution::new(&tensor, used, path));
    if let Encoding::Spectral { rank, .. } = block.encoding {
        return done(ReadPath::Spectral { rank });
    }
    let picked = match used {
        _ if want.dense => Err(DenseCause::Asked),
        Use::Rows => pick_rows(knot, block, want.url, want.dtype),
        Use::Resident => pick_resident(knot, block, want.url, want.dtype),
    };
    let (url, desc, choice) = match picked {
        Ok(p) => p,
        Err(cause) => return done(ReadPath::Dense(cause)),
    };
    if desc.proof.is_none() {
        return done(ReadPath::Dense(DenseCause::NoProof { url }));
    }
    let path = match used {
        Use::Rows => checked(knot, store, url, desc, choice).await,
        Use::Resident => {
            let chunk_rows = merkle::layout_of(desc).map_or(0, |l| l.chunk_rows());
            ReadPath::Columnar(ColumnarPath {
                url,
                desc: desc.clone(),
                choice,
                checked: Checked::Chunks { chunk_rows },
            })
        }
    };
    done(path)
}

fn names(block: &Block) -> String {
    block
        .columnar
        .iter()
        .map(|d| d.object.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The row file of `block` a URL names for row lookups: its last path
/// segment is the object name; otherwise, unless it looks like a row file
/// name (`*.rows`, then a typo is reported rather than guessed), it is the
/// package's base URL, with or without the trailing `/`, and the row file
/// is `dtype`'s if given, else the narrowest `BLOCK_EXACT` one (FORMAT.md 3.4);
/// without a URL, that row file next to the knot (a package is a directory).
fn pick_rows<'d>(
    knot: &KnotHandle,
    block: &'d Block,
    url: Option<&str>,
    dtype: Option<(DType, &'static str)>,
) -> std::result::Result<(String, &'d ColumnarDescriptor, Choice), DenseCause> {
    if !block.is_columnar_eligible() || block.columnar.is_empty() {
        return Err(DenseCause::NotEligible {
            block: block.name.clone(),
        });
    }
    let descs = &block.columnar;
    if let Some(url) = url {
        let path = gkq_store::url::without_query(url);
        let last = path.rsplit('/').next().unwrap_or("");
        if let Some(d) = descs.iter().find(|d| d.object == last) {
            return Ok((url.to_owned(), d, Choice::NamedByUrl));
        }
        if last.ends_with(".rows") {
            return Err(DenseCause::UnknownRowFile {
                url: url.to_owned(),
                block: block.name.clone(),
                names: names(block),
            });
        }
    }
    let (d, choice) = match dtype {
        Some((want, flag)) => forced(block, want, flag)?,
        None => {
            let widest = descs.iter().map(|d| d.row_bytes).max().unwrap_or(0);
            let d = descs
                .iter()
                .filter(|d| d.is_block_exact())
                .min_by_key(|d| d.row_bytes)
                .ok_or_else(|| DenseCause::NoExact {
                    block: block.name.clone(),
                })?;
            (
                d,
                Choice::Narrowest {
                    block_dtype: block.dtype,
                    widest,
                },
            )
        }
    };
    // a package is a directory: the row file next to the knot by default
    let at = url.map_or_else(
        || knot.sibling(&d.object),
        |u| gkq_store::url::join(gkq_store::url::without_query(u), &d.object),
    );
    Ok((at, d, choice))
}

/// The row file of dtype `want` that `flag` forces, and the choice.
fn forced<'d>(
    block: &'d Block,
    want: DType,
    flag: &'static str,
) -> std::result::Result<(&'d ColumnarDescriptor, Choice), DenseCause> {
    let d = block
        .columnar
        .iter()
        .find(|d| d.dtype == want)
        .ok_or_else(|| DenseCause::NoSuchDtype {
            flag,
            dtype: want,
            block: block.name.clone(),
            names: names(block),
        })?;
    let choice = Choice::Forced {
        flag,
        block_dtype: block.dtype,
    };
    Ok((d, choice))
}

/// The row file of `block` to pull whole for a resident matrix: `dtype`'s
/// if forced, else the narrowest `BLOCK_EXACT` one with a row proof and
/// fewer bytes per row than the block; next to `base` (the columnar base
/// URL) or else next to the knot.
fn pick_resident<'d>(
    knot: &KnotHandle,
    block: &'d Block,
    base: Option<&str>,
    dtype: Option<(DType, &'static str)>,
) -> std::result::Result<(String, &'d ColumnarDescriptor, Choice), DenseCause> {
    let cols = block.shape.get(1).copied().unwrap_or(0);
    let block_row = block.dtype.row_bytes(cols).unwrap_or(0);
    let (d, choice) = match dtype {
        Some((want, flag)) => forced(block, want, flag)?,
        None => {
            let d = block
                .columnar
                .iter()
                .filter(|d| d.proof.is_some() && d.is_block_exact() && d.row_bytes < block_row)
                .min_by_key(|d| d.row_bytes)
                .ok_or_else(|| DenseCause::Block {
                    block: block.name.clone(),
                    dtype: block.dtype,
                    block_row,
                })?;
            (
                d,
                Choice::Narrower {
                    block_dtype: block.dtype,
                    block_row,
                },
            )
        }
    };
    let at = base.map_or_else(
        || knot.sibling(&d.object),
        |b| sibling(&base_dir(b), &d.object),
    );
    Ok((at, d, choice))
}

/// A location whose last segment names a file, for [`sibling`]: a base URL
/// given with or without its trailing `/`, or a row file URL.
fn base_dir(base: &str) -> String {
    let path = gkq_store::url::without_query(base);
    if path.ends_with(".rows") {
        base.to_owned()
    } else {
        format!("{}/x", path.trim_end_matches('/'))
    }
}

/// The columnar path for row file `desc` at `url`, checked by a HEAD of
/// its runs object (when the knot lists one) or of the row file, or taken
/// on the pinned header's word; the dense block when the length is wrong.
async fn checked(
    knot: &KnotHandle,
    store: &dyn RangeRead,
    url: String,
    desc: &ColumnarDescriptor,
    choice: Choice,
) -> ReadPath {
    // a row file with its records inline (FORMAT.md 7e) is its own runs object
    let inline = desc.inline_proof();
    let layout = (inline || knot.header().header().has_runs(&desc.object))
        .then(|| gkq_format::runs::RunsLayout::of(desc))
        .flatten();
    let runs_url = match inline {
        true => url.clone(),
        false => crate::columnar::runs_url(&url),
    };
    let columnar = |checked| {
        ReadPath::Columnar(ColumnarPath {
            url: url.clone(),
            desc: desc.clone(),
            choice: choice.clone(),
            checked,
        })
    };
    if knot.header_from_cache() {
        // a pinned knot opened from the disk cache: no request is made at
        // open, and every row is verified against the pinned root anyway
        let runs = layout.map(|_| runs_url);
        return columnar(Checked::Pinned { runs });
    }
    let no_runs = match layout {
        Some(l) => {
            let want = l.object_len().unwrap_or(0);
            match store.head(&runs_url).await.map(|h| h.len) {
                Ok(len) if len == want => {
                    let stride = l.stride();
                    return columnar(Checked::Runs {
                        url: runs_url,
                        len,
                        stride,
                    });
                }
                Ok(len) => Some(NoRuns::Length {
                    url: runs_url,
                    len,
                    want,
                }),
                Err(e) => Some(NoRuns::Head {
                    error: e.to_string(),
                }),
            }
        }
        None => None,
    };
    match store.head(&url).await.map(|h| h.len) {
        Err(e) => ReadPath::Dense(DenseCause::Head {
            url: url.clone(),
            error: e.to_string(),
            timeout: e.is_timeout(),
        }),
        Ok(len) if len != desc.byte_len => ReadPath::Dense(DenseCause::Length {
            url: url.clone(),
            len,
            expected: desc.byte_len,
            rows: desc.rows,
            row_bytes: desc.row_bytes,
        }),
        Ok(len) => columnar(Checked::RowFile { len, runs: no_runs }),
    }
}
