//! Q4_0, Q4_K and Q6_K as ggml's repacked kernels multiply them
//! (`ggml-cpu/repack.cpp`, `q4_0_8x8_q8_0`, `q4_K_8x8_q8_K`): rows
//! interleaved once, at load, sixteen at a time, so that one register holds
//! the same four bytes of sixteen rows and the products of 32 values with
//! a token are summed in integers, a row per lane, before any f32 step.
//! One pass over a block serves sixteen rows and up to eight tokens, with
//! f32 steps once per 32 values, not once per four.
//!
//! **The order** (the portable kernels', `portable::dot_q4_0`,
//! `kquant::dot_q4_k` and `kquant::dot_q6_k`), for each row and token, one
//! accumulator from 0,
//! 32 values after 32 (a Q4_0 block; a Q4_K sub-block `j`), `s` the exact
//! sum of their products with the token's codes, the weights' codes taken
//! unsigned:
//!
//! - Q4_0: `acc = fma(d · d_a, s − 8 Σa, acc)`, `Σa` the sum of the
//!   token's 32 codes;
//! - Q4_K: `acc = fma((d · sc_j) · d_a, s, acc)`, then `acc = fma(−(dmin ·
//!   m_j) · d_a, Σa, acc)` (`d · sc_j` and `dmin · m_j` are exact);
//! - Q6_K: `s` for each 16 with its own scale, less 32 times the sum of
//!   the token's 16 codes; `T = sc_2j · s_0 + sc_2j+1 · s_1` in integers,
//!   and `acc = fma(d · d_a, T, acc)` (`T` to f32 rounded to nearest).
//!
//! The integers are exact and every lane takes the same f32 steps, so
//! every kernel gives the portable one's bits.
//!
//! **The layout** of a packed matrix (`Q4_0_LAYOUT`, `Q4_K_LAYOUT`,
//! `Q6_K_LAYOUT`, each a table of where a block's bytes go, which
//! [`pack_in_place`] and [`unpack_row`] share): groups
//! of 16 rows, the last filled up with rows of zeros, each group's packed
//! blocks one after the other, each as many bytes as the 16 blocks it
//! comes from. A *word* is 4 bytes of each of the 16 rows, row after row
//! (64 bytes). A Q4_0 packed block (288 bytes) is the 16 rows' f16 scales
//! (32 bytes), then the words of nibble bytes `4k ..` for `k` in 0..4:
//! their low nibbles are values `4k .. 4k + 4`, their high ones values
//! `16 + 4k ..`. A Q4_K one (2,304 bytes) is the 16 rows' `d`, their `dmin`
//! (f16, 32 bytes each), the words of scale bytes 0, 4 and 8, and the
//! words of nibble bytes `4v ..` for `v` in 0..32: word `8c + k`'s low
//! nibbles are sub-block `2c`'s values `4k ..`, its high ones sub-block
//! `2c + 1`'s. A Q6_K one (3,360 bytes) is the 16 rows' `d` (f16), the
//! words of the 16 scale bytes, the 32 words of `ql` and the 16 of `qh`:
//! values `32j + 4k ..` (`n = j / 4`, `p = j mod 4`) are the low (`p` < 2)
//! or high nibbles of `ql` word `16n + 8 (p mod 2) + k`, with bits `2p ..
//! 2p + 2` of `qh` word `8n + k` above them.

use rayon::prelude::*;

use crate::Steps;
use crate::kquant::{Q4_K_BYTES, Q6_K_BYTES};

/// Rows packed together.
pub(crate) const GROUP: usize = 16;
/// Bytes of a Q4_0 block.
pub(crate) const Q4_0_BYTES: usize = 18;
/// Bytes of a packed block: 16 rows' blocks.
pub(crate) const BLOCK: usize = GROUP * Q4_0_BYTES;
/// Bytes of a packed Q4_K block.
pub(crate) const BLOCK_K: usize = GROUP * Q4_K_BYTES;
/// Bytes of a packed Q6_K block.
pub(crate) const BLOCK_Q6: usize = GROUP * Q6_K_BYTES;

/// Rows packed for `rows` rows: whole groups.
pub(crate) fn padded(rows: usize) -> usize {
    rows.div_ceil(GROUP) * GROUP
}

/// A run of a block's bytes in its group's packed block: bytes `from ..
/// from + len` of row `r`'s block are bytes `at + len · r ..` of the packed
/// block (`len` 2 for an f16 of each row, 4 for a word).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    at: usize,
    from: usize,
    len: usize,
}

/// A packed type's layout: its block's bytes and where each run goes.
#[derive(Debug)]
pub(crate) struct Layout {
    /// Bytes of a block.
    pub(crate) bytes: usize,
    spans: &'static [Span],
}

/// `halves` f16 of each row (at, from), then `n` words each of the
/// `words` runs (packed at, block from), in that order.
const fn spans<const N: usize>(
    halves: &[(usize, usize)],
    words: &[(usize, usize, usize)],
) -> [Span; N] {
    let mut out = [Span {
        at: 0,
        from: 0,
        len: 0,
    }; N];
    let (mut k, mut h) = (0, 0);
    while h < halves.len() {
        out[k] = Span {
            at: halves[h].0,
            from: halves[h].1,
            len: 2,
        };
        k += 1;
        h += 1;
    }
    let mut w = 0;
    while w < words.len() {
        let (at, from, n) = words[w];
        let mut v = 0;
        while v < n {
            out[k] = Span {
                at: at + 64 * v,
                from: from + 4 * v,
                len: 4,
            };
            k += 1;
            v += 1;
        }
        w += 1;
    }
    out
}

/// Q4_0: the scale, then the four words of nibbles.
pub(crate) static Q4_0_LAYOUT: Layout = Layout {
    bytes: Q4_0_BYTES,
    spans: &spans::<5>(&[(0, 0)], &[(32, 2, 4)]),
};
/// Q4_K: `d`, `dmin`, three words of scales, 32 of nibbles.
pub(crate) static Q4_K_LAYOUT: Layout = Layout {
    bytes: Q4_K_BYTES,
    spans: &spans::<37>(&[(0, 0), (32, 2)], &[(64, 4, 3), (256, 16, 32)]),
};
/// Q6_K: `d`, four words of scales, 32 of `ql`, 16 of `qh`.
pub(crate) static Q6_K_LAYOUT: Layout = Layout {
    bytes: Q6_K_BYTES,
    spans: &spans::<53>(&[(0, 208)], &[(32, 192, 4), (288, 0, 32), (2336, 128, 16)]),
};

/// Rows of `row_bytes` (whole blocks of `layout`; the caller checked),
/// whole groups of 16 (the rows after the last real one zeros), packed in
/// place: each group on its own (its packed bytes are its rows' bytes, in
/// another order), among rayon's threads, a group's copy at a time beside
/// the matrix.
pub(crate) fn pack_in_place(layout: &Layout, w: &mut [u8], row_bytes: usize) {
    let (group_bytes, bytes) = (GROUP * row_bytes, layout.bytes);
    if group_bytes == 0 {
        return;
    }
    w.par_chunks_mut(group_bytes).for_each(|o| {
        let w = o.to_vec();
        for (r, row) in w.chunks_exact(row_bytes).enumerate() {
            for (o, b) in o
                .chunks_exact_mut(GROUP * bytes)
                .zip(row.chunks_exact(bytes))
            {
                for &Span { at, from, len } in layout.spans {
                    o[at + len * r..at + len * (r + 1)].copy_from_slice(&b[from..from + len]);
                }
            }
        }
    });
}

/// Row `r` of packed rows `p` (of `row_bytes` each, whole groups; the
/// caller checked), as it was before [`pack_in_place`].
pub(crate) fn unpack_row(layout: &Layout, p: &[u8], row_bytes: usize, r: usize) -> Vec<u8> {
    let mut row = vec![0u8; row_bytes];
    let (bytes, rr) = (layout.bytes, r % GROUP);
    let group = &p[r / GROUP * GROUP * row_bytes..][..GROUP * row_bytes];
    for (b, o) in row
        .chunks_exact_mut(bytes)
        .zip(group.chunks_exact(GROUP * bytes))
    {
        for &Span { at, from, len } in layout.spans {
            b[from..from + len].copy_from_slice(&o[at + len * rr..at + len * (rr + 1)]);
        }
    }
    row
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
