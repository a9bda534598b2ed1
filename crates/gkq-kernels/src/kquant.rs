//! The K types' portable kernels, and the activations they take: 256
//! activations with a scale per 32 (the 32-value types' precision), with
//! the sums of each 16 and 32 codes. ggml's Q8_K has one scale per 256:
//! with it, Gemma 3's first logits were 5.5 % of the largest logit from the
//! f64 reference (candle's kernels, the same Q8_K: 4.1 %; the test's
//! line: 5 %); with a scale per 32, 3.0 % (Pearson 0.99936).
//!
//! Each K type sums a row in an order of its own, the one its packed
//! kernels share (`packed.rs`).

use gkq_format::quant::{QK, QK_K, unhalf};

/// 256 activations quantized to 8 bits, a scale per 32.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct Q8KBlock {
    /// The scale of each 32: `qs · d` approximates the values.
    pub d: [f32; 8],
    /// The codes, in [-127, 127].
    pub qs: [i8; QK_K],
    /// The sums of each 16 codes.
    pub bsums: [i16; 16],
    /// The sums of each 32 codes.
    pub psums: [i16; 8],
}

impl Default for Q8KBlock {
    fn default() -> Q8KBlock {
        Q8KBlock {
            d: [0.0; 8],
            qs: [0; QK_K],
            bsums: [0; 16],
            psums: [0; 8],
        }
    }
}

/// Quantizes `x` (whole blocks of 256) to `out` (cleared first): each 32
/// as ggml's Q8_0 (`d = max |x| / 127`, kept in f32, codes rounded to
/// nearest, ties to even). `false` when `x` is not whole blocks.
pub fn quantize_activations_k(x: &[f32], out: &mut Vec<Q8KBlock>) -> bool {
    out.clear();
    if !x.len().is_multiple_of(QK_K) {
        return false;
    }
    out.reserve(x.len() / QK_K);
    for c in x.chunks_exact(QK_K) {
        let mut b = Q8KBlock::default();
        for (j, c) in c.chunks_exact(QK).enumerate() {
            b.d[j] = quantize32(c, &mut b.qs[QK * j..QK * (j + 1)]);
        }
        for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = q.iter().map(|&q| i16::from(q)).sum();
        }
        for (p, s) in b.psums.iter_mut().zip(b.bsums.chunks_exact(2)) {
            *p = s[0] + s[1];
        }
        out.push(b);
    }
    true
}

/// 32 values `c` to codes `q` as ggml's Q8_0 (`d = max |x| / 127`, kept
/// in f32, rounded to nearest, ties to even); returns `d`.
pub(crate) fn quantize32(c: &[f32], q: &mut [i8]) -> f32 {
    let amax = c.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (o, &v) in q.iter_mut().zip(c) {
        *o = nearest(v * id).clamp(-127, 127) as i8;
    }
    d
}

/// `x` rounded to the nearest integer, ties to even, for |x| ≤ 2^22
/// (ggml's `nearest_int`: the f32 add rounds, with no call to `rintf`).
#[inline(always)]
pub(crate) fn nearest(x: f32) -> i32 {
    let f = x + 12_582_912.0;
    (f.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Bytes of a Q4_K block, and of a Q6_K block.
pub(crate) const Q4_K_BYTES: usize = 144;
pub(crate) const Q6_K_BYTES: usize = 210;

/// The eight 6-bit scales and minimums of a Q4_K block's 12 scale bytes
/// (ggml's `get_scale_min_k4`, four at a time as its kernels take them).
#[inline(always)]
pub(crate) fn scales_mins(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let w = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (w0, w1, w2) = (w(0), w(1), w(2));
    let (six, four, two) = (0x3f3f_3f3f, 0x0f0f_0f0f, 0x0303_0303);
    let sc_hi = (w2 & four) | (((w0 >> 6) & two) << 4);
    let m_hi = ((w2 >> 4) & four) | (((w1 >> 6) & two) << 4);
    let join = |lo: u32, hi: u32| (u64::from(lo) | u64::from(hi) << 32).to_le_bytes();
    (join(w0 & six, sc_hi), join(w1 & six, m_hi))
}

/// 16 lanes folded in halves (`l + 8`, `+ 4`, `+ 2`, `+ 1`).
pub(crate) fn fold16(acc: [f32; 16]) -> f32 {
    let mut a = acc;
    for half in [8, 4, 2, 1] {
        for l in 0..half {
            a[l] += a[l + half];
        }
    }
    a[0]
}

/// Q4_K's own order (`packed.rs`): each sub-block's exact sum, then two
/// FMAs per sub-block into one accumulator.
pub(crate) fn dot_q4_k(w: &[u8], a: &[Q8KBlock]) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(Q4_K_BYTES).zip(a) {
        let (sc, m) = scales_mins(&b[4..16]);
        let (d, dmin) = (unhalf([b[0], b[1]]), unhalf([b[2], b[3]]));
        for j in 0..8 {
            let q = &b[16 + 32 * (j / 2)..16 + 32 * (j / 2 + 1)];
            let code = |v: u8| i32::from(if j % 2 == 0 { v & 0xF } else { v >> 4 });
            let qa = &y.qs[QK * j..QK * (j + 1)];
            let s: i32 = q
                .iter()
                .zip(qa)
                .map(|(&v, &x)| code(v) * i32::from(x))
                .sum();
            let da = y.d[j];
            acc = (d * f32::from(sc[j]) * da).mul_add(s as f32, acc);
            acc = (-(dmin * f32::from(m[j]) * da)).mul_add(f32::from(y.psums[j]), acc);
        }
    }
    acc
}

/// The 256 codes of a Q6_K block, less 32, in value order.
fn q6_k_codes(b: &[u8]) -> [i32; QK_K] {
    let mut q = [0i32; QK_K];
    for n in 0..2 {
        let (ql, qh) = (&b[64 * n..64 * n + 64], &b[128 + 32 * n..160 + 32 * n]);
        for l in 0..32 {
            let v = |low: u8, shift: u8| i32::from(low | ((qh[l] >> shift) & 3) << 4) - 32;
            q[128 * n + l] = v(ql[l] & 0xF, 0);
            q[128 * n + l + 32] = v(ql[l + 32] & 0xF, 2);
            q[128 * n + l + 64] = v(ql[l] >> 4, 4);
            q[128 * n + l + 96] = v(ql[l + 32] >> 4, 6);
        }
    }
    q
}

/// Q6_K's own order (`packed.rs`): per 32 values, each 16's exact sum
/// times its scale, in integers, then one FMA into one accumulator.
pub(crate) fn dot_q6_k(w: &[u8], a: &[Q8KBlock]) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(Q6_K_BYTES).zip(a) {
        let q = q6_k_codes(b);
        let d = unhalf([b[208], b[209]]);
        for j in 0..8 {
            let t: i32 = (2 * j..2 * j + 2)
                .map(|s| {
                    let at = 16 * s..16 * s + 16;
                    let p: i32 = q[at.clone()]
                        .iter()
                        .zip(&y.qs[at])
                        .map(|(&q, &x)| q * i32::from(x))
                        .sum();
                    i32::from(b[192 + s] as i8) * p
                })
                .sum();
            acc = (d * y.d[j]).mul_add(t as f32, acc);
        }
    }
    acc
}
