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

pub use k::QK_K;
pub use simple::{QK, round_i8, unhalf, unpack4, unpack5};

use crate::dtype::DType;

/// One ggml block type: its block (values, bytes), its codes and its
/// reference quantizer. The one table of what a block type's bytes are; a
/// new ggml type is an entry here (its compute kernels are gkq-kernels'
/// table), and a test fails while a quantized `DType` has none.
pub(crate) struct BlockType {
    /// The dtype.
    pub(crate) dtype: DType,
    /// Values per block.
    pub(crate) values: usize,
    /// Bytes per block.
    pub(crate) bytes: usize,
    /// ggml's type code (GGUF's tensor type).
    pub(crate) ggml: u32,
    /// llama-quantize's `tensor_type_fallback` for rows the type cannot
    /// fill: the next type it tries (f16 after that).
    pub(crate) fallback: Option<DType>,
    dequant: Dequant,
    quant: Quantize,
}

/// A block's dequantization kernel: its bytes into its values.
type Dequant = fn(&[u8], &mut [f32]);
/// A block's reference quantizer: its values into its bytes.
type Quantize = fn(&[f32], &mut [u8]);

const fn entry(
    (dtype, ggml): (DType, u32),
    (values, bytes): (usize, usize),
    fallback: Option<DType>,
    (dequant, quant): (Dequant, Quantize),
) -> BlockType {
    BlockType {
        dtype,
        values,
        bytes,
        ggml,
        fallback,
        dequant,
        quant,
    }
}

/// ggml's block types, in code order.
pub(crate) const BLOCK_TYPES: [BlockType; 8] = {
    use DType::*;
    use k::*;
    use simple::*;
    [
        entry((Q4_0, 2), (QK, 18), None, (dequant_q4_0, quant_q4_0)),
        entry((Q4_1, 3), (QK, 20), None, (dequant_q4_1, quant_q4_1)),
        entry((Q5_0, 6), (QK, 22), None, (dequant_q5_0, quant_q5_0)),
        entry((Q5_1, 7), (QK, 24), None, (dequant_q5_1, quant_q5_1)),
        entry((Q8_0, 8), (QK, 34), None, (dequant_q8_0, quant_q8_0)),
        entry(
            (Q4_K, 12),
            (QK_K, 144),
            Some(Q5_0),
            (dequant_q4_k, quant_q4_k),
        ),
        entry(
            (Q5_K, 13),
            (QK_K, 176),
            Some(Q5_1),
            (dequant_q5_k, quant_q5_k),
        ),
        entry(
            (Q6_K, 14),
            (QK_K, 210),
            Some(Q8_0),
            (dequant_q6_k, quant_q6_k),
        ),
    ]
};

pub(crate) fn block_type(dtype: DType) -> Option<&'static BlockType> {
    BLOCK_TYPES.iter().find(|t| t.dtype == dtype)
}

/// The block type of ggml type code `ggml`.
pub(crate) fn of_ggml(ggml: u32) -> Option<DType> {
    BLOCK_TYPES.iter().find(|t| t.ggml == ggml).map(|t| t.dtype)
}

/// `(values, bytes)` of one block of `dtype`, for the block types.
pub(crate) fn layout(dtype: DType) -> Option<(usize, usize)> {
    block_type(dtype).map(|t| (t.values, t.bytes))
}

/// Dequantizes whole blocks of `dtype` from `src` into `out` (cleared
/// first). `false` when `dtype` is not a block type or `src` is not whole
/// blocks.
pub fn dequantize(src: &[u8], dtype: DType, out: &mut Vec<f32>) -> bool {
    out.clear();
    let Some(t) = block_type(dtype) else {
        return false;
    };
    if !src.len().is_multiple_of(t.bytes) {
        return false;
    }
    out.resize(src.len() / t.bytes * t.values, 0.0);
    for (b, y) in src
        .chunks_exact(t.bytes)
        .zip(out.chunks_exact_mut(t.values))
    {
        (t.dequant)(b, y);
    }
    true
}

/// Quantizes `src` (whole blocks of values) to `dtype`, appending the
/// blocks to `out`. `false` when `dtype` is not a block type or `src` is
/// not whole blocks. Non-finite values give deterministic but meaningless
/// blocks: callers refuse them first (`gkq-pack` unless `--allow-nonfinite`).
pub fn quantize(src: &[f32], dtype: DType, out: &mut Vec<u8>) -> bool {
    let Some((t, blocks)) = blocks_for(src, dtype, out) else {
        return false;
    };
    for (x, b) in src
        .chunks_exact(t.values)
        .zip(blocks.chunks_exact_mut(t.bytes))
    {
        (t.quant)(x, b);
    }
    true
}

/// Values handed to [`quantize_seen`]'s callback at a time: whole blocks of
/// every type (32 or 256), 4 KiB of f32 (in L1).
const SEEN: usize = 1024;

/// As [`quantize`], handing the values and the values their blocks
/// dequantize to, a few blocks at a time while they are in cache, to
/// `seen` (for error figures without a second pass over the blocks).
pub fn quantize_seen(
    src: &[f32],
    dtype: DType,
    out: &mut Vec<u8>,
    seen: impl FnMut(&[f32], &[f32]),
) -> bool {
    let Some(t) = block_type(dtype) else {
        return false;
    };
    let block = |x: &[f32], b: &mut [u8], y: &mut [f32]| {
        (t.quant)(x, b);
        (t.dequant)(b, y);
    };
    quantize_seen_by(src, dtype, out, block, seen)
}

/// [`quantize_seen`] with each block quantized and dequantized by `block`
/// (its values, its bytes, its values dequantized), which must give the
/// bytes and values of the type's own quantizer: a faster form of it
/// (`gkq-kernels`).
pub fn quantize_seen_by(
    src: &[f32],
    dtype: DType,
    out: &mut Vec<u8>,
    mut block: impl FnMut(&[f32], &mut [u8], &mut [f32]),
    mut seen: impl FnMut(&[f32], &[f32]),
) -> bool {
    let Some((t, blocks)) = blocks_for(src, dtype, out) else {
        return false;
    };
    let per = SEEN / t.values * t.bytes;
    let mut y = [0f32; SEEN];
    for (x, b) in src.chunks(SEEN).zip(blocks.chunks_mut(per)) {
        let y = &mut y[..x.len()];
        let blocks = x.chunks_exact(t.values).zip(b.chunks_exact_mut(t.bytes));
        for ((x, b), y) in blocks.zip(y.chunks_exact_mut(t.values)) {
            block(x, b, y);
        }
        seen(x, y);
    }
    true
}

/// The block type of `dtype` and room in `out` for the blocks of `src`
/// (zeroed), when `dtype` is a block type and `src` whole blocks.
fn blocks_for<'a>(
    src: &[f32],
    dtype: DType,
    out: &'a mut Vec<u8>,
) -> Option<(&'static BlockType, &'a mut [u8])> {
    let t = block_type(dtype)?;
    if !src.len().is_multiple_of(t.values) {
        return None;
    }
    let start = out.len();
    out.resize(start + src.len() / t.values * t.bytes, 0);
    Some((t, out.get_mut(start..)?))
}

/// The block types, in code order: those of the block-type table
/// (`quant::BLOCK_TYPES`, with their layouts and kernels).
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)] // const: checked at compile time
pub const QUANTIZED: [DType; 8] = {
    let mut out = [DType::F32; 8];
    let mut i = 0;
    while i < out.len() {
        out[i] = BLOCK_TYPES[i].dtype;
        i += 1;
    }
    out
};

/// What the block-type table says of a dtype (here, so that `dtype.rs`
/// needs nothing of this module).
impl DType {
    /// `(values, bytes)` of one block of a block type (section 3.5).
    pub fn block(self) -> Option<(u64, u64)> {
        layout(self).map(|(n, b)| (n as u64, b as u64))
    }

    /// The names of the block types, the table's (`q4_0, q4_1, …`), for
    /// help and messages.
    pub fn quantized_names() -> String {
        let names: Vec<String> = QUANTIZED.iter().map(|d| d.to_string()).collect();
        names.join(", ")
    }

    /// llama-quantize's fallback for rows a block type cannot fill (its
    /// `tensor_type_fallback`): a K type's 32-value type; f16 after that.
    pub fn quant_fallback(self) -> Option<DType> {
        block_type(self).and_then(|t| t.fallback)
    }
}

#[cfg(test)]
mod tests;
