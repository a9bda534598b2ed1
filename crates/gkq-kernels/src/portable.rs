//! The portable kernels, and the activations they take: the activations
//! quantized to 8-bit blocks of 32 (ggml's Q8_0 values and scale, with
//! Q8_1's scaled sum for the types with a minimum), then each block of a
//! row contributes `d_w · d_a · Σ q_w q_a (+ m_w · s_a)`, the sum exact in
//! integers (ggml's `ggml_vec_dot_*_q8_0`, `*_q8_1`).

use gkq_format::quant::{QK, round_i8, unhalf, unpack4, unpack5};
use half::f16;

/// 32 activations quantized as ggml's Q8_1: `qs · d` approximates them,
/// `s` is `d · Σ qs` (both through f16, as ggml stores them; `s` rounded
/// as candle 0.11 does, `f16(f16(Σ qs) · d)`, where ggml rounds
/// `f16(Σ qs · d)`: the tokens stay those of the candle kernels).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct Q8Block {
    /// The scale (`max |x| / 127`, through f16).
    pub d: f32,
    /// `d · Σ qs` (through f16), for the types with a minimum.
    pub s: f32,
    /// The values, `round(x / d)`.
    pub qs: [i8; QK],
}

/// Quantizes `x` (whole blocks of 32) to `out` (cleared first), as ggml's
/// `quantize_row_q8_1_ref` (with candle's `s`). `false` when `x` is not
/// whole blocks.
pub fn quantize_activations(x: &[f32], out: &mut Vec<Q8Block>) -> bool {
    out.clear();
    if !x.len().is_multiple_of(QK) {
        return false;
    }
    out.reserve(x.len() / QK);
    for c in x.chunks_exact(QK) {
        let amax = c.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut b = Q8Block::default();
        let mut sum = 0i32;
        for (o, &v) in b.qs.iter_mut().zip(c) {
            *o = round_i8(v * id);
            sum += i32::from(*o);
        }
        let d16 = f16::from_f32(d);
        b.d = d16.to_f32();
        b.s = (f16::from_f32(sum as f32) * d16).to_f32();
        out.push(b);
    }
    true
}

/// A block's scale, minimum (for the types with one) and codes.
type Split = fn(&[u8]) -> (f32, Option<f32>, [i32; QK]);

/// `Σ d_w d_a Σ q_w q_a + m_w s_a` over the blocks, with a block's
/// `(d, m, codes)` from `split`, in candle 0.11's scalar order (its
/// `vec_dot_unopt`): `sum += Σ·d_w·d_a (+ m_w·s_a)`.
fn portable(w: &[u8], a: &[Q8Block], bytes: usize, split: Split) -> f32 {
    let mut sum = 0f32;
    for (b, y) in w.chunks_exact(bytes).zip(a) {
        let (d, m, q) = split(b);
        let dot: i32 = q.iter().zip(&y.qs).map(|(&q, &v)| q * i32::from(v)).sum();
        let v = dot as f32 * d * y.d;
        sum += match m {
            Some(m) => v + m * y.s,
            None => v,
        };
    }
    sum
}

fn codes(q: [u8; QK], offset: i32) -> [i32; QK] {
    q.map(|v| i32::from(v) - offset)
}

pub(crate) fn dot_q4_0(w: &[u8], a: &[Q8Block]) -> f32 {
    portable(w, a, 18, |b| {
        (unhalf([b[0], b[1]]), None, codes(unpack4(&b[2..18]), 8))
    })
}

pub(crate) fn dot_q4_1(w: &[u8], a: &[Q8Block]) -> f32 {
    portable(w, a, 20, |b| {
        (
            unhalf([b[0], b[1]]),
            Some(unhalf([b[2], b[3]])),
            codes(unpack4(&b[4..20]), 0),
        )
    })
}

pub(crate) fn dot_q5_0(w: &[u8], a: &[Q8Block]) -> f32 {
    portable(w, a, 22, |b| {
        (
            unhalf([b[0], b[1]]),
            None,
            codes(unpack5(&b[2..6], &b[6..22]), 16),
        )
    })
}

pub(crate) fn dot_q5_1(w: &[u8], a: &[Q8Block]) -> f32 {
    portable(w, a, 24, |b| {
        let q = codes(unpack5(&b[4..8], &b[8..24]), 0);
        (unhalf([b[0], b[1]]), Some(unhalf([b[2], b[3]])), q)
    })
}

pub(crate) fn dot_q8_0(w: &[u8], a: &[Q8Block]) -> f32 {
    portable(w, a, 34, |b| {
        let mut q = [0i32; QK];
        for (o, &v) in q.iter_mut().zip(&b[2..34]) {
            *o = i32::from(v as i8);
        }
        (unhalf([b[0], b[1]]), None, q)
    })
}
