//! Spectral (rank-K) block payloads: docs/FORMAT.md section 5.

use crate::cast::decode_f32;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::{Block, Encoding, Quant};

/// The factors of a spectral block, dequantised to f32.
#[derive(Clone, Debug, PartialEq)]
pub struct SpectralParts {
    /// Rows of the matrix.
    pub m: usize,
    /// Columns of the matrix.
    pub n: usize,
    /// Rank.
    pub k: usize,
    /// `m × k`, row-major.
    pub u: Vec<f32>,
    /// `k`.
    pub s: Vec<f32>,
    /// `k × n`, row-major.
    pub vt: Vec<f32>,
}

struct Take<'a> {
    rest: &'a [u8],
    block: &'a str,
}

impl<'a> Take<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.rest.len() {
            return Err(Error::BadSpectral {
                block: self.block.to_owned(),
                reason: "payload shorter than its factors".into(),
            });
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn floats(&mut self, count: usize, dtype: DType) -> Result<Vec<f32>> {
        let n = count
            .checked_mul(usize::try_from(dtype.itemsize()).unwrap_or(usize::MAX))
            .ok_or_else(|| Error::BadSpectral {
                block: self.block.to_owned(),
                reason: "factor size overflows".into(),
            })?;
        let mut out = Vec::new();
        decode_f32(self.bytes(n)?, dtype, &mut out);
        Ok(out)
    }

    /// `rows × cols` u8 values then per-row f32 scale and zero.
    fn quantised(&mut self, rows: usize, cols: usize) -> Result<Vec<f32>> {
        let q = self.bytes(rows.saturating_mul(cols))?;
        let scale = self.floats(rows, DType::F32)?;
        let zero = self.floats(rows, DType::F32)?;
        let mut out = Vec::with_capacity(q.len());
        if cols == 0 {
            return Ok(out);
        }
        for ((row, sc), z) in q.chunks_exact(cols).zip(&scale).zip(&zero) {
            out.extend(row.iter().map(|&v| (f32::from(v) - z) * sc));
        }
        Ok(out)
    }
}

impl SpectralParts {
    /// Splits and dequantises the payload of a validated spectral block.
    pub fn decode(block: &Block, payload: &[u8]) -> Result<SpectralParts> {
        let bad = |reason: &str| Error::BadSpectral {
            block: block.name.clone(),
            reason: reason.to_owned(),
        };
        let Encoding::Spectral {
            rank,
            factor_dtype,
            quant,
            ..
        } = &block.encoding
        else {
            return Err(bad("not a spectral block"));
        };
        let [m, n] = block.shape.as_slice() else {
            return Err(bad("shape is not 2-D"));
        };
        let to_usize = |v: u64| usize::try_from(v).map_err(|_| bad("dimension too large"));
        let (m, n) = (to_usize(*m)?, to_usize(*n)?);
        let k = to_usize(u64::from(*rank))?;
        let mut t = Take {
            rest: payload,
            block: &block.name,
        };
        let mk = m.checked_mul(k).ok_or_else(|| bad("size overflows"))?;
        let kn = k.checked_mul(n).ok_or_else(|| bad("size overflows"))?;
        let (u, s, vt) = match quant {
            Quant::None => {
                let u = t.floats(mk, *factor_dtype)?;
                let s = t.floats(k, DType::F32)?;
                let vt = t.floats(kn, *factor_dtype)?;
                (u, s, vt)
            }
            Quant::U8Affine => {
                let u = t.quantised(m, k)?;
                let s = t.floats(k, DType::F32)?;
                let vt = t.quantised(k, n)?;
                (u, s, vt)
            }
        };
        if !t.rest.is_empty() {
            return Err(bad("payload longer than its factors"));
        }
        Ok(SpectralParts { m, n, k, u, s, vt })
    }

    /// `U · diag(S) · Vt` as f32, row-major `m × n`, accumulated in increasing k.
    pub fn reconstruct(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.m.saturating_mul(self.n)];
        if self.k == 0 || self.n == 0 {
            return w;
        }
        for (w_row, u_row) in w.chunks_exact_mut(self.n).zip(self.u.chunks_exact(self.k)) {
            for ((u, s), vt_row) in u_row.iter().zip(&self.s).zip(self.vt.chunks_exact(self.n)) {
                let us = u * s;
                for (out, v) in w_row.iter_mut().zip(vt_row) {
                    *out += us * v;
                }
            }
        }
        w
    }
}

/// Reconstructs a spectral block as bytes of its own dtype (rounded to
/// nearest even when that dtype is f16/bf16).
pub fn reconstruct_spectral(block: &Block, payload: &[u8]) -> Result<Vec<u8>> {
    let w = SpectralParts::decode(block, payload)?.reconstruct();
    let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = Vec::with_capacity(bytes.len());
    crate::cast::cast_row(&bytes, DType::F32, block.dtype, &mut out).ok_or_else(|| {
        Error::BadSpectral {
            block: block.name.clone(),
            reason: format!("dtype {} cannot be reconstructed", block.dtype),
        }
    })?;
    Ok(out)
}
