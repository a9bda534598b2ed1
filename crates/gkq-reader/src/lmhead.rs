//! lm_head residency. The columnar-embed design proposal (not in this
//! repository) keeps lm_head whole: the tied matrix or an untied one is
//! pulled once per node and kept resident, because logits need every row at
//! every step. Its LM-head router study found a rank-K SVD sketch useless
//! for the argmax (recall@50 of 11.7 % at rank 256 on Qwen2.5-0.5B).

use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use candle_core::{D, Device, Tensor};
use gkq_format::DType;

use crate::error::{ReaderError, Result};
use crate::knot::KnotHandle;
use gkq_store::Store as Http;

/// A resident `[vocab, hidden]` matrix.
#[derive(Debug)]
pub struct Matrix {
    /// Dtype of `bytes`.
    pub dtype: DType,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// The block's bytes as stored in the knot (sha256-checked).
    pub bytes: Arc<[u8]>,
    /// The same values as an f32 tensor, for matmuls.
    pub weights: Tensor,
}

fn candle_dtype(d: DType) -> Result<candle_core::DType> {
    Ok(match d {
        DType::F32 => candle_core::DType::F32,
        DType::F16 => candle_core::DType::F16,
        DType::BF16 => candle_core::DType::BF16,
        other => {
            return Err(ReaderError::Compute(format!(
                "lm_head dtype {other} is not a float dtype"
            )));
        }
    })
}

/// `[rows, cols]` f32 weights from a block's bytes (f16/bf16 widened by candle).
pub fn weights_from_block(bytes: &[u8], dtype: DType, rows: usize, cols: usize) -> Result<Tensor> {
    let t = Tensor::from_raw_buffer(bytes, candle_dtype(dtype)?, &[rows, cols], &Device::Cpu)?;
    Ok(t.to_dtype(candle_core::DType::F32)?)
}

/// `hidden [n, cols] @ weights^T` → `[n, rows]`.
pub fn logits_with(weights: &Tensor, hidden: &Tensor) -> Result<Tensor> {
    Ok(hidden
        .to_dtype(candle_core::DType::F32)?
        .matmul(&weights.t()?)?)
}

pub(crate) struct Inner {
    pub(crate) knot: Arc<KnotHandle>,
    pub(crate) http: Arc<Http>,
    pub(crate) index: usize,
    pub(crate) resident: Arc<OnceLock<Arc<Matrix>>>,
}

impl Inner {
    fn pull(&self) -> Result<Arc<Matrix>> {
        if let Some(m) = self.resident.get() {
            return Ok(m.clone());
        }
        let block = self.knot.data_block(self.index)?.clone();
        let [rows, cols] = block.shape.as_slice() else {
            return Err(ReaderError::Compute(format!(
                "lm_head block {:?} is not 2-D",
                block.name
            )));
        };
        let bytes = self.knot.dense_values(self.index, &self.http)?;
        let weights = weights_from_block(&bytes, block.dtype, *rows as usize, *cols as usize)?;
        let m = Arc::new(Matrix {
            dtype: block.dtype,
            rows: *rows as usize,
            cols: *cols as usize,
            bytes,
            weights,
        });
        log::info!(
            "{}: lm_head {:?} resident ({} bytes)",
            self.knot.location(),
            block.name,
            m.bytes.len()
        );
        Ok(self.resident.get_or_init(|| m).clone())
    }
}

/// The output projection of a node that serves the output role.
pub struct LmHead {
    inner: Arc<Inner>,
    loading: Mutex<Option<JoinHandle<Result<Arc<Matrix>>>>>,
}

impl std::fmt::Debug for LmHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LmHead")
            .field("resident", &self.is_resident())
            .finish_non_exhaustive()
    }
}

impl LmHead {
    pub(crate) fn new(inner: Inner) -> LmHead {
        LmHead {
            inner: Arc::new(inner),
            loading: Mutex::new(None),
        }
    }

    /// Starts pulling the matrix on a background thread (prefill can run on
    /// columnar rows meanwhile). Idempotent.
    pub fn start_background(&self) {
        let mut l = self
            .loading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if l.is_none() && !self.is_resident() {
            let inner = self.inner.clone();
            *l = Some(std::thread::spawn(move || inner.pull()));
        }
    }

    /// Whether the matrix is resident.
    pub fn is_resident(&self) -> bool {
        self.inner.resident.get().is_some()
    }

    /// The resident matrix: waits for a background pull, or pulls now (on
    /// first decode).
    pub fn matrix(&self) -> Result<Arc<Matrix>> {
        if let Some(m) = self.inner.resident.get() {
            return Ok(m.clone());
        }
        let handle = self
            .loading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        match handle {
            Some(h) => h
                .join()
                .map_err(|_| ReaderError::Compute("the lm_head loader panicked".into()))?,
            None => self.inner.pull(),
        }
    }

    /// Logits `[n, vocab]` for hidden states `[n, hidden]`.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        logits_with(&self.matrix()?.weights, hidden)
    }

    /// The argmax token of each row of `hidden`.
    pub fn argmax(&self, hidden: &Tensor) -> Result<Vec<u32>> {
        Ok(self.logits(hidden)?.argmax(D::Minus1)?.to_vec1::<u32>()?)
    }
}
