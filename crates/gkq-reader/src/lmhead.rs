//! lm_head residency. The columnar-embed design proposal keeps lm_head
//! whole: the tied matrix or an untied one is pulled once per node and
//! kept resident, because logits need every row at every step; its LM-head
//! router study found a rank-K SVD sketch useless for the argmax
//! (recall@50 of 11.7 % at rank 256 on Qwen2.5-0.5B).
//!
//! The pull takes the narrowest exact source: a row file of the lm_head (or
//! of the tied embedding) marked `BLOCK_EXACT` with fewer bytes per row than
//! the block is pulled instead and widened exactly on the node (bf16 rows
//! of an f32 block: half the bytes). It is read in parallel parts aligned
//! to the Merkle chunks of its proof object, each chunk verified against
//! the chunk table as it arrives (FORMAT.md 7a), so no whole-file hash is
//! waited for. If that path fails, the dense block is pulled, with the
//! reason recorded.

use std::sync::Arc;

use bytes::Bytes;
use gkq_format::merkle::{self, Hash};
use gkq_format::{Block, ColumnarDescriptor, DType, Encoding, hex};
use gkq_store::{Check, RangeRead, ReadOptions, Store, StoreError};
use sha2::{Digest, Sha256};

use crate::cache::{DiskCache, Kind, Size};
use crate::columnar::proof_url;
use crate::error::{ReaderError, Result};
use crate::knot::{KnotHandle, sibling};
use crate::resolve::{ReadPath, Resolution};

/// A resident `[vocab, hidden]` matrix.
#[derive(Debug)]
pub struct Matrix {
    dtype: DType,
    rows: usize,
    cols: usize,
    bytes: Bytes,
    #[cfg(feature = "candle")]
    weights: std::sync::OnceLock<candle_core::Tensor>,
}

impl Matrix {
    pub(crate) fn new(dtype: DType, rows: usize, cols: usize, bytes: Bytes) -> Matrix {
        Matrix {
            dtype,
            rows,
            cols,
            bytes,
            #[cfg(feature = "candle")]
            weights: std::sync::OnceLock::new(),
        }
    }

    /// Dtype of [`Matrix::bytes`]: the block's, or that of the narrower
    /// exact row file it was pulled from (whose values widen to the block's).
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Rows (the vocabulary).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (the hidden size).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The values as pulled and verified, row-major.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// All values as f32, row-major (widened exactly).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        if gkq_format::decode_f32(&self.bytes, self.dtype, &mut out) {
            Ok(out)
        } else {
            Err(ReaderError::Compute(format!(
                "an lm_head of dtype {} cannot be read as f32",
                self.dtype
            )))
        }
    }

    /// The same values as an f32 `[rows, cols]` tensor, made once (feature `candle`).
    #[cfg(feature = "candle")]
    pub fn weights(&self) -> Result<&candle_core::Tensor> {
        if let Some(w) = self.weights.get() {
            return Ok(w);
        }
        let w = crate::rows::tensor_f32(&self.bytes, self.dtype, self.rows, self.cols)?;
        Ok(self.weights.get_or_init(|| w))
    }
}

/// Where the lm_head comes from.
#[derive(Clone, Debug)]
pub(crate) struct LmSource {
    pub(crate) resolution: Resolution,
    /// The row file to pull instead of the block, with its location.
    pub(crate) rows: Option<(String, ColumnarDescriptor)>,
}

/// The narrowest exact source of the lm_head block `index`: a `BLOCK_EXACT`
/// row file with a proof and fewer bytes per row than the block (`force`
/// picks one by dtype instead, for tests), next to `base` (the columnar
/// base URL) or else next to the knot.
pub(crate) fn lm_source(
    knot: &KnotHandle,
    index: usize,
    base: Option<&str>,
    force: Option<DType>,
) -> Result<LmSource> {
    let block = knot.data_block(index)?;
    let tensor = knot
        .header()
        .header()
        .blocks
        .get(index)
        .map_or_else(|| block.name.clone(), |b| b.name.clone());
    let dense = |reason: String| LmSource {
        resolution: Resolution {
            tensor: tensor.clone(),
            path: ReadPath::Dense,
            reason,
            columnar: None,
            runs: None,
        },
        rows: None,
    };
    if let Encoding::Spectral { rank, .. } = block.encoding {
        return Ok(dense(format!(
            "spectral block of rank {rank}: reconstructed (FORMAT.md section 5) and kept resident"
        )));
    }
    let block_row = block.shape.get(1).copied().unwrap_or(0) * block.dtype.itemsize();
    let proven = block.columnar.iter().filter(|d| d.proof.is_some());
    let pick = match force {
        Some(want) => match block.columnar.iter().find(|d| d.dtype == want) {
            Some(d) if d.proof.is_some() => Some((d, format!("forced by --lm-head-dtype; {}", exactness(d, block)))),
            Some(d) => return Ok(dense(format!("--lm-head-dtype {want}: {} has no row proof (a version 2 knot), so it cannot be verified: the dense block is pulled", d.object))),
            None => return Ok(dense(format!("--lm-head-dtype {want}: block {:?} has no {want} row file: the dense block is pulled", block.name))),
        },
        None => proven
            .filter(|d| d.is_block_exact() && d.row_bytes < block_row)
            .min_by_key(|d| d.row_bytes)
            .map(|d| {
                let why = format!(
                    "{} rows are exact for this {} block: {} B/row instead of {block_row}, widened on the node",
                    d.dtype, block.dtype, d.row_bytes
                );
                (d, why)
            }),
    };
    let Some((d, why)) = pick else {
        return Ok(dense(format!(
            "block {} pulled once, sha256-checked, and kept resident (no exact row file narrower than its {} B/row)",
            block.name, block_row
        )));
    };
    let at = base.map_or_else(
        || knot.sibling(&d.object),
        |b| sibling(&base_dir(b), &d.object),
    );
    Ok(LmSource {
        resolution: Resolution {
            tensor,
            path: ReadPath::Columnar,
            reason: format!(
                "{} from {at}: {why}; pulled in parallel parts, every chunk of {} rows verified against the knot's Merkle root",
                block.name,
                merkle::layout_of(d).map_or(0, |l| l.chunk_rows())
            ),
            columnar: Some((at.clone(), d.clone())),
            runs: None,
        },
        rows: Some((at, d.clone())),
    })
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

fn exactness(d: &ColumnarDescriptor, block: &Block) -> String {
    if d.is_block_exact() {
        format!("its values widen to the {} block exactly", block.dtype)
    } else {
        format!(
            "NOT exact: its values differ from the {} block's (no BLOCK_EXACT)",
            block.dtype
        )
    }
}

/// The chunk table of `desc`'s proof object at `url`, checked against the
/// root (disk cache first).
async fn chunk_roots(
    store: &Store,
    disk: Option<&DiskCache>,
    url: &str,
    desc: &ColumnarDescriptor,
) -> Result<(Vec<Hash>, u64)> {
    let layout = merkle::layout_of(desc)
        .ok_or_else(|| ReaderError::Missing(format!("{url}: no row proof")))?;
    let root = desc.proof.map(|p| hex(&p.root)).unwrap_or_default();
    if let Some(d) = disk {
        let c = desc.clone();
        if let Some(t) = d
            .get(
                Kind::Table,
                &root,
                Size::Exact(layout.table_len()),
                move |b| merkle::check_table(&c, b).is_ok(),
            )
            .await
        {
            return Ok((
                merkle::check_table(desc, &t).map_err(|e| unverified(url, e))?,
                0,
            ));
        }
    }
    let purl = proof_url(url);
    let opts = ReadOptions {
        total: layout.object_len(),
        ..Default::default()
    };
    let t = store
        .read_vec(&purl, 0, layout.table_len() - 1, opts)
        .await?;
    let roots = merkle::check_table(desc, &t).map_err(|e| unverified(url, e))?;
    let net = if crate::knot::is_url(url) {
        t.len() as u64
    } else {
        0
    };
    if let Some(d) = disk {
        d.put(Kind::Table, &root, Bytes::from(t)).await;
    }
    Ok((roots, net))
}

fn unverified(url: &str, e: impl Into<gkq_store::BoxError>) -> ReaderError {
    ReaderError::Unverified {
        url: url.to_owned(),
        via: format!(
            " (chunks checked against the chunk table of {})",
            proof_url(url)
        ),
        source: e.into(),
    }
}

/// Pulls the row file `desc` at `url` whole: from the disk cache (by its
/// sha256), or in parallel parts of whole Merkle chunks, each verified as it
/// arrives.
pub(crate) async fn pull_row_file(
    store: &Store,
    disk: Option<&DiskCache>,
    url: &str,
    desc: &ColumnarDescriptor,
) -> Result<(Bytes, u64)> {
    let key = hex(&desc.sha256);
    if let Some(d) = disk {
        let want = desc.sha256;
        let ok = move |b: &[u8]| <[u8; 32]>::from(Sha256::digest(b)) == want;
        if let Some(b) = d
            .get(Kind::Blob, &key, Size::Exact(desc.byte_len), ok)
            .await
        {
            return Ok((b, 0));
        }
    }
    let (roots, table_net) = chunk_roots(store, disk, url, desc).await?;
    let roots = Arc::new(roots);
    let layout = merkle::layout_of(desc)
        .ok_or_else(|| ReaderError::Missing(format!("{url}: no row proof")))?;
    let align = layout.chunk_rows().saturating_mul(desc.row_bytes).max(1);
    let d = desc.clone();
    let check = Check::Parts {
        align,
        check: Arc::new(move |off: u64, bytes: &[u8]| {
            let first = off / align;
            for (k, c) in bytes
                .chunks(usize::try_from(align).unwrap_or(usize::MAX))
                .enumerate()
            {
                merkle::check_chunk(&d, &roots, first + k as u64, c)?;
            }
            Ok(())
        }),
    };
    let t = std::time::Instant::now();
    let bytes = store
        .read_checked(url, 0, desc.byte_len, Some(desc.byte_len), check)
        .await?;
    tracing::info!(
        url,
        bytes = desc.byte_len,
        ms = t.elapsed().as_millis() as u64,
        "lm_head row file pulled, every chunk verified"
    );
    if let Some(d) = disk {
        d.put(Kind::Blob, &key, bytes.clone()).await;
    }
    let net = if crate::knot::is_url(url) {
        desc.byte_len + table_net
    } else {
        0
    };
    Ok((bytes, net))
}

/// Pulls the lm_head as `source` says, falling back to the dense block when
/// the row file cannot be used (a missing or unverifiable object); returns
/// the matrix and the resolution that was taken.
pub(crate) async fn pull(
    knot: &KnotHandle,
    index: usize,
    (source, require): (&LmSource, bool),
    store: &Store,
    disk: Option<&DiskCache>,
) -> Result<(Matrix, Resolution, u64)> {
    let block = knot.data_block(index)?.clone();
    let [rows, cols] = block.shape.as_slice() else {
        return Err(ReaderError::Compute(format!(
            "lm_head block {:?} is not 2-D",
            block.name
        )));
    };
    let (rows, cols) = (*rows as usize, *cols as usize);
    if let Some((url, desc)) = &source.rows {
        match pull_row_file(store, disk, url, desc).await {
            Ok((bytes, net)) => {
                let m = Matrix::new(desc.dtype, rows, cols, bytes);
                return Ok((m, source.resolution.clone(), net));
            }
            Err(e) if falls_back(&e) && require => {
                return Err(ReaderError::ColumnarRequired {
                    reason: gkq_format::error_chain(&e),
                    bytes: knot.header().payload_of(index).map_or(0, |p| p.len),
                });
            }
            Err(e) if falls_back(&e) => {
                let reason = format!(
                    "fell back to the dense block: {}",
                    gkq_format::error_chain(&e)
                );
                tracing::warn!(lm_head = %block.name, %reason, "lm_head row file not used");
                let (bytes, net) = knot.dense_values_net(index, store, disk).await?;
                let resolution = Resolution {
                    path: ReadPath::Dense,
                    reason,
                    columnar: None,
                    ..source.resolution.clone()
                };
                return Ok((Matrix::new(block.dtype, rows, cols, bytes), resolution, net));
            }
            Err(e) => return Err(e),
        }
    }
    let (bytes, net) = knot.dense_values_net(index, store, disk).await?;
    Ok((
        Matrix::new(block.dtype, rows, cols, bytes),
        source.resolution.clone(),
        net,
    ))
}

/// Whether a failed row-file pull should fall back to the dense block: the
/// object is missing, redirected, of the wrong length, ignores Range, or
/// fails verification. An unreachable server is an error of its own.
fn falls_back(e: &ReaderError) -> bool {
    match e {
        ReaderError::Unverified { .. } => true,
        ReaderError::Store(s) => matches!(
            s,
            StoreError::Status { .. }
                | StoreError::Redirect { .. }
                | StoreError::IgnoresRange { .. }
                | StoreError::ContentRange { .. }
                | StoreError::BodyLength { .. }
                | StoreError::PartCheck { .. }
                | StoreError::Io { .. }
                | StoreError::PastEnd { .. }
                | StoreError::ObjectLength { .. }
        ),
        _ => false,
    }
}
