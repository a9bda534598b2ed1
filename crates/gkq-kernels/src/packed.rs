//! Q4_0 and Q4_K as ggml's repacked kernels multiply them
//! (`ggml-cpu/repack.cpp`, `q4_0_8x8_q8_0`, `q4_K_8x8_q8_K`): rows
//! interleaved once, at load, sixteen at a time, so that one register holds
//! the same four bytes of sixteen rows and the products of 32 values with
//! a token are summed in integers, a row per lane, before any f32 step.
//! One pass over a block serves sixteen rows and up to eight tokens, with
//! f32 steps once per 32 values, not once per four.
//!
//! **The order** (the portable kernels', `portable::dot_q4_0` and
//! `kquant::dot_q4_k`), for each row and token, one accumulator from 0,
//! 32 values after 32 (a Q4_0 block; a Q4_K sub-block `j`), `s` the exact
//! sum of their products with the token's codes, the weights' codes taken
//! unsigned:
//!
//! - Q4_0: `acc = fma(d · d_a, s − 8 Σa, acc)`, `Σa` the sum of the
//!   token's 32 codes;
//! - Q4_K: `acc = fma((d · sc_j) · d_a, s, acc)`, then `acc = fma(−(dmin ·
//!   m_j) · d_a, Σa, acc)` (`d · sc_j` and `dmin · m_j` are exact).
//!
//! The integers are exact and every lane takes the same f32 steps, so
//! every kernel gives the portable one's bits.
//!
//! **The layout** of a packed matrix ([`pack_q4_0`], [`pack_q4_k`]): groups
//! of 16 rows, the last filled up with rows of zeros, each group's packed
//! blocks one after the other, each as many bytes as the 16 blocks it
//! comes from. A *word* is 4 bytes of each of the 16 rows, row after row
//! (64 bytes). A Q4_0 packed block (288 bytes) is the 16 rows' f16 scales
//! (32 bytes), then the words of nibble bytes `4k ..` for `k` in 0..4:
//! their low nibbles are values `4k .. 4k + 4`, their high ones values `16
//! + 4k ..`. A Q4_K one (2,304 bytes) is the 16 rows' `d`, their `dmin`
//! (f16, 32 bytes each), the words of scale bytes 0, 4 and 8, and the
//! words of nibble bytes `4v ..` for `v` in 0..32: word `8c + k`'s low
//! nibbles are sub-block `2c`'s values `4k ..`, its high ones sub-block
//! `2c + 1`'s.

use rayon::prelude::*;

use crate::Steps;
use crate::kquant::Q4_K_BYTES;

/// Rows packed together.
pub(crate) const GROUP: usize = 16;
/// Bytes of a Q4_0 block.
pub(crate) const Q4_0_BYTES: usize = 18;
/// Bytes of a packed block: 16 rows' blocks.
pub(crate) const BLOCK: usize = GROUP * Q4_0_BYTES;
/// Bytes of a packed Q4_K block.
pub(crate) const BLOCK_K: usize = GROUP * Q4_K_BYTES;

/// Rows packed for `rows` rows: whole groups.
pub(crate) fn padded(rows: usize) -> usize {
    rows.div_ceil(GROUP) * GROUP
}

/// `rows` rows of blocks of `bytes`, `row_bytes` each (whole blocks; the
/// caller checked), in groups of 16 (the last filled up with zeros), the
/// groups among rayon's threads: `place(o, r, b)` puts row `r`'s block `b`
/// into its group's packed block `o`.
fn pack(w: &[u8], rows: usize, row_bytes: usize, bytes: usize, place: Place) -> Vec<u8> {
    let mut out = vec![0u8; padded(rows) * row_bytes];
    let group_bytes = GROUP * row_bytes;
    if group_bytes == 0 {
        return out;
    }
    out.par_chunks_mut(group_bytes)
        .zip(w.par_chunks(group_bytes))
        .for_each(|(o, w)| {
            for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                let blocks = o.chunks_exact_mut(GROUP * bytes);
                blocks
                    .zip(row.chunks_exact(bytes))
                    .for_each(|(o, b)| place(o, r, b));
            }
        });
    out
}

/// Where a row's block goes in its group's packed block.
type Place = fn(&mut [u8], usize, &[u8]);

/// Four bytes of `b` from `from` to `o` at `at + 4r` (row `r`'s place in
/// a word of 16 rows).
#[inline(always)]
fn word(o: &mut [u8], at: usize, r: usize, b: &[u8], from: usize) {
    o[at + 4 * r..at + 4 * r + 4].copy_from_slice(&b[from..from + 4]);
}

/// Q4_0 rows packed (the module's layout).
pub(crate) fn pack_q4_0(w: &[u8], rows: usize, row_bytes: usize) -> Vec<u8> {
    pack(w, rows, row_bytes, Q4_0_BYTES, |o, r, b| {
        o[2 * r..2 * r + 2].copy_from_slice(&b[..2]);
        (0..4).for_each(|k| word(o, 32 + 64 * k, r, b, 2 + 4 * k));
    })
}

/// Q4_K rows packed (the module's layout).
pub(crate) fn pack_q4_k(w: &[u8], rows: usize, row_bytes: usize) -> Vec<u8> {
    pack(w, rows, row_bytes, Q4_K_BYTES, |o, r, b| {
        o[2 * r..2 * r + 2].copy_from_slice(&b[..2]);
        o[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&b[2..4]);
        (0..3).for_each(|k| word(o, 64 + 64 * k, r, b, 4 + 4 * k));
        (0..32).for_each(|v| word(o, 256 + 64 * v, r, b, 16 + 4 * v));
    })
}

/// A group's results `v` (token `t`'s lane `r` row `r`'s) into `o`, the
/// first `rows` rows of each token.
#[inline(always)]
pub(crate) fn put<const N: usize>(o: &mut [f32], steps: Steps, rows: usize, v: &[[f32; GROUP]; N]) {
    for (t, v) in v.iter().enumerate() {
        for (r, &x) in v[..rows].iter().enumerate() {
            o[r * steps.row + t * steps.token] = x;
        }
    }
}

/// A packed kernel's rows `$name`, in its target `$features`: each group
/// of `w` through `$group` (generic over the number of tokens) with eight
/// tokens' activations of type `$act`, the first four, or the first;
/// `rows` real rows.
macro_rules! packed_fn {
    ($name:ident, $features:literal, $group:ident, $act:ty) => {
        /// The `rows` rows of packed `w` with `n` (1, 4 or 8) of eight tokens.
        #[target_feature(enable = $features)]
        fn $name(
            w: &[u8],
            row_bytes: usize,
            rows: usize,
            a: [$act; 8],
            n: usize,
            out: &mut [f32],
            steps: $crate::Steps,
        ) {
            use $crate::packed::{GROUP, put};
            for (g, grp) in w.chunks_exact(GROUP * row_bytes).enumerate() {
                let real = (rows - GROUP * g).min(GROUP);
                let o = &mut out[GROUP * g * steps.row..];
                match n {
                    8 => put(o, steps, real, &$group::<8>(grp, a)),
                    4 => put(o, steps, real, &$group::<4>(grp, [a[0], a[1], a[2], a[3]])),
                    _ => put(o, steps, real, &$group::<1>(grp, [a[0]])),
                }
            }
        }
    };
}
pub(crate) use packed_fn;
