//! AVX2 forms of `portable.rs`'s kernels: a block's codes unpacked to 32
//! bytes (as ggml's `ggml_vec_dot_*` for AVX2 unpack them), their products
//! with the activations summed in pairs by `maddubs`, then `madd` to eight
//! exact i32 lanes, scaled and accumulated with FMA into the even or the
//! odd blocks' register: `portable.rs`'s 16 lanes in two registers.
//!
//! Unsafe code: loads of 16 or 32 bytes from slices that are indexed to
//! that length first, and calls of these functions once the CPU is known
//! to have AVX2, FMA and F16C.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::simd256::{fold8, prefetch};
use crate::types::{Codes, Ty};
use crate::{Q8Token, Rows};

/// Whether this CPU has AVX2, FMA and F16C: the kernels below may run.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// The kernels of type `T` (rows with one, four or eight tokens), callable once
/// [`available`] said yes (the only caller, `RowDot::of`, asks first).
pub(crate) const fn kernels<T: Ty>() -> Rows {
    // SAFETY (each call): `RowDot::of` hands these out only when the CPU
    // has the features
    |w, rb, a, n, out, steps| unsafe { rows::<T>(w, rb, a, n, out, steps) }
}

/// 32 bytes of `b` (which is indexed to them first).
#[target_feature(enable = "avx2,fma,f16c")]
fn load32(b: &[u8]) -> __m256i {
    let b = &b[..32];
    // SAFETY: `b` has 32 bytes; the load is unaligned
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// The 32 activations of block `i` of `y`.
#[target_feature(enable = "avx2,fma,f16c")]
fn acts(y: Q8Token<'_>, i: usize) -> __m256i {
    let q = &y.qs[32 * i..32 * i + 32];
    // SAFETY: `q` has 32 bytes; the load is unaligned
    unsafe { _mm256_loadu_si256(q.as_ptr().cast()) }
}

/// The sums of each 4 codes of block `i` of `y`.
#[target_feature(enable = "avx2,fma,f16c")]
fn sums(y: Q8Token<'_>, i: usize) -> __m256 {
    let s = &y.sums[8 * i..8 * i + 8];
    // SAFETY: `s` has 8 f32; the load is unaligned
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
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

/// The first four f16 of block `b` as f32 (F16C): lane 0 its scale,
/// lane 1 its minimum for the types with one. Converted from a load of 8
/// bytes, not inserted into a register: an insert (`vpinsrw`) keeps the
/// rest of its register, and the compiler picked the loop's accumulator,
/// so that every block waited for the one before (a Q8_0 block in cache:
/// 3.0 ns before, 1.5 ns after; Q4_1 2.75 → 2.16 ns).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn halves(b: &[u8]) -> __m128 {
    let b = &b[..8];
    // SAFETY: `b` has 8 bytes; the load is unaligned
    _mm_cvtph_ps(unsafe { _mm_loadl_epi64(b.as_ptr().cast()) })
}

/// The 32 codes of block `b` of type `T`: signed bytes
/// (`q - 16`, Q8_0's), or unsigned for the types with a minimum.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn codes<T: Ty>(b: &[u8]) -> __m256i {
    match T::CODES {
        Codes::Nib4 { qs } => nibbles(&b[qs..]),
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

/// The integer products of block `i` of `y` with codes `q` (their
/// magnitudes `aq`), in eight lanes of 4 values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn products<T: Ty>(q: __m256i, aq: __m256i, y: Q8Token<'_>, i: usize) -> __m256i {
    if T::MIN {
        mul_sum_us8(q, acts(y, i))
    } else {
        mul_sum_us8(aq, _mm256_sign_epi8(acts(y, i), q))
    }
}

/// Block `b`'s term of the lanes in `acc` (and the minimum's in `accm`):
/// `p` its integer products with block `i` of `y`.
#[target_feature(enable = "avx2,fma,f16c")]
fn add_block<T: Ty>(
    acc: &mut __m256,
    accm: &mut __m256,
    b: &[u8],
    y: Q8Token<'_>,
    i: usize,
    p: __m256i,
) {
    let h = halves(b);
    let da = _mm_set1_ps(y.d[i]);
    let dd = _mm256_broadcastss_ps(_mm_mul_ss(h, da));
    *acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(p), *acc);
    if T::MIN {
        let mm = _mm256_broadcastss_ps(_mm_mul_ss(_mm_movehdup_ps(h), da));
        *accm = _mm256_fmadd_ps(mm, sums(y, i), *accm);
    }
}

/// The row's result from the even and the odd blocks' lanes
/// (`portable.rs`'s order).
#[target_feature(enable = "avx2,fma,f16c")]
fn fold<T: Ty>(acc: [__m256; 2], accm: [__m256; 2]) -> f32 {
    let v = fold8(_mm256_add_ps(acc[0], acc[1]));
    if T::MIN {
        v + fold8(_mm256_add_ps(accm[0], accm[1]))
    } else {
        v
    }
}

/// `[w · a[t]]` for `N` tokens: each block unpacked once, its products
/// with each token's activations in the lanes of the block's parity.
#[target_feature(enable = "avx2,fma,f16c")]
fn dots<T: Ty, const N: usize>(w: &[u8], a: [Q8Token<'_>; N]) -> [f32; N] {
    let zero = _mm256_setzero_ps();
    let (mut acc, mut accm) = ([[zero; 2]; N], [[zero; 2]; N]);
    for (i, b) in w.chunks_exact(T::BYTES).enumerate() {
        if N == 1 {
            prefetch(b);
        }
        let q = codes::<T>(b);
        // the signed codes' magnitudes, once; their signs go to each token's
        let aq = _mm256_sign_epi8(q, q);
        for t in 0..N {
            let p = products::<T>(q, aq, a[t], i);
            add_block::<T>(&mut acc[t][i % 2], &mut accm[t][i % 2], b, a[t], i, p);
        }
    }
    std::array::from_fn(|t| fold::<T>(acc[t], accm[t]))
}

crate::rows_fn!(rows<T: Ty>, "avx2,fma,f16c", Q8Token<'_>, dots);
