//! ggml's block-quantized types (docs/FORMAT.md section 3.5): the byte
//! layout of each block, its dequantization, and ggml's reference
//! quantizers, evaluated in IEEE binary32 with every operation rounded (no
//! fused multiply-add), so that the same input gives the same bytes on
//! every machine and whatever the thread count.
//!
//! A quantized row is a whole number of blocks; blocks hold `QK` = 32
//! (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) or `QK_K` = 256 (Q4_K, Q5_K, Q6_K)
//! consecutive values of a row with their scales inline.
//!
//! Dequantization never panics, whatever the bytes (the `quant` fuzz
//! target). Every index below is into a fixed-size block array with a
//! loop bound equal to its length, so the workspace's indexing and
//! arithmetic lints, which guard the parser's untrusted lengths and
//! offsets, are allowed here, and so are the index loops of the C code
//! they follow.
#![allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::needless_range_loop
)]

mod k;
mod simple;

use half::f16;

use crate::dtype::DType;

/// Values per block of the 32-element types.
pub const QK: usize = 32;
/// Values per super-block of the K types.
pub const QK_K: usize = 256;

/// `(values, bytes)` of one block of `dtype`, for the block types.
pub(crate) fn layout(dtype: DType) -> Option<(usize, usize)> {
    Some(match dtype {
        DType::Q4_0 => (QK, 18),
        DType::Q4_1 => (QK, 20),
        DType::Q5_0 => (QK, 22),
        DType::Q5_1 => (QK, 24),
        DType::Q8_0 => (QK, 34),
        DType::Q4_K => (QK_K, 144),
        DType::Q5_K => (QK_K, 176),
        DType::Q6_K => (QK_K, 210),
        _ => return None,
    })
}

/// An f32 as the f16 ggml stores (round to nearest, ties to even).
fn half(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

/// The f16 at `b` as f32 (exact).
fn unhalf(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

/// Dequantizes whole blocks of `dtype` from `src` into `out` (cleared
/// first). `false` when `dtype` is not a block type or `src` is not whole
/// blocks.
pub fn dequantize(src: &[u8], dtype: DType, out: &mut Vec<f32>) -> bool {
    out.clear();
    let Some((n, size)) = layout(dtype) else {
        return false;
    };
    if !src.len().is_multiple_of(size) {
        return false;
    }
    out.reserve(src.len() / size * n);
    for b in src.chunks_exact(size) {
        let mut y = [0f32; QK_K];
        let y = &mut y[..n];
        match dtype {
            DType::Q4_0 => simple::dequant_q4_0(b, y),
            DType::Q4_1 => simple::dequant_q4_1(b, y),
            DType::Q5_0 => simple::dequant_q5_0(b, y),
            DType::Q5_1 => simple::dequant_q5_1(b, y),
            DType::Q8_0 => simple::dequant_q8_0(b, y),
            DType::Q4_K => k::dequant_q4_k(b, y),
            DType::Q5_K => k::dequant_q5_k(b, y),
            _ => k::dequant_q6_k(b, y),
        }
        out.extend_from_slice(y);
    }
    true
}

/// Quantizes `src` (whole blocks of values) to `dtype`, appending the
/// blocks to `out`. `false` when `dtype` is not a block type or `src` is
/// not whole blocks. Non-finite values give deterministic but meaningless
/// blocks: callers refuse them first (`gkq-pack` unless `--allow-nonfinite`).
pub fn quantize(src: &[f32], dtype: DType, out: &mut Vec<u8>) -> bool {
    let Some((n, size)) = layout(dtype) else {
        return false;
    };
    if !src.len().is_multiple_of(n) {
        return false;
    }
    out.reserve(src.len() / n * size);
    for x in src.chunks_exact(n) {
        let mut b = [0u8; 210];
        let b = &mut b[..size];
        match dtype {
            DType::Q4_0 => simple::quant_q4_0(x, b),
            DType::Q4_1 => simple::quant_q4_1(x, b),
            DType::Q5_0 => simple::quant_q5_0(x, b),
            DType::Q5_1 => simple::quant_q5_1(x, b),
            DType::Q8_0 => simple::quant_q8_0(x, b),
            DType::Q4_K => k::quant_q4_k(x, b),
            DType::Q5_K => k::quant_q5_k(x, b),
            _ => k::quant_q6_k(x, b),
        }
        out.extend_from_slice(b);
    }
    true
}

#[cfg(test)]
mod tests;
