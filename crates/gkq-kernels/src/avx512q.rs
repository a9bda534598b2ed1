//! AVX-512 forms of `portable.rs`'s kernels (F, BW and VNNI): two blocks
//! of a row at a time, the even one's codes in the low half of a register
//! and the odd one's in the high half, their products with the activations
//! summed in fours by `dpbusd` into 16 i32 lanes,
//! then `portable.rs`'s f32 steps lane by lane in one register. Up to
//! eight tokens share each pair's unpacking (`avx2.rs`'s, a block at a time).
//!
//! Unsafe code: loads of 64 bytes (or 8, 16) from slices indexed to that
//! length first, and calls of these functions once the CPU is known to have
//! the features.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::avx2::{codes, halves, products};
use crate::simd256::{fold8, load16, load32, prefetch};
use crate::types::{Codes, Ty};
use crate::{Q8Token, Rows};

/// Whether this CPU has the features: the kernels below may run.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// The kernels of type `T`, callable once [`available`] said yes (the only
/// caller, `RowDot::of`, asks first).
pub(crate) const fn kernels<T: Ty>() -> Rows {
    // SAFETY (each call): `RowDot::of` hands these out only when the CPU
    // has the features
    |w, rb, a, n, out, steps| unsafe { rows::<T>(w, rb, a, n, out, steps) }
}

/// Lanes 0..8 from lane 0 of a vector, 8..16 from lane 1 (and, with
/// `UPPER`, from lanes 2 and 3).
const PAIR: [i32; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
const UPPER: [i32; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];

/// Lanes 0..8 `v[idx[0]]`, 8..16 `v[idx[8]]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn spread(v: __m128, idx: &[i32; 16]) -> __m512 {
    // SAFETY: `idx` is 64 bytes; the load is unaligned
    let idx = unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) };
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
}

/// The 64 activations of blocks `i` and `i + 1` of `y`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn acts64(y: Q8Token<'_>, i: usize) -> __m512i {
    let q = &y.qs[32 * i..32 * i + 64];
    // SAFETY: `q` has 64 bytes; the load is unaligned
    unsafe { _mm512_loadu_si512(q.as_ptr().cast()) }
}

/// The sums of each 4 codes of blocks `i` and `i + 1` of `y`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn sums16(y: Q8Token<'_>, i: usize) -> __m512 {
    let s = &y.sums[8 * i..8 * i + 16];
    // SAFETY: `s` has 16 f32; the load is unaligned
    unsafe { _mm512_loadu_ps(s.as_ptr()) }
}

/// The scales of blocks `i` and `i + 1` of `y`, each in its 8 lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn scales(y: Q8Token<'_>, i: usize) -> __m512 {
    let d = &y.d8[8 * i..8 * i + 16];
    // SAFETY: `d` has 16 f32; the load is unaligned
    unsafe { _mm512_loadu_ps(d.as_ptr()) }
}

/// `lo` in the low half, `hi` in the high half.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// 16 packed bytes at `a` and 16 at `b` as 64 nibbles: `a`'s low ones,
/// its high ones, then `b`'s.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn nibbles64(a: &[u8], b: &[u8]) -> __m512i {
    let v = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(load16(a)), load16(b));
    let z = _mm512_permutexvar_epi64(
        _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0),
        _mm512_castsi256_si512(v),
    );
    // the second and fourth 16 bytes shifted to their high nibbles
    let z = _mm512_mask_srli_epi16::<4>(z, 0xFF00_FF00, z);
    _mm512_and_si512(z, _mm512_set1_epi8(0x0F))
}

/// The 64 codes of the pair of blocks at `b` of type `T`, in value order:
/// signed bytes (`q - 16`, Q8_0's), or unsigned for the types
/// with a minimum.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn codes64<T: Ty>(b: &[u8]) -> __m512i {
    let bb = T::BYTES;
    match T::CODES {
        Codes::Int8 { qs } => join(load32(&b[qs..]), load32(&b[bb + qs..])),
        Codes::Nib4 { qs } => nibbles64(&b[qs..], &b[bb + qs..]),
        Codes::Nib5 { qh, qs, signed } => {
            let n = nibbles64(&b[qs..], &b[bb + qs..]);
            let w =
                |at: usize| u64::from(u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]));
            // the fifth bits of the 64 codes
            let k = w(qh) | w(bb + qh) << 32;
            let sixteen = _mm512_set1_epi8(16);
            if signed {
                // code - 16 where the bit is clear
                _mm512_mask_sub_epi8(n, !k, n, sixteen)
            } else {
                _mm512_mask_add_epi8(n, k, n, sixteen)
            }
        }
    }
}

/// The integer products of a pair's codes `q` (their magnitudes `aq`, the
/// mask of the negative ones `neg`) with activations `y`, in 16 lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn products64<T: Ty>(q: __m512i, aq: __m512i, neg: __mmask64, y: __m512i) -> __m512i {
    let zero = _mm512_setzero_si512();
    if T::MIN {
        _mm512_dpbusd_epi32(zero, q, y)
    } else {
        // the activations with the codes' signs
        let sy = _mm512_mask_sub_epi8(y, neg, zero, y);
        _mm512_dpbusd_epi32(zero, aq, sy)
    }
}

/// The row's result from its 16 lanes (and the minimums').
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn fold<T: Ty>(acc: __m512, accm: __m512) -> f32 {
    let half = |v: __m512| {
        let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v));
        fold8(_mm256_add_ps(
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(hi),
        ))
    };
    if T::MIN {
        half(acc) + half(accm)
    } else {
        half(acc)
    }
}

/// `[w · a[t]]` for `N` tokens: each pair of blocks unpacked once; an odd
/// last block in the low lanes on its own.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn dots<T: Ty, const N: usize>(w: &[u8], a: [Q8Token<'_>; N]) -> [f32; N] {
    let (mut acc, mut accm) = ([_mm512_setzero_ps(); N], [_mm512_setzero_ps(); N]);
    let bb = T::BYTES;
    let pairs = w.chunks_exact(2 * bb);
    let last = pairs.remainder();
    for (p, b) in pairs.enumerate() {
        let i = 2 * p;
        if N == 1 {
            prefetch(b);
        }
        let q = codes64::<T>(b);
        let (aq, neg) = (_mm512_abs_epi8(q), _mm512_movepi8_mask(q));
        // [d, d', m, m']
        let h = _mm_unpacklo_ps(halves(b), halves(&b[bb..]));
        let (dw, mw) = (spread(h, &PAIR), spread(h, &UPPER));
        for t in 0..N {
            let s = products64::<T>(q, aq, neg, acts64(a[t], i));
            let da = scales(a[t], i);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(s), acc[t]);
            if T::MIN {
                let mm = _mm512_mul_ps(mw, da);
                accm[t] = _mm512_fmadd_ps(mm, sums16(a[t], i), accm[t]);
            }
        }
    }
    if !last.is_empty() {
        let i = w.len() / bb - 1;
        tail::<T, N>(last, a, i, &mut acc, &mut accm);
    }
    std::array::from_fn(|t| fold::<T>(acc[t], accm[t]))
}

/// An odd last block `b` (block `i`) into the low 8 lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn tail<T: Ty, const N: usize>(
    b: &[u8],
    a: [Q8Token<'_>; N],
    i: usize,
    acc: &mut [__m512; N],
    accm: &mut [__m512; N],
) {
    let q = codes::<T>(b);
    let aq = _mm256_sign_epi8(q, q);
    let h = halves(b);
    for t in 0..N {
        let p = products::<T>(q, aq, a[t], i);
        let da = _mm_set1_ps(a[t].d[i]);
        let dd = _mm256_broadcastss_ps(_mm_mul_ss(h, da));
        let lo = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(p), _mm512_castps512_ps256(acc[t]));
        acc[t] = set_low(acc[t], lo);
        if T::MIN {
            let mm = _mm256_broadcastss_ps(_mm_mul_ss(_mm_movehdup_ps(h), da));
            let s = &a[t].sums[8 * i..8 * i + 8];
            // SAFETY: `s` has 8 f32; the load is unaligned
            let s = unsafe { _mm256_loadu_ps(s.as_ptr()) };
            let lo = _mm256_fmadd_ps(mm, s, _mm512_castps512_ps256(accm[t]));
            accm[t] = set_low(accm[t], lo);
        }
    }
}

/// `v` with `lo` in its low 8 lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn set_low(v: __m512, lo: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<0>(
        _mm512_castps_pd(v),
        _mm256_castps_pd(lo),
    ))
}

crate::rows_fn!(rows<T: Ty>, "avx512f,avx512bw,avx512vnni", Q8Token<'_>, dots);
