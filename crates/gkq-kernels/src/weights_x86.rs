//! AVX2 forms of the reference quantizers of the 32-value types (`weights.rs`):
//! a block's 32 values in four registers, each step the reference's own
//! f32 operation, so the bytes and the dequantized values are its bits.
//!
//! - The largest magnitude by `max` with the new value first, so that a
//!   NaN is never taken (the reference's `if |v| > m`), then the first
//!   value that has it (or +0 when it is 0), and the scale from it in
//!   scalar code, as the reference computes it.
//! - Q4_1's and Q5_1's smallest and largest values by `min` and `max` the
//!   same way, then the first value equal to each (the lanes may hold a
//!   zero of the other sign).
//! - Q4_0's code `min(trunc(v · id + 8.5), 15)` saturating, NaN to 0 (and
//!   the others' alike): the sum clamped to `[0, 15]` by `max` then `min`
//!   (a NaN gives the 0), then truncated.
//! - Q8_0's code, rounded half away from zero: the product clamped to
//!   ±256 (a NaN made 0 first), truncated, then one up or down by the
//!   remainder, clamped to the int8's range. A block with a NaN value is
//!   left to the reference (its maximum then depends on the order).
//!
//! Unsafe code: loads and stores of 8 values, 16 or 32 bytes from slices
//! indexed to that length first, and calls of these functions once the CPU
//! is known to have AVX2, FMA and F16C.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use gkq_format::DType;
use gkq_format::quant;

/// The AVX2 quantizer of `dtype`, if it has one; only once
/// [`crate::avx2::available`] said yes.
pub(crate) fn block(dtype: DType) -> Option<crate::Quantizer> {
    // SAFETY (each call): handed out only when the CPU has the features
    match dtype {
        DType::Q4_0 => Some(|x, b, y| unsafe { symmetric::<4>(x, b, y) }),
        DType::Q5_0 => Some(|x, b, y| unsafe { symmetric::<5>(x, b, y) }),
        DType::Q4_1 => Some(|x, b, y| unsafe { asymmetric::<4>(x, b, y) }),
        DType::Q5_1 => Some(|x, b, y| unsafe { asymmetric::<5>(x, b, y) }),
        DType::Q8_0 => Some(|x, b, y| unsafe { q8_0(x, b, y) }),
        _ => None,
    }
}

/// A block's 32 values (`x` indexed to them first).
#[target_feature(enable = "avx2,fma,f16c")]
fn load(x: &[f32]) -> [__m256; 4] {
    let p = x[..32].as_ptr();
    // SAFETY: 32 values; the loads are unaligned
    unsafe {
        [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ]
    }
}

/// A block's 32 dequantized values: `q` as f32 times `d`, plus `m` if
/// given (the product rounded first, as the reference's `d · q + m`),
/// into `y`.
#[target_feature(enable = "avx2,fma,f16c")]
fn store_values(q: [__m256i; 4], d: f32, m: Option<f32>, y: &mut [f32]) {
    let (y, d) = (&mut y[..32], _mm256_set1_ps(d));
    for (i, q) in q.into_iter().enumerate() {
        let v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
        let v = m.map_or(v, |m| _mm256_add_ps(v, _mm256_set1_ps(m)));
        // SAFETY: 8 values from `8 · i` of `y`'s 32; the store is unaligned
        unsafe { _mm256_storeu_ps(y.as_mut_ptr().add(8 * i), v) };
    }
}

/// The values' magnitudes and the largest of them, NaN left out (0 for
/// none).
#[target_feature(enable = "avx2,fma,f16c")]
fn magnitudes(v: &[__m256; 4]) -> ([__m256; 4], f32) {
    let sign = _mm256_set1_ps(-0.0);
    let (mut a, mut m) = ([_mm256_setzero_ps(); 4], _mm256_setzero_ps());
    for (a, &v) in a.iter_mut().zip(v) {
        *a = _mm256_andnot_ps(sign, v);
        m = _mm256_max_ps(*a, m);
    }
    (a, fold(m, true))
}

/// The largest (`max`) or smallest of eight lanes without NaN.
#[target_feature(enable = "avx2,fma,f16c")]
fn fold(v: __m256, max: bool) -> f32 {
    let pick = if max { _mm_max_ps } else { _mm_min_ps };
    let h = pick(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let h = pick(h, _mm_movehl_ps(h, h));
    _mm_cvtss_f32(pick(h, _mm_movehdup_ps(h)))
}

/// The first value of `x` whose lane of `a` (`x` itself, or its
/// magnitudes) equals `m`, if one does.
#[target_feature(enable = "avx2,fma,f16c")]
fn first_equal(x: &[f32], a: &[__m256; 4], m: f32) -> Option<f32> {
    let m = _mm256_set1_ps(m);
    let mut bits = 0u32;
    for (i, &a) in a.iter().enumerate() {
        let eq = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(a, m)) as u32;
        bits |= eq << (8 * i);
    }
    x.get(bits.trailing_zeros() as usize).copied()
}

/// The scale `d` as its f16 bytes in `b[..2]` (to nearest, ties to even,
/// as the reference's `half` rounds), and the f16 as f32.
#[target_feature(enable = "avx2,fma,f16c")]
fn put_scale(d: f32, b: &mut [u8]) -> f32 {
    let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d));
    let bits = _mm_extract_epi16::<0>(h) as u16;
    b[..2].copy_from_slice(&bits.to_le_bytes());
    _mm_cvtss_f32(_mm_cvtph_ps(h))
}

/// The reference's `1 / d`, 0 for a zero scale.
fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// Bytes of two nibbles in 32-bit lanes: `l`'s low four bits, `h`'s as
/// the high ones.
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(l: __m256i, h: __m256i) -> __m256i {
    let l = _mm256_and_si256(l, _mm256_set1_epi32(0x0f));
    let h = _mm256_and_si256(_mm256_slli_epi32::<4>(h), _mm256_set1_epi32(0xf0));
    _mm256_or_si256(l, h)
}

/// Q4_0 (`BITS` 4) and Q5_0 (5): with `c = 2^(BITS − 1)`, `d = max / −c`
/// from the first value of largest magnitude, codes
/// `min(trunc(v · id + c + 0.5), 2c − 1)`, dequantized `d · (q − c)`.
#[target_feature(enable = "avx2,fma,f16c")]
fn symmetric<const BITS: u32>(x: &[f32], b: &mut [u8], y: &mut [f32]) {
    let c = (1 << (BITS - 1)) as f32;
    let v = load(x);
    let (a, amax) = magnitudes(&v);
    let max = if amax == 0.0 {
        0.0
    } else {
        first_equal(x, &a, amax).unwrap_or(0.0)
    };
    let d = max / -c;
    let (id, d16) = (_mm256_set1_ps(inverse(d)), put_scale(d, b));
    let mut q = codes::<BITS>(&v, id, _mm256_set1_ps(c + 0.5));
    put_codes::<BITS>(&q, &mut b[2..]);
    let centre = _mm256_set1_epi32(c as i32);
    for q in &mut q {
        *q = _mm256_sub_epi32(*q, centre);
    }
    store_values(q, d16, None, y);
}

/// Q4_1 (`BITS` 4) and Q5_1 (5): with `top = 2^BITS − 1`, the first
/// smallest and the first largest value (NaN left out), `d = (max − min) /
/// top`, codes `min(trunc((v − min) · id + 0.5), top)`, dequantized
/// `d · q + m` (`d` and `m = min` as f16).
#[target_feature(enable = "avx2,fma,f16c")]
fn asymmetric<const BITS: u32>(x: &[f32], b: &mut [u8], y: &mut [f32]) {
    let top = ((1 << BITS) - 1) as f32;
    let v = load(x);
    let (mut lo, mut hi) = (_mm256_set1_ps(f32::MAX), _mm256_set1_ps(-f32::MAX));
    for &v in &v {
        // the new value first: a NaN is never taken (`if v < min`)
        lo = _mm256_min_ps(v, lo);
        hi = _mm256_max_ps(v, hi);
    }
    // the lanes' extremes equal the loop's but for the sign of a zero:
    // the loop keeps the first value equal to its extreme
    let min = first_equal(x, &v, fold(lo, false)).unwrap_or(f32::MAX);
    let max = first_equal(x, &v, fold(hi, true)).unwrap_or(-f32::MAX);
    let d = (max - min) / top;
    let id = _mm256_set1_ps(inverse(d));
    let (d16, m16) = (put_scale(d, b), put_scale(min, &mut b[2..]));
    let mut shifted = v;
    for v in &mut shifted {
        *v = _mm256_sub_ps(*v, _mm256_set1_ps(min));
    }
    let q = codes::<BITS>(&shifted, id, _mm256_set1_ps(0.5));
    put_codes::<BITS>(&q, &mut b[4..]);
    store_values(q, d16, Some(m16), y);
}

/// The codes `min(trunc(max(v · id + shift, 0)), 2^BITS − 1)`, a NaN 0.
#[target_feature(enable = "avx2,fma,f16c")]
fn codes<const BITS: u32>(v: &[__m256; 4], id: __m256, shift: __m256) -> [__m256i; 4] {
    let zero = _mm256_setzero_ps();
    let top = _mm256_set1_ps(((1 << BITS) - 1) as f32);
    let mut q = [_mm256_setzero_si256(); 4];
    for (q, &v) in q.iter_mut().zip(v) {
        let t = _mm256_add_ps(_mm256_mul_ps(v, id), shift);
        *q = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(t, zero), top));
    }
    q
}

/// The codes into `b`: for 5 bits first the fifth bits (value `j`'s in bit
/// `j`), then value `j`'s low four bits in the low nibble of byte `j` and
/// value `j + 16`'s in its high one.
#[target_feature(enable = "avx2,fma,f16c")]
fn put_codes<const BITS: u32>(q: &[__m256i; 4], b: &mut [u8]) {
    let mut at = 0;
    if BITS == 5 {
        let mut qh = 0u32;
        for (i, &q) in q.iter().enumerate() {
            let fifth = _mm256_castsi256_ps(_mm256_slli_epi32::<27>(q));
            qh |= (_mm256_movemask_ps(fifth) as u32) << (8 * i);
        }
        b[..4].copy_from_slice(&qh.to_le_bytes());
        at = 4;
    }
    let (lo, hi) = (nibbles(q[0], q[2]), nibbles(q[1], q[3]));
    // 16-bit lanes lo 0-3, hi 0-3, lo 4-7, hi 4-7; then lo 0-7, hi 0-7
    let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(lo, hi));
    let bytes = _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p));
    let out = &mut b[at..at + 16];
    // SAFETY: 16 bytes; the store is unaligned
    unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), bytes) };
}

/// Q8_0: `d = amax / 127`, codes `round(v · id)` half away from zero,
/// saturating to the int8's range, NaN to 0.
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0(x: &[f32], b: &mut [u8], y: &mut [f32]) {
    let v = load(x);
    let mut nan = 0;
    for &v in &v {
        nan |= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    }
    if nan != 0 {
        return reference(DType::Q8_0, x, b, y);
    }
    let (_, amax) = magnitudes(&v);
    let d = amax / 127.0;
    let (id, d16) = (_mm256_set1_ps(inverse(d)), put_scale(d, b));
    let (lo, hi) = (_mm256_set1_ps(-256.0), _mm256_set1_ps(256.0));
    let (up, down) = (_mm256_set1_ps(0.5), _mm256_set1_ps(-0.5));
    let mut q = [_mm256_setzero_si256(); 4];
    for (q, &v) in q.iter_mut().zip(&v) {
        let p = _mm256_mul_ps(v, id);
        let p = _mm256_and_ps(p, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
        let p = _mm256_min_ps(_mm256_max_ps(p, lo), hi);
        let t = _mm256_cvttps_epi32(p);
        let r = _mm256_sub_ps(p, _mm256_cvtepi32_ps(t));
        // a true comparison is -1: subtracting it adds one
        let plus = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(r, up));
        let minus = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(r, down));
        let t = _mm256_add_epi32(_mm256_sub_epi32(t, plus), minus);
        *q = _mm256_min_epi32(
            _mm256_max_epi32(t, _mm256_set1_epi32(-128)),
            _mm256_set1_epi32(127),
        );
    }
    // ggml's order: 32-bit lanes 0, 4, 1, 5, 2, 6, 3, 7 after the packs
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let out = &mut b[2..34];
    // SAFETY: 32 bytes; the store is unaligned
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), p) };
    store_values(q, d16, None, y);
}

/// `Differences::add` with AVX2 into its lanes' `sum` and `max`, once the
/// CPU is known to have it: each lane's `|f64(x) − f64(y)|`, its square
/// added (no FMA) and the maximum taken (`d > m ? d : m`) as the portable
/// loop does, four lanes a register.
pub(crate) fn add_differences(
    sum: &mut [f64; 8],
    max: &mut [f64; 8],
    x: &[f32],
    y: &[f32],
) -> bool {
    // SAFETY: called only once `avx2::available` said yes
    unsafe { differences(sum, max, x, y) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn differences(to_sum: &mut [f64; 8], to_max: &mut [f64; 8], x: &[f32], y: &[f32]) -> bool {
    let (sign, inf) = (_mm256_set1_ps(-0.0), _mm256_set1_ps(f32::INFINITY));
    let mut finite = -1;
    for (x, y) in x.chunks_exact(8).zip(y.chunks_exact(8)) {
        let (a, b) = (load8(x), load8(y));
        let ok = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_andnot_ps(sign, a), inf),
            _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_andnot_ps(sign, b), inf),
        );
        finite &= _mm256_movemask_ps(ok) | !0xff;
    }
    if finite != -1 {
        return false;
    }
    let signd = _mm256_set1_pd(-0.0);
    // SAFETY: 4 lanes of 8 f64 each, unaligned
    let lanes = |v: &[f64; 8]| unsafe {
        [
            _mm256_loadu_pd(v.as_ptr()),
            _mm256_loadu_pd(v.as_ptr().add(4)),
        ]
    };
    let (mut sum, mut max) = (lanes(to_sum), lanes(to_max));
    for (x, y) in x.chunks_exact(8).zip(y.chunks_exact(8)) {
        let (a, b) = (load8(x), load8(y));
        let halves = [
            (_mm256_castps256_ps128(a), _mm256_castps256_ps128(b)),
            (_mm256_extractf128_ps::<1>(a), _mm256_extractf128_ps::<1>(b)),
        ];
        for (k, (a, b)) in halves.into_iter().enumerate() {
            let d = _mm256_sub_pd(_mm256_cvtps_pd(a), _mm256_cvtps_pd(b));
            let d = _mm256_andnot_pd(signd, d);
            sum[k] = _mm256_add_pd(sum[k], _mm256_mul_pd(d, d));
            max[k] = _mm256_max_pd(d, max[k]);
        }
    }
    for (to, v) in [(to_sum, sum), (to_max, max)] {
        // SAFETY: 8 f64 in two stores of 4, unaligned
        unsafe {
            _mm256_storeu_pd(to.as_mut_ptr(), v[0]);
            _mm256_storeu_pd(to.as_mut_ptr().add(4), v[1]);
        }
    }
    true
}

/// 8 values of `x` (indexed to them first).
#[target_feature(enable = "avx2,fma,f16c")]
fn load8(x: &[f32]) -> __m256 {
    let x = &x[..8];
    // SAFETY: 8 values; the load is unaligned
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

/// One block through the reference (a Q8_0 block with a NaN): its bytes
/// and its dequantized values.
fn reference(dtype: DType, x: &[f32], b: &mut [u8], y: &mut [f32]) {
    let mut bytes = Vec::with_capacity(b.len());
    let whole = quant::quantize(x, dtype, &mut bytes);
    debug_assert!(whole, "a whole block");
    b.copy_from_slice(&bytes);
    let mut values = Vec::with_capacity(y.len());
    quant::dequantize(b, dtype, &mut values);
    y.copy_from_slice(&values);
}
