//! Rows as bytes, as f32, or as a candle tensor.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use gkq_format::DType;

use crate::error::{ReaderError, Result};

/// Rows returned by a lookup, in request order.
#[derive(Clone, Debug)]
pub struct Rows {
    dtype: DType,
    cols: usize,
    rows: Vec<Arc<[u8]>>,
}

impl Rows {
    pub(crate) fn new(dtype: DType, cols: usize, rows: Vec<Arc<[u8]>>) -> Rows {
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

    /// Dtype of the bytes.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Values per row (the hidden size).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `i` as stored.
    pub fn bytes(&self, i: usize) -> Option<&[u8]> {
        self.rows.get(i).map(|r| &r[..])
    }

    /// All rows as f32, row-major (f16/bf16 widened exactly with `half`).
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

    /// A `[n, hidden]` f32 tensor on the CPU.
    pub fn to_tensor(&self) -> Result<Tensor> {
        Ok(Tensor::from_vec(
            self.to_f32()?,
            (self.rows.len(), self.cols),
            &Device::Cpu,
        )?)
    }
}
