//! lm_head residency (the resolution is [`crate::resolve`]'s). The
//! columnar-embed design proposal keeps lm_head
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

use bytes::Bytes;
use gkq_format::{DType, hex};
use gkq_store::{RangeRead, ReadChecked};

use crate::cache::{DiskCache, Kind, Size};
use crate::error::{ReaderError, Result};
use crate::knot::KnotHandle;
use crate::proof;
use crate::resolve::{ColumnarPath, Resolution};
use crate::verified::{Entry, cached, sha256_is};

/// A resident `[vocab, hidden]` matrix. A block type whose kernels take
/// their rows packed (Q4_0, Q4_K, Q6_K on CPUs with AVX2) is held once,
/// packed, as its logits' matmul takes it (feature `candle`): its rows
/// are unpacked when asked for.
#[derive(Debug)]
pub struct Matrix {
    dtype: DType,
    rows: usize,
    cols: usize,
    /// As pulled, row-major; empty when held packed.
    bytes: Bytes,
    /// Whether its values widen to the block's exactly (the block itself,
    /// or a `BLOCK_EXACT` row file); a row file forced by
    /// `--lm-head-dtype` may not.
    exact: bool,
    #[cfg(feature = "candle")]
    weights: std::sync::OnceLock<candle_core::Tensor>,
    #[cfg(feature = "candle")]
    logits: std::sync::OnceLock<crate::rows::Weights>,
}

impl Matrix {
    pub(crate) fn new(dtype: DType, rows: usize, cols: usize, bytes: Bytes, exact: bool) -> Matrix {
        let m = Matrix {
            dtype,
            rows,
            cols,
            bytes,
            exact,
            #[cfg(feature = "candle")]
            weights: std::sync::OnceLock::new(),
            #[cfg(feature = "candle")]
            logits: std::sync::OnceLock::new(),
        };
        #[cfg(feature = "candle")]
        let m = m.packed();
        m
    }

    /// The matrix held packed, once, when its kernels take it so.
    #[cfg(feature = "candle")]
    fn packed(mut self) -> Matrix {
        let bytes = std::mem::take(&mut self.bytes);
        match crate::QMatrix::packed(bytes, self.dtype, self.rows, self.cols) {
            Ok(q) => {
                let _ = self.logits.set(crate::rows::Weights::Quant(q));
            }
            Err(bytes) => self.bytes = bytes,
        }
        self
    }

    /// Row `r` from the packed matrix that holds the rows, when one does
    /// (`Some(None)` past the last row).
    #[cfg(feature = "candle")]
    fn packed_row(&self, r: usize) -> Option<Option<Bytes>> {
        match self.logits.get() {
            Some(crate::rows::Weights::Quant(q)) if q.is_packed() => Some(q.row(r)),
            _ => None,
        }
    }

    #[cfg(not(feature = "candle"))]
    fn packed_row(&self, _: usize) -> Option<Option<Bytes>> {
        None
    }

    /// Row `r`'s bytes, row-major (unpacked when held packed); `None` past
    /// the last row.
    pub fn row(&self, r: usize) -> Option<Bytes> {
        if let Some(row) = self.packed_row(r) {
            return row;
        }
        let rb = usize::try_from(self.dtype.row_bytes(self.cols as u64)?).ok()?;
        (r < self.rows).then(|| self.bytes.slice(r * rb..(r + 1) * rb))
    }

    /// Bytes of the matrix, row-major.
    pub fn byte_len(&self) -> usize {
        let rb = self.dtype.row_bytes(self.cols as u64).unwrap_or(0);
        usize::try_from(rb).unwrap_or(0).saturating_mul(self.rows)
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

    /// The values as pulled and verified, row-major: a copy, unpacked,
    /// when the matrix is held packed ([`Matrix::row`] gives one row).
    pub fn bytes(&self) -> Bytes {
        // held packed exactly when the row-major bytes are not all there
        if self.bytes.len() == self.byte_len() {
            return self.bytes.clone();
        }
        (0..self.rows)
            .filter_map(|r| self.row(r))
            .flatten()
            .collect()
    }

    /// Whether its values are the block's exactly (else a forced row file's).
    pub fn is_exact(&self) -> bool {
        self.exact
    }

    /// All values as f32, row-major (widened exactly).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        if gkq_format::decode_f32(&self.bytes(), self.dtype, &mut out) {
            Ok(out)
        } else {
            Err(ReaderError::Compute(format!(
                "an lm_head of dtype {} cannot be read as f32",
                self.dtype
            )))
        }
    }

    /// The same values as an f32 `[rows, cols]` tensor, made once (feature
    /// `candle`). A block type is dequantized for it (4 bytes a value);
    /// [`Matrix::logits`] keeps it in its blocks.
    #[cfg(feature = "candle")]
    pub fn weights(&self) -> Result<&candle_core::Tensor> {
        if let Some(w) = self.weights.get() {
            return Ok(w);
        }
        let w = if self.dtype.is_quantized() {
            candle_core::Tensor::from_vec(
                self.to_f32()?,
                (self.rows, self.cols),
                &candle_core::Device::Cpu,
            )?
        } else {
            crate::rows::tensor_f32(&self.bytes, self.dtype, self.rows, self.cols)?
        };
        Ok(self.weights.get_or_init(|| w))
    }

    /// Makes what [`Matrix::logits`] computes with, once: the f32 tensor of
    /// a float matrix, candle's quantized matmul of a block type (feature
    /// `candle`).
    #[cfg(feature = "candle")]
    pub fn prepare(&self) -> Result<()> {
        if self.logits.get().is_none() {
            let w = if self.dtype.is_quantized() {
                let q = crate::QMatrix::new(self.bytes.clone(), self.dtype, self.rows, self.cols)?;
                crate::rows::Weights::Quant(q)
            } else {
                // the one f32 tensor (a clone shares its storage)
                crate::rows::Weights::Float(self.weights()?.clone())
            };
            let _ = self.logits.set(w);
        }
        Ok(())
    }

    /// `hidden [n, cols] @ self^T` → `[n, rows]`: an f32 matmul, or for a
    /// block type ggml's quantized kernels on the blocks as pulled, never
    /// widened (feature `candle`).
    #[cfg(feature = "candle")]
    pub fn logits(&self, hidden: &candle_core::Tensor) -> Result<candle_core::Tensor> {
        self.prepare()?;
        self.logits.get().expect("prepared above").logits(hidden)
    }
}

/// Pulls the row file of `c` whole: from the disk cache (by its sha256),
/// or in parallel parts of whole Merkle chunks, each verified as it
/// arrives against the chunk table.
pub(crate) async fn pull_row_file(
    store: &dyn RangeRead,
    disk: Option<&DiskCache>,
    c: &ColumnarPath,
) -> Result<Bytes> {
    let (url, desc) = (c.url.as_str(), &c.desc);
    let key = hex(&desc.sha256);
    let entry = Entry {
        kind: Kind::Blob,
        key: &key,
        size: Size::Exact(desc.byte_len),
    };
    let file = cached(disk, entry, sha256_is(desc.sha256), || async {
        let check = match desc.inline_proof() {
            // records inline (FORMAT.md 7e): the whole file's digest
            true => gkq_store::ReadCheck::Sha256(desc.sha256),
            false => {
                let (roots, _) = proof::chunk_table(store, disk, url, desc).await?;
                proof::chunks_check(desc, proof::layout(url, desc)?, roots)
            }
        };
        let t = std::time::Instant::now();
        let bytes = store
            .read_checked(url, (0, desc.byte_len), Some(desc.byte_len), check)
            .await?;
        tracing::info!(
            url,
            bytes = desc.byte_len,
            ms = t.elapsed().as_millis() as u64,
            "lm_head row file pulled, every chunk verified"
        );
        Ok(bytes)
    })
    .await?;
    Ok(match desc.inline_proof() {
        true => Bytes::from(gkq_format::into_rows(
            Vec::from(file),
            desc.row_bytes,
            desc.stride(),
        )),
        false => file,
    })
}

/// Pulls the lm_head as `resolution` says: its row file, falling back to
/// the dense block when the row file cannot be used (FORMAT.md 7a, the
/// policy of [`crate::fallback`]) unless `require`; the matrix, and the
/// resolution it was taken by when that changed.
pub(crate) async fn pull(
    knot: &KnotHandle,
    index: usize,
    (resolution, require): (&Resolution, bool),
    store: &dyn RangeRead,
    disk: Option<&DiskCache>,
) -> Result<(Matrix, Option<Resolution>)> {
    let block = knot.data_block(index)?.clone();
    let [rows, cols] = block.shape.as_slice() else {
        return Err(ReaderError::Compute(format!(
            "lm_head block {:?} is not 2-D",
            block.name
        )));
    };
    let (rows, cols) = (*rows as usize, *cols as usize);
    let dense = |bytes| Matrix::new(block.dtype, rows, cols, bytes, true);
    let Some(c) = resolution.columnar() else {
        return Ok((dense(knot.dense_values(index, store, disk).await?), None));
    };
    match pull_row_file(store, disk, c).await {
        Ok(bytes) => {
            let exact = c.desc.is_block_exact();
            Ok((Matrix::new(c.desc.dtype, rows, cols, bytes, exact), None))
        }
        Err(e) if crate::fallback::falls_back(&e) && require => {
            Err(ReaderError::ColumnarRequired {
                reason: gkq_format::error_chain(&e),
                bytes: knot.header().payload_len(index),
            })
        }
        Err(e) if crate::fallback::falls_back(&e) => {
            let fell = resolution.fell_back(&e);
            tracing::warn!(lm_head = %block.name, reason = %fell.reason(), "lm_head row file not used");
            let m = dense(knot.dense_values(index, store, disk).await?);
            Ok((m, Some(fell)))
        }
        Err(e) => Err(e),
    }
}

#[cfg(all(test, feature = "candle"))]
mod tests {
    use super::*;

    /// A Q4_K, Q6_K or Q4_0 matrix whose kernels take it packed is held
    /// once, packed; its rows, its bytes and its values are those pulled
    /// (a Q8_0 one is held as pulled).
    #[test]
    fn a_packed_matrix_is_held_once_and_gives_its_rows_back() {
        for (dtype, cols) in [
            (DType::Q4_K, 256),
            (DType::Q6_K, 256),
            (DType::Q4_0, 64),
            (DType::Q8_0, 64),
        ] {
            let rows = 37;
            let x: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
                .collect();
            let mut b = Vec::new();
            assert!(gkq_format::quant::quantize(&x, dtype, &mut b));
            let m = Matrix::new(dtype, rows, cols, Bytes::from(b.clone()), true);
            let packs = gkq_kernels::RowDot::of(dtype).is_some_and(|d| d.packs());
            assert_eq!(m.bytes.is_empty(), packs, "{dtype}: one copy");
            assert_eq!(
                (m.bytes()[..] == b[..], m.byte_len()),
                (true, b.len()),
                "{dtype}"
            );
            let rb = b.len() / rows;
            for r in 0..rows {
                assert_eq!(
                    m.row(r).as_deref(),
                    Some(&b[r * rb..(r + 1) * rb]),
                    "{dtype} {r}"
                );
            }
            assert_eq!(m.row(rows), None, "{dtype}");
            let mut want = Vec::new();
            assert!(gkq_format::decode_f32(&b, dtype, &mut want));
            assert_eq!(m.to_f32().expect("f32"), want, "{dtype}");
        }
    }
}
