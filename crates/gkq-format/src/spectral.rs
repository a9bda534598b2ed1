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

    /// `U · diag(S) · Vt` as f32, row-major `m × n` (section 5).
    pub fn reconstruct(&self) -> Vec<f32> {
        self.rows(0, self.m)
    }

    /// Rows `first..first + count` of the reconstruction (clamped to `m`),
    /// exactly as section 5 pins it: for each element an f32 accumulator
    /// starting at +0.0, and for k = 0, 1, ... in turn
    /// `acc = acc + (U[i][k] · S[k]) · Vt[k][j]`, every operation rounded
    /// to f32, no fused multiply-add (Rust never contracts `a * b + c`).
    pub fn rows(&self, first: usize, count: usize) -> Vec<f32> {
        let rows = count.min(self.m.saturating_sub(first));
        let mut w = vec![0f32; rows.saturating_mul(self.n)];
        if self.k == 0 || self.n == 0 {
            return w;
        }
        let u_rows = self.u.chunks_exact(self.k).skip(first);
        for (w_row, u_row) in w.chunks_exact_mut(self.n).zip(u_rows) {
            for ((u, s), vt_row) in u_row.iter().zip(&self.s).zip(self.vt.chunks_exact(self.n)) {
                let us = u * s;
                for (out, v) in w_row.iter_mut().zip(vt_row) {
                    *out += us * v;
                }
            }
        }
        w
    }

    /// The payload of a spectral block holding these factors (section 5):
    /// with `Quant::None`, `U` and `Vt` cast from f32 to `factor_dtype`
    /// (section 6); with `Quant::U8Affine` (`factor_dtype` must be `U8`),
    /// each row of `U` and of `Vt` quantised to u8 against its own range:
    /// `scale = (max - min) / 255`, `zero = -min / scale`,
    /// `q = round(x / scale + zero)` clamped to 0..=255 (a constant row
    /// gets `scale = 1`, `zero = -min`). `S` is always f32.
    pub fn encode(&self, factor_dtype: DType, quant: Quant) -> Result<Vec<u8>> {
        let bad = |reason: String| Error::BadSpectral {
            block: String::new(),
            reason,
        };
        let sizes_ok = self.u.len() == self.m.saturating_mul(self.k)
            && self.s.len() == self.k
            && self.vt.len() == self.k.saturating_mul(self.n);
        if !sizes_ok {
            return Err(bad("factor sizes do not match m, n and k".into()));
        }
        let f32_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let mut out = Vec::new();
        match quant {
            Quant::None => {
                if !factor_dtype.is_castable_float() {
                    return Err(bad(format!("factor dtype {factor_dtype} is not a float")));
                }
                for (i, part) in [&self.u, &self.s, &self.vt].into_iter().enumerate() {
                    let to = if i == 1 { DType::F32 } else { factor_dtype };
                    crate::cast::cast_row(&f32_bytes(part), DType::F32, to, &mut out)
                        .ok_or_else(|| bad(format!("cannot cast factors to {to}")))?;
                }
            }
            Quant::U8Affine => {
                if factor_dtype != DType::U8 {
                    return Err(bad("quant 1 needs factor dtype u8".into()));
                }
                quantise_rows(&self.u, self.k, &mut out);
                out.extend(f32_bytes(&self.s));
                quantise_rows(&self.vt, self.n, &mut out);
            }
        }
        Ok(out)
    }
}

/// Appends `U_q` (or `Vt_q`), then the per-row scales, then the zeros.
fn quantise_rows(values: &[f32], cols: usize, out: &mut Vec<u8>) {
    let mut scales = Vec::new();
    let mut zeros = Vec::new();
    if cols > 0 {
        for row in values.chunks_exact(cols) {
            let lo = row.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut scale = (hi - lo) / 255.0;
            let mut zero = -lo / scale;
            if !(scale > 0.0 && scale.is_finite() && zero.is_finite()) {
                scale = 1.0;
                zero = -lo;
            }
            // `as u8` saturates; the clamp documents the range
            out.extend(
                row.iter()
                    .map(|x| (x / scale + zero).round().clamp(0.0, 255.0) as u8),
            );
            scales.extend_from_slice(&scale.to_le_bytes());
            zeros.extend_from_slice(&zero.to_le_bytes());
        }
    }
    out.extend(scales);
    out.extend(zeros);
}

/// The relative Frobenius error `||A - W||_F / ||W||_F` of an
/// approximation `A` of `W`, accumulated in f64 over chunks of elements.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FrobeniusError {
    diff2: f64,
    ref2: f64,
}

impl FrobeniusError {
    /// Adds the elements `approx` and `exact` (same length and order).
    pub fn add(&mut self, approx: &[f32], exact: &[f32]) {
        for (a, w) in approx.iter().zip(exact) {
            let (a, w) = (f64::from(*a), f64::from(*w));
            self.diff2 += (a - w) * (a - w);
            self.ref2 += w * w;
        }
    }

    /// `‖W‖_F²` so far: the sum of the squared reference values.
    pub fn reference_sum_squares(&self) -> f64 {
        self.ref2
    }

    /// The relative error so far (0 for an all-zero `W` matched exactly,
    /// infinity for an all-zero `W` that was not).
    pub fn relative(&self) -> f64 {
        if self.ref2 > 0.0 {
            (self.diff2 / self.ref2).sqrt()
        } else if self.diff2 > 0.0 {
            f64::INFINITY
        } else {
            0.0
        }
    }
}

/// The decimal form of a recorded figure (section 3.1): the shortest
/// digits that read back as the same f64, never an exponent.
pub fn decimal(x: f64) -> String {
    format!("{x}")
}

/// Whether `s` is a decimal of section 3.1: `digits [. digits]`.
pub(crate) fn is_decimal(s: &str) -> bool {
    let mut parts = s.splitn(2, '.');
    let digits =
        |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let int = parts.next();
    let frac = parts.next();
    digits(int) && (frac.is_none() || digits(frac))
}

/// Whether `s` is a recorded figure of section 3.1: a decimal whose nearest
/// `f64` is finite and, for a share (`at_most_one`), whose exact value is
/// at most 1: `1.000…0` is, `1.00000000000000001` is not, though both read
/// as 1.0.
pub(crate) fn is_figure(s: &str, at_most_one: bool) -> bool {
    if !is_decimal(s) || !s.parse::<f64>().is_ok_and(f64::is_finite) {
        return false;
    }
    if !at_most_one {
        return true;
    }
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let int = int.trim_start_matches('0');
    int.is_empty() || (int == "1" && frac.bytes().all(|b| b == b'0'))
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
