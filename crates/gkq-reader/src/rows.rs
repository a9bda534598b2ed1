//! Rows as bytes, as f32, or (feature `candle`) as a tensor.

use bytes::Bytes;
use gkq_format::DType;

use crate::error::{ReaderError, Result};

/// Rows returned by a lookup, in request order.
#[derive(Clone, Debug)]
pub struct Rows {
    dtype: DType,
    cols: usize,
    rows: Vec<Bytes>,
}

impl Rows {
    pub(crate) fn new(dtype: DType, cols: usize, rows: Vec<Bytes>) -> Rows {
        Rows { dtype, cols, rows }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// No rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Dtype of the bytes (that of the row file read; its values widen
    /// exactly to the block's when the resolution says so).
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Values per row (the hidden size).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `i` as stored: its values, or for a block type its raw blocks,
    /// scales inline (FORMAT.md 3.5).
    pub fn bytes(&self, i: usize) -> Option<&[u8]> {
        self.rows.get(i).map(|r| &r[..])
    }

    /// All rows as f32, row-major (f16/bf16 widened exactly with `half`, a
    /// block type dequantized as FORMAT.md 3.5 defines).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(self.rows.len() * self.cols);
        let mut tmp = Vec::new();
        for r in &self.rows {
            if !gkq_format::decode_f32(r, self.dtype, &mut tmp) {
                return Err(ReaderError::Compute(format!(
                    "rows of dtype {} cannot be read as f32",
                    self.dtype
                )));
            }
            out.extend_from_slice(&tmp);
        }
        Ok(out)
    }

    /// A `[n, hidden]` f32 tensor on the CPU (feature `candle`).
    #[cfg(feature = "candle")]
    pub fn to_tensor(&self) -> Result<candle_core::Tensor> {
        Ok(candle_core::Tensor::from_vec(
            self.to_f32()?,
            (self.rows.len(), self.cols),
            &candle_core::Device::Cpu,
        )?)
    }
}

/// `[rows, cols]` f32 weights from a block's bytes (f16/bf16 widened exactly).
#[cfg(feature = "candle")]
pub(crate) fn tensor_f32(
    bytes: &[u8],
    dtype: DType,
    rows: usize,
    cols: usize,
) -> Result<candle_core::Tensor> {
    let d = match dtype {
        DType::F32 => candle_core::DType::F32,
        DType::F16 => candle_core::DType::F16,
        DType::BF16 => candle_core::DType::BF16,
        other => {
            return Err(ReaderError::Compute(format!(
                "a {other} matrix is not a float matrix"
            )));
        }
    };
    let t =
        candle_core::Tensor::from_raw_buffer(bytes, d, &[rows, cols], &candle_core::Device::Cpu)?;
    Ok(t.to_dtype(candle_core::DType::F32)?)
}

/// The weights logits are computed with: f32, or a block type's blocks.
#[cfg(feature = "candle")]
#[derive(Debug)]
pub(crate) enum Weights {
    Float(candle_core::Tensor),
    Quant(crate::qmatrix::QMatrix),
}

#[cfg(feature = "candle")]
impl Weights {
    /// `hidden [n, cols] @ w^T` → `[n, rows]`.
    pub(crate) fn logits(&self, hidden: &candle_core::Tensor) -> Result<candle_core::Tensor> {
        match self {
            Weights::Float(w) => logits_with(w, hidden),
            Weights::Quant(q) => q.forward(hidden),
        }
    }
}

/// The argmax of each row of `logits` `[n, vocab]` (feature `candle`).
#[cfg(feature = "candle")]
pub(crate) fn argmax(logits: &candle_core::Tensor) -> Result<Vec<u32>> {
    Ok(logits.argmax(candle_core::D::Minus1)?.to_vec1::<u32>()?)
}

/// `hidden [n, cols] @ weights^T` → `[n, rows]` (feature `candle`).
#[cfg(feature = "candle")]
pub fn logits_with(
    weights: &candle_core::Tensor,
    hidden: &candle_core::Tensor,
) -> Result<candle_core::Tensor> {
    Ok(hidden
        .to_dtype(candle_core::DType::F32)?
        .matmul(&weights.t()?)?)
}

#[cfg(all(test, feature = "candle"))]
mod tests {
    /// Every block type of gkq-format's table has candle's kernel: a ggml
    /// type added there without one fails here.
    #[test]
    fn every_block_type_has_a_candle_kernel() {
        for d in gkq_format::QUANTIZED {
            let g = crate::qmatrix::ggml_dtype(d).unwrap_or_else(|| panic!("{d}: no candle type"));
            let (values, bytes) = d.block().expect("block");
            assert_eq!(g.block_size() as u64, values, "{d}");
            assert_eq!(g.type_size() as u64, bytes, "{d}");
        }
    }
}
