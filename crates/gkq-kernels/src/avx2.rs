//! AVX2 forms of `dot.rs`'s kernels, as ggml's `ggml_vec_dot_*` for AVX2
//! (and candle's `avx.rs`): a block's codes unpacked to 32 bytes, their
//! products with the activations summed in pairs by `maddubs`, then `madd`
//! to eight i32, scaled in f32 and accumulated with FMA.
//!
//! The unsafe code of the crate: loads of 16 or 32 bytes from slices that
//! are indexed to that length first, and calls of these functions once the
//! CPU is known to have AVX2, FMA and F16C.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::types::{Codes, Ty};
use crate::{Dot, Dot4, Q8Block};

/// Whether this CPU has AVX2, FMA and F16C: the kernels below may run.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// The one-token and four-token kernels of type `T`, callable once
/// [`available`] said yes (the only caller, `RowDot::of`, asks first).
pub(crate) const fn kernels<T: Ty>() -> (Dot, Dot4) {
    // SAFETY (each call): `RowDot::of` hands these out only when
    // `available()`: the CPU has AVX2, FMA and F16C
    (
        |w, a| unsafe { dot::<T>(w, a) },
        |w, a| unsafe { dot4::<T>(w, a) },
    )
}

/// 32 bytes of `b` (which is indexed to them first).
#[target_feature(enable = "avx2,fma,f16c")]
fn load32(b: &[u8]) -> __m256i {
    let b = &b[..32];
    // SAFETY: `b` has 32 bytes; the load is unaligned
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// The 32 activations of `y`.
#[target_feature(enable = "avx2,fma,f16c")]
fn acts(y: &Q8Block) -> __m256i {
    // SAFETY: `qs` is 32 bytes; the load is unaligned
    unsafe { _mm256_loadu_si256(y.qs.as_ptr().cast()) }
}

/// 16 packed bytes as 32 nibbles: the low ones first, then the high.
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(qs: &[u8]) -> __m256i {
    let qs = &qs[..16];
    // SAFETY: `qs` has 16 bytes; the load is unaligned
    let lo = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
    let both = _mm256_insertf128_si256::<1>(_mm256_castsi128_si256(lo), _mm_srli_epi16(lo, 4));
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// The 32 bits of `qh` as bytes: 0xFF where the bit is set.
#[target_feature(enable = "avx2,fma,f16c")]
fn bits(qh: &[u8]) -> __m256i {
    let x = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let spread = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), spread);
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi64x(-1))
}

/// `Σ x·y` in eight i32 lanes, `x` unsigned bytes, `y` signed (exact:
/// the codes are at most 31, the activations at most 127).
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_us8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

/// The sum of eight i32 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_i32(x: __m256i) -> i32 {
    let r = _mm_add_epi32(_mm256_extracti128_si256::<1>(x), _mm256_castsi256_si128(x));
    let r = _mm_add_epi32(r, _mm_shuffle_epi32::<0b01_00_11_10>(r));
    _mm_cvtsi128_si32(_mm_add_epi32(r, _mm_shuffle_epi32::<0b10_11_00_01>(r)))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// The first four f16 of block `b` as f32 (F16C): lane 0 its scale,
/// lane 1 its minimum for the types with one. Converted from a load of 8
/// bytes, not inserted into a register: an insert (`vpinsrw`) keeps the
/// rest of its register, and the compiler picked the loop's accumulator,
/// so that every block waited for the one before (a Q8_0 block in cache:
/// 3.0 ns before, 1.5 ns after; Q4_1 2.75 → 2.16 ns).
#[target_feature(enable = "avx2,fma,f16c")]
fn halves(b: &[u8]) -> __m128 {
    let b = &b[..8];
    // SAFETY: `b` has 8 bytes; the load is unaligned
    _mm_cvtph_ps(unsafe { _mm_loadl_epi64(b.as_ptr().cast()) })
}

/// The scale of block `b`.
#[target_feature(enable = "avx2,fma,f16c")]
fn scale(b: &[u8]) -> f32 {
    _mm_cvtss_f32(halves(b))
}

/// The minimum of block `b` (the types with one).
#[target_feature(enable = "avx2,fma,f16c")]
fn minimum(b: &[u8]) -> f32 {
    _mm_cvtss_f32(_mm_movehdup_ps(halves(b)))
}

/// The 32 codes of block `b` of type `T`: signed bytes (`q - 8`,
/// `q - 16`, Q8_0's), or unsigned for the types with a minimum.
#[target_feature(enable = "avx2,fma,f16c")]
fn codes<T: Ty>(b: &[u8]) -> __m256i {
    match T::CODES {
        Codes::Nib4 { qs, minus8: true } => _mm256_sub_epi8(nibbles(&b[qs..]), _mm256_set1_epi8(8)),
        Codes::Nib4 { qs, minus8: false } => nibbles(&b[qs..]),
        // code - 16: the nibble with 0xF0 where the fifth bit is clear
        Codes::Nib5 {
            qh,
            qs,
            signed: true,
        } => _mm256_or_si256(
            nibbles(&b[qs..]),
            _mm256_andnot_si256(bits(&b[qh..]), _mm256_set1_epi8(0xF0_u8 as i8)),
        ),
        Codes::Nib5 {
            qh,
            qs,
            signed: false,
        } => _mm256_or_si256(
            nibbles(&b[qs..]),
            _mm256_and_si256(bits(&b[qh..]), _mm256_set1_epi8(0x10)),
        ),
        Codes::Int8 { qs } => load32(&b[qs..]),
    }
}

/// The integer products of block `b` (codes `q`, their magnitudes `aq`)
/// with activations `y`, in eight lanes.
#[target_feature(enable = "avx2,fma,f16c")]
fn products<T: Ty>(q: __m256i, aq: __m256i, y: &Q8Block) -> __m256i {
    if T::MIN {
        mul_sum_us8(q, acts(y))
    } else {
        mul_sum_us8(aq, _mm256_sign_epi8(acts(y), q))
    }
}

/// One block's term in candle's scalar order.
#[target_feature(enable = "avx2,fma,f16c")]
fn term<T: Ty>(b: &[u8], dw: f32, y: &Q8Block, p: __m256i) -> f32 {
    let v = hsum_i32(p) as f32 * dw * y.d;
    if T::MIN { v + minimum(b) * y.s } else { v }
}

/// `w · a`, one block of type `T` at a time: in scalar order four
/// blocks' terms are the lanes of one vector (each lane the same f32
/// operations as [`term`]), added to the sum in block order.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot<T: Ty>(w: &[u8], a: &[Q8Block]) -> f32 {
    let bb = T::BYTES;
    if T::LANES {
        let mut acc = _mm256_setzero_ps();
        for (b, y) in w.chunks_exact(bb).zip(a) {
            let q = codes::<T>(b);
            let p = products::<T>(q, _mm256_sign_epi8(q, q), y);
            let d = _mm256_set1_ps(scale(b) * y.d);
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
        }
        return hsum(acc);
    }
    let mut sum = 0f32;
    let mut quads = w.chunks_exact(4 * bb).zip(a.chunks_exact(4));
    for (b4, y4) in &mut quads {
        // loops, not closures: a closure does not inherit the target
        // features, and its intrinsics would be calls
        let mut b: [&[u8]; 4] = [&[]; 4];
        let mut p = [_mm256_setzero_si256(); 4];
        for k in 0..4 {
            b[k] = &b4[k * bb..(k + 1) * bb];
            let q = codes::<T>(b[k]);
            p[k] = products::<T>(q, _mm256_sign_epi8(q, q), &y4[k]);
        }
        // lanes: the four blocks' scales, and their minimums
        let (h01, h23) = (
            _mm_unpacklo_ps(halves(b[0]), halves(b[1])),
            _mm_unpacklo_ps(halves(b[2]), halves(b[3])),
        );
        let dw = _mm_movelh_ps(h01, h23);
        let da = _mm_set_ps(y4[3].d, y4[2].d, y4[1].d, y4[0].d);
        let mut v = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(hsum4_i32(p)), dw), da);
        if T::MIN {
            let m = _mm_movehl_ps(h23, h01);
            let sa = _mm_set_ps(y4[3].s, y4[2].s, y4[1].s, y4[0].s);
            v = _mm_add_ps(v, _mm_mul_ps(m, sa));
        }
        for t in lanes4(v) {
            sum += t;
        }
    }
    let done = w.len() / (4 * bb) * 4;
    for (b, y) in w[done * bb..].chunks_exact(bb).zip(&a[done.min(a.len())..]) {
        let q = codes::<T>(b);
        let p = products::<T>(q, _mm256_sign_epi8(q, q), y);
        sum += term::<T>(b, scale(b), y, p);
    }
    sum
}

/// The four f32 lanes of `v`, lowest first.
#[target_feature(enable = "avx2,fma,f16c")]
fn lanes4(v: __m128) -> [f32; 4] {
    let mut out = [0f32; 4];
    // SAFETY: `out` is four f32; the store is unaligned
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// The integer sums of four tokens' products: lane `t` is `Σ p[t]`.
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum4_i32(p: [__m256i; 4]) -> __m128i {
    let c = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256::<1>(c))
}

/// `w · a[t]` for four tokens: each block unpacked once. In scalar order
/// the four tokens' terms are the lanes of one vector, each lane the same
/// f32 operations as [`term`].
#[target_feature(enable = "avx2,fma,f16c")]
fn dot4<T: Ty>(w: &[u8], a: [&[Q8Block]; 4]) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut sum = _mm_setzero_ps();
    let n = w.len() / T::BYTES;
    let a = [&a[0][..n], &a[1][..n], &a[2][..n], &a[3][..n]];
    for (i, b) in w.chunks_exact(T::BYTES).enumerate() {
        let q = codes::<T>(b);
        // the signed codes' magnitudes, once; their signs go to each token's
        let aq = _mm256_sign_epi8(q, q);
        let dw = scale(b);
        let y = [&a[0][i], &a[1][i], &a[2][i], &a[3][i]];
        let mut p = [_mm256_setzero_si256(); 4];
        for t in 0..4 {
            p[t] = products::<T>(q, aq, y[t]);
        }
        if T::LANES {
            for t in 0..4 {
                let d = _mm256_set1_ps(dw * y[t].d);
                acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p[t]), acc[t]);
            }
            continue;
        }
        let da = _mm_set_ps(y[3].d, y[2].d, y[1].d, y[0].d);
        let dots = _mm_cvtepi32_ps(hsum4_i32(p));
        let mut v = _mm_mul_ps(_mm_mul_ps(dots, _mm_set1_ps(dw)), da);
        if T::MIN {
            let sa = _mm_set_ps(y[3].s, y[2].s, y[1].s, y[0].s);
            v = _mm_add_ps(v, _mm_mul_ps(_mm_set1_ps(minimum(b)), sa));
        }
        sum = _mm_add_ps(sum, v);
    }
    if T::LANES {
        let mut out = [0f32; 4];
        for t in 0..4 {
            out[t] = hsum(acc[t]);
        }
        return out;
    }
    lanes4(sum)
}
