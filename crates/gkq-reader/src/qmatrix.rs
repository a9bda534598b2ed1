//! `x @ w^T` with `w` kept in its blocks (feature `candle`): by
//! gkq-kernels' row dot products on the blocks as pulled, where it has a
//! kernel for the type on this CPU (the 32-value types; Q4_K and Q6_K
//! where the CPU has AVX-512 VNNI or AVX2). Q4_0, Q4_K and Q6_K are then
//! packed once, sixteen rows interleaved, in the pulled bytes' own memory
//! when nothing else holds them (else in a copy, the pulled bytes then
//! dropped). Else by candle's quantized matmul (Q5_K, and the K types on
//! CPUs without AVX2), which keeps a repacked copy of some. With
//! `CANDLE_DEQUANTIZE_ALL` set, every type goes to candle, which then
//! widens it to f32.
//!
//! candle 0.11 multiplies a Q4_1 or Q5_0 matrix with scalar loops, one
//! token at a time (the profile of issue 45: 79 % of SmolLM2's decode).
//! Here the rows are split among rayon's threads and each row, once in
//! cache, meets a tile of tokens: a prompt is read from memory once per
//! tile, not once per token.

use bytes::{Bytes, BytesMut};
use candle_core::{Device, Tensor};
use gkq_format::DType;
use gkq_kernels::{MatPart, RowDot, matmul};

use crate::error::{ReaderError, Result};

/// A `[rows, cols]` matrix of a block type, multiplied in its blocks.
#[derive(Debug)]
pub struct QMatrix {
    rows: usize,
    cols: usize,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Rows { bytes: Bytes, dot: RowDot },
    Candle(candle_core::quantized::QMatMul),
}

impl QMatrix {
    /// The matrix of `bytes`, `rows` rows of whole blocks of `dtype`.
    pub fn new(bytes: Bytes, dtype: DType, rows: usize, cols: usize) -> Result<QMatrix> {
        let want = dtype.row_bytes(cols as u64).map(|r| r as usize * rows);
        if want != Some(bytes.len()) {
            return Err(ReaderError::Compute(format!(
                "a [{rows}, {cols}] {dtype} matrix is not {} bytes",
                bytes.len()
            )));
        }
        let bytes = match QMatrix::packed(bytes, dtype, rows, cols) {
            Ok(q) => return Ok(q),
            Err(bytes) => bytes,
        };
        let kind = match QMatrix::dot(dtype) {
            Some(dot) => Kind::Rows { bytes, dot },
            None => Kind::Candle(candle_qmatmul(&bytes, dtype, rows, cols)?),
        };
        Ok(QMatrix { rows, cols, kind })
    }

    /// gkq-kernels' kernel of `dtype`, unless `CANDLE_DEQUANTIZE_ALL` (the
    /// reference tests' dequantized runs) sends every type to candle.
    fn dot(dtype: DType) -> Option<RowDot> {
        RowDot::of(dtype).filter(|_| std::env::var_os("CANDLE_DEQUANTIZE_ALL").is_none())
    }

    /// The matrix of `bytes` (`rows` rows of whole blocks of `dtype`)
    /// packed for its kernels (Q4_0, Q4_K, Q6_K), in the bytes' own memory
    /// when nothing else holds them (else in a copy): the pulled bytes are
    /// then not kept beside it. `bytes` back when its kernels do not pack
    /// or its length is not the rows'.
    pub fn packed(
        bytes: Bytes,
        dtype: DType,
        rows: usize,
        cols: usize,
    ) -> std::result::Result<QMatrix, Bytes> {
        let Some(dot) = QMatrix::dot(dtype).filter(RowDot::packs) else {
            return Err(bytes);
        };
        let want = dtype.row_bytes(cols as u64).map(|r| r as usize * rows);
        if want != Some(bytes.len()) {
            return Err(bytes);
        }
        let mut m = bytes
            .try_into_mut()
            .unwrap_or_else(|b| BytesMut::from(&b[..]));
        // the lengths are whole rows of whole blocks: it packs
        let _ = dot.pack_in_place(&mut m, rows);
        let kind = Kind::Rows {
            bytes: m.freeze(),
            dot,
        };
        Ok(QMatrix { rows, cols, kind })
    }

    /// Whether its rows are held packed for its kernels (and only so:
    /// [`QMatrix::row`] unpacks one).
    pub fn is_packed(&self) -> bool {
        matches!(&self.kind, Kind::Rows { dot, .. } if dot.packs())
    }

    /// Row `r`'s bytes as pulled; `None` past the last row, or for a
    /// matrix candle multiplies (which keeps them its own way).
    pub fn row(&self, r: usize) -> Option<Bytes> {
        let Kind::Rows { bytes, dot } = &self.kind else {
            return None;
        };
        let rb = usize::try_from(dot.dtype().row_bytes(self.cols as u64)?).ok()?;
        if dot.packs() {
            return dot.unpack_row(bytes, self.rows, rb, r).map(Bytes::from);
        }
        (r < self.rows).then(|| bytes.slice(r * rb..(r + 1) * rb))
    }

    /// `x [.., cols] @ self^T` → `[.., rows]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut out = QMatrix::forward_many(&[self], x)?;
        Ok(out.pop().expect("one matrix, one product"))
    }

    /// `x @ m^T` for each matrix `m` of `ms` (the same columns): the
    /// activations quantized once, and the rows of all the matrices shared
    /// among the threads in one pass (a layer's q, k and v; its gate and
    /// up). When candle multiplies one of them, each goes on its own.
    pub fn forward_many(ms: &[&QMatrix], x: &Tensor) -> Result<Vec<Tensor>> {
        let parts: Option<Vec<MatPart<'_>>> = ms
            .iter()
            .map(|m| match &m.kind {
                Kind::Rows { bytes, dot } => Some(MatPart {
                    w: bytes,
                    dot: *dot,
                    rows: m.rows,
                }),
                Kind::Candle(_) => None,
            })
            .collect();
        let (Some(parts), Some(first)) = (parts, ms.first()) else {
            return ms.iter().map(|m| m.forward_alone(x)).collect();
        };
        let mut dims = x.dims().to_vec();
        if let Some(m) = ms.iter().find(|m| dims.last() != Some(&m.cols)) {
            return Err(ReaderError::Compute(format!(
                "{dims:?} activations for a matrix of {} columns",
                m.cols
            )));
        }
        let xs: Vec<f32> = x
            .to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1()?;
        let outs = matmul(&parts, &xs, xs.len() / first.cols);
        outs.into_iter()
            .zip(ms)
            .map(|(out, m)| {
                if let Some(last) = dims.last_mut() {
                    *last = m.rows;
                }
                Ok(Tensor::from_vec(out, dims.clone(), &Device::Cpu)?)
            })
            .collect()
    }

    /// This matrix's product on its own (candle's for a matrix it multiplies).
    fn forward_alone(&self, x: &Tensor) -> Result<Tensor> {
        match &self.kind {
            Kind::Candle(q) => Ok(candle_core::Module::forward(q, x)?),
            Kind::Rows { .. } => QMatrix::forward_many(&[self], x)?
                .pop()
                .ok_or_else(|| ReaderError::Compute("no product".into())),
        }
    }
}

/// candle's type of each block type (its `quantized` module): a table,
/// which a test holds to gkq-format's list of block types.
const CANDLE_TYPES: [(DType, candle_core::quantized::GgmlDType); 8] = {
    use candle_core::quantized::GgmlDType as G;
    [
        (DType::Q4_0, G::Q4_0),
        (DType::Q4_1, G::Q4_1),
        (DType::Q5_0, G::Q5_0),
        (DType::Q5_1, G::Q5_1),
        (DType::Q8_0, G::Q8_0),
        (DType::Q4_K, G::Q4K),
        (DType::Q5_K, G::Q5K),
        (DType::Q6_K, G::Q6K),
    ]
};

/// ggml's type for a block type (candle's `quantized` module).
pub(crate) fn ggml_dtype(dtype: DType) -> Option<candle_core::quantized::GgmlDType> {
    CANDLE_TYPES
        .iter()
        .find(|(d, _)| *d == dtype)
        .map(|&(_, g)| g)
}

/// candle's quantized matmul of a `[rows, cols]` matrix (its byte length
/// checked by the caller).
fn candle_qmatmul(
    bytes: &[u8],
    dtype: DType,
    rows: usize,
    cols: usize,
) -> Result<candle_core::quantized::QMatMul> {
    let g = ggml_dtype(dtype)
        .ok_or_else(|| ReaderError::Compute(format!("{dtype} is not one of ggml's block types")))?;
    // candle views the bytes as blocks in place (their f16 scales want an
    // even address) and copies them into its own storage: bytes already
    // 8-aligned (as pulled, they are) go as they are, others are copied to
    // an aligned place first (one matrix more in memory while it is built)
    let mut buf = Vec::new();
    let view: &[u8] = if bytes.as_ptr().align_offset(8) == 0 {
        bytes
    } else {
        buf.resize(bytes.len() + 8, 0u8);
        let at = buf.as_ptr().align_offset(8).min(8);
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        &buf[at..at + bytes.len()]
    };
    let t = candle_core::quantized::ggml_file::qtensor_from_ggml(
        g,
        view,
        vec![rows, cols],
        &Device::Cpu,
    )?;
    drop(buf);
    Ok(candle_core::quantized::QMatMul::from_qtensor(t)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_type_has_candles_type() {
        let ours: Vec<DType> = CANDLE_TYPES.iter().map(|(d, _)| *d).collect();
        assert_eq!(ours, gkq_format::QUANTIZED);
    }

    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Ours against candle's quantized matmul on the same blocks: 1 token,
    /// a few, more than a tile, and a batch dimension; every block type.
    /// The types that gkq-kernels multiplies sum in their own order (the
    /// K types with activations of a scale per 32 where candle and ggml
    /// have one per 256; the 32-value types with the same 8-bit
    /// activations as candle's): over a type's shapes, no further from the
    /// f64 product of the dequantized weights with the activations than
    /// candle's (the sum of squared errors, within f32's summation noise of
    /// 1e-5 of it; a single shape may go either way), and within 1 % of
    /// the largest result. The others are candle's, bit for bit.
    #[test]
    fn forward_equals_candles_quantized_matmul() {
        // each type's squared errors, ours and candle's, over its shapes
        let mut totals: Vec<(DType, f64, f64)> = Vec::new();
        // 256 columns: whole groups of four blocks; 192: and two blocks more
        for (dtype, cols) in gkq_format::QUANTIZED
            .into_iter()
            .flat_map(|d| [(d, 256), (d, 192)])
        {
            if d_is_k(dtype) && cols == 192 {
                continue;
            }
            let rows = 40;
            let mut b = Vec::new();
            assert!(gkq_format::quant::quantize(
                &noise(rows * cols, 5),
                dtype,
                &mut b
            ));
            let ours = QMatrix::new(Bytes::from(b.clone()), dtype, rows, cols).expect("matrix");
            let theirs = candle_qmatmul(&b, dtype, rows, cols).expect("candle");
            for shape in [
                vec![1, cols],
                vec![3, cols],
                vec![37, cols],
                vec![2, 5, cols],
            ] {
                let n: usize = shape.iter().product();
                // activations of a few hundred, as a residual stream has
                let x: Vec<f32> = noise(n, 9).iter().map(|v| v * 300.0).collect();
                let x = Tensor::from_vec(x, shape.clone(), &Device::Cpu).expect("x");
                let got = ours.forward(&x).expect("ours");
                let want = candle_core::Module::forward(&theirs, &x).expect("candle");
                assert_eq!(got.dims(), want.dims(), "{dtype} {shape:?}");
                let values = |t: &Tensor| -> Vec<f32> {
                    t.flatten_all().and_then(|t| t.to_vec1()).expect("values")
                };
                let (got, want) = (values(&got), values(&want));
                if RowDot::of(dtype).is_some() {
                    let exact = exact_product(&b, dtype, &x, rows);
                    let errors = |v: &[f32]| -> (f64, f64) {
                        v.iter()
                            .zip(&exact)
                            .fold((0f64, 0f64), |(m, sq), (&v, &e)| {
                                let d = (f64::from(v) - e).abs();
                                (m.max(d), sq + d * d)
                            })
                    };
                    let top = exact.iter().fold(0f64, |m, v| m.max(v.abs()));
                    let ((worst, ours), (_, candles)) = (errors(&got), errors(&want));
                    assert!(worst <= top * 0.01, "{dtype} {shape:?}: {worst} of {top}");
                    match totals.iter_mut().find(|t| t.0 == dtype) {
                        Some(t) => (t.1, t.2) = (t.1 + ours, t.2 + candles),
                        None => totals.push((dtype, ours, candles)),
                    }
                } else {
                    let bits = |v: &[f32]| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
                    assert_eq!(bits(&got), bits(&want), "{dtype} {shape:?}");
                }
            }
        }
        // the 32-value types: candle's codes, summed in another order (q5_0:
        // 122014.51 against 122014.47)
        for (dtype, ours, candles) in totals {
            assert!(
                ours <= candles * (1.0 + 1e-5),
                "{dtype}: squared error {ours}, candle's {candles}"
            );
        }
    }

    /// `x @ w^T` in f64, `w` the `rows` dequantized rows of `b`.
    fn exact_product(b: &[u8], dtype: DType, x: &Tensor, rows: usize) -> Vec<f64> {
        let mut w = Vec::new();
        assert!(gkq_format::quant::dequantize(b, dtype, &mut w));
        let x: Vec<f32> = x.flatten_all().and_then(|t| t.to_vec1()).expect("x");
        let cols = w.len() / rows;
        x.chunks_exact(cols)
            .flat_map(|x| {
                w.chunks_exact(cols).map(move |w| {
                    w.iter()
                        .zip(x)
                        .map(|(&w, &x)| f64::from(w) * f64::from(x))
                        .sum::<f64>()
                })
            })
            .collect()
    }

    /// Several matrices in one pass equal each on its own, bit for bit
    /// (a layer's q, k and v), a candle-multiplied one among them too.
    #[test]
    fn forward_many_equals_each_forward() {
        let cols = 256;
        let ms: Vec<QMatrix> = [(DType::Q4_1, 40), (DType::Q8_0, 12), (DType::Q4_K, 8)]
            .into_iter()
            .map(|(dtype, rows)| {
                let mut b = Vec::new();
                assert!(gkq_format::quant::quantize(
                    &noise(rows * cols, rows as u64),
                    dtype,
                    &mut b
                ));
                QMatrix::new(Bytes::from(b), dtype, rows, cols).expect("matrix")
            })
            .collect();
        for (tokens, group) in [(1, &ms[..2]), (5, &ms[..2]), (3, &ms[..])] {
            let x: Vec<f32> = noise(tokens * cols, 3).iter().map(|v| v * 30.0).collect();
            let x = Tensor::from_vec(x, (tokens, cols), &Device::Cpu).expect("x");
            let refs: Vec<&QMatrix> = group.iter().collect();
            let many = QMatrix::forward_many(&refs, &x).expect("many");
            assert_eq!(many.len(), group.len());
            for (m, got) in group.iter().zip(&many) {
                let want = m.forward(&x).expect("one");
                let bits = |t: &Tensor| -> Vec<u32> {
                    let v: Vec<f32> = t.flatten_all().and_then(|t| t.to_vec1()).expect("values");
                    v.iter().map(|x| x.to_bits()).collect()
                };
                assert_eq!(got.dims(), [tokens, m.rows]);
                assert_eq!(bits(got), bits(&want), "{tokens} tokens");
            }
        }
    }

    /// The K types' blocks hold 256 values.
    fn d_is_k(d: DType) -> bool {
        matches!(d, DType::Q4_K | DType::Q5_K | DType::Q6_K)
    }

    #[test]
    fn wrong_lengths_are_refused_naming_the_matrix() {
        let b = Bytes::from(vec![0u8; 20 * 8]);
        let e = QMatrix::new(b.clone(), DType::Q4_1, 8, 64).expect_err("short");
        assert!(
            e.to_string()
                .contains("[8, 64] q4_1 matrix is not 160 bytes"),
            "{e}"
        );
        let m = QMatrix::new(b, DType::Q4_1, 8, 32).expect("matrix");
        let x = Tensor::zeros((2, 64), candle_core::DType::F32, &Device::Cpu).expect("x");
        let e = m.forward(&x).expect_err("columns");
        assert!(
            e.to_string()
                .contains("[2, 64] activations for a matrix of 32 columns"),
            "{e}"
        );
    }
}
