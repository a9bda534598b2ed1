//! The 32-value types' portable kernels, and the activations they take.
//!
//! The activations are quantized 32 at a time as ggml's Q8_0 quantizes
//! them (`quantize_activations_k`'s codes, the scale stored through f16 as
//! ggml stores it), token after token: the codes, the scale of each 32, and
//! the sum of each 4 codes (for the types with a minimum). With the scale
//! kept in f32, SmolLM2's batched prefill was further from its
//! token-by-token prefill (Pearson 0.99852, 6.4 % of the largest logit,
//! against 0.99916 and 4.1 % through f16).
//!
//! A row's blocks of Q4_1, Q5_0, Q5_1 and Q8_0 are summed in one fixed
//! order, whatever the vector width of the kernel that runs it (`avx2.rs`:
//! two registers of 8 lanes; `avx512q.rs`: one of 16; Q4_0 has its own,
//! `packed.rs`):
//!
//! - **16 lanes**, block `b`'s in lanes `8 (b mod 2) + k`: lane `k` of a
//!   block is the exact integer sum of the products of its values `4k ..
//!   4k + 4` (codes less 16 for Q5_0, Q8_0's signed, the
//!   others' unsigned), and `acc = fma(d_w·d_a, lane, acc)`, block after
//!   block.
//! - **16 lanes of the minimums** (Q4_1, Q5_1), in the same places:
//!   `accm = fma(m_w·d_a, s, accm)`, `s` the sum of the lane's 4 codes.
//! - **The row**: each 16 folded in halves (`l + 8`, `+ 4`, `+ 2`, `+ 1`),
//!   the minimums' added.
//!
//! The integers are exact, the f32 steps are the same lane by lane in every
//! kernel, and nothing is summed across lanes until the row's end: every
//! kernel gives this one's bits. (candle 0.11's kernels, which these
//! replaced, rounded the minimum's sum through f16 and summed each block
//! across its lanes.)

use gkq_format::quant::{QK, unhalf, unpack4, unpack5};
use half::f16;

use crate::kquant::{fold16, quantize32};

/// Activations quantized for the 32-value types, token after token.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Q8Acts {
    qs: Vec<i8>,
    d: Vec<f32>,
    d8: Vec<f32>,
    sums: Vec<f32>,
    bsums: Vec<i32>,
}

/// One token's activations of [`Q8Acts`] (`Q8Acts::token`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Q8Token<'a> {
    /// The codes, in [-127, 127].
    pub(crate) qs: &'a [i8],
    /// The scale of each 32 (through f16): `qs · d` approximates the
    /// values.
    pub(crate) d: &'a [f32],
    /// Each scale eight times (the AVX-512 kernels' lanes).
    pub(crate) d8: &'a [f32],
    /// The sum of each 4 codes.
    pub(crate) sums: &'a [f32],
    /// The sum of each 32 codes.
    pub(crate) bsums: &'a [i32],
}

impl Q8Acts {
    /// Token `t`'s activations, with `blocks` blocks of 32 a token.
    pub fn token(&self, t: usize, blocks: usize) -> Q8Token<'_> {
        let at = |v: usize| t * blocks * v..(t + 1) * blocks * v;
        Q8Token {
            qs: &self.qs[at(QK)],
            d: &self.d[at(1)],
            d8: &self.d8[at(8)],
            sums: &self.sums[at(QK / 4)],
            bsums: &self.bsums[at(1)],
        }
    }

    /// Blocks of 32 over all the tokens.
    pub fn blocks(&self) -> usize {
        self.d.len()
    }
}

impl Q8Token<'_> {
    /// Its blocks of 32.
    pub fn blocks(&self) -> usize {
        self.d.len()
    }
}

/// Quantizes `x` (whole blocks of 32) to `out` (cleared first): each 32 as
/// ggml's Q8_0 (`d = max |x| / 127`, codes rounded to nearest, ties to
/// even, `d` stored through f16). `false` when `x` is not whole blocks.
pub fn quantize_activations(x: &[f32], out: &mut Q8Acts) -> bool {
    out.qs.clear();
    out.d.clear();
    out.d8.clear();
    out.sums.clear();
    out.bsums.clear();
    if !x.len().is_multiple_of(QK) {
        return false;
    }
    out.qs.resize(x.len(), 0);
    out.d.reserve(x.len() / QK);
    for (c, q) in x.chunks_exact(QK).zip(out.qs.chunks_exact_mut(QK)) {
        // the scale through f16, as ggml's Q8_0 stores it
        out.d.push(f16::from_f32(quantize32(c, q)).to_f32());
    }
    out.d8.extend(out.d.iter().flat_map(|&d| [d; 8]));
    let four = out.qs.chunks_exact(4);
    out.sums
        .extend(four.map(|q| q.iter().map(|&q| f32::from(q)).sum::<f32>()));
    let each = out.qs.chunks_exact(QK);
    out.bsums
        .extend(each.map(|q| q.iter().map(|&q| i32::from(q)).sum::<i32>()));
    true
}

/// A block's scale, minimum (for the types with one) and codes.
type Split = fn(&[u8]) -> (f32, f32, [i32; QK]);

/// `w · a` in the order the module gives, a block's `(d, m, codes)` from
/// `split`, `min` whether the type has a minimum.
fn portable(w: &[u8], a: Q8Token<'_>, bytes: usize, min: bool, split: Split) -> f32 {
    let (mut acc, mut accm) = ([0f32; 16], [0f32; 16]);
    for (i, b) in w.chunks_exact(bytes).enumerate() {
        let (d, m, q) = split(b);
        let (h, da) = (8 * (i % 2), a.d[i]);
        let qa = &a.qs[QK * i..QK * (i + 1)];
        for k in 0..8 {
            let lane: i32 = (4 * k..4 * k + 4).map(|j| q[j] * i32::from(qa[j])).sum();
            acc[h + k] = (d * da).mul_add(lane as f32, acc[h + k]);
            if min {
                accm[h + k] = (m * da).mul_add(a.sums[8 * i + k], accm[h + k]);
            }
        }
    }
    if min {
        fold16(acc) + fold16(accm)
    } else {
        fold16(acc)
    }
}

fn codes(q: [u8; QK], offset: i32) -> [i32; QK] {
    q.map(|v| i32::from(v) - offset)
}

/// Q4_0's own order (`packed.rs`): each block's exact sum, then one FMA
/// per block into one accumulator.
pub(crate) fn dot_q4_0(w: &[u8], a: Q8Token<'_>) -> f32 {
    let mut acc = 0f32;
    for (i, b) in w.chunks_exact(18).enumerate() {
        let qa = &a.qs[QK * i..QK * (i + 1)];
        let q = unpack4(&b[2..18]);
        let s: i32 = q
            .iter()
            .zip(qa)
            .map(|(&q, &x)| i32::from(q) * i32::from(x))
            .sum();
        let s = s - 8 * a.bsums[i];
        acc = (unhalf([b[0], b[1]]) * a.d[i]).mul_add(s as f32, acc);
    }
    acc
}

pub(crate) fn dot_q4_1(w: &[u8], a: Q8Token<'_>) -> f32 {
    portable(w, a, 20, true, |b| {
        let q = codes(unpack4(&b[4..20]), 0);
        (unhalf([b[0], b[1]]), unhalf([b[2], b[3]]), q)
    })
}

pub(crate) fn dot_q5_0(w: &[u8], a: Q8Token<'_>) -> f32 {
    portable(w, a, 22, false, |b| {
        let q = codes(unpack5(&b[2..6], &b[6..22]), 16);
        (unhalf([b[0], b[1]]), 0.0, q)
    })
}

pub(crate) fn dot_q5_1(w: &[u8], a: Q8Token<'_>) -> f32 {
    portable(w, a, 24, true, |b| {
        let q = codes(unpack5(&b[4..8], &b[8..24]), 0);
        (unhalf([b[0], b[1]]), unhalf([b[2], b[3]]), q)
    })
}

pub(crate) fn dot_q8_0(w: &[u8], a: Q8Token<'_>) -> f32 {
    portable(w, a, 34, false, |b| {
        let mut q = [0i32; QK];
        for (o, &v) in q.iter_mut().zip(&b[2..34]) {
            *o = i32::from(v as i8);
        }
        (unhalf([b[0], b[1]]), 0.0, q)
    })
}
