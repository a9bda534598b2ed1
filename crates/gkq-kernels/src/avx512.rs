//! The AVX-512 form of `kquant.rs`'s Q6_K kernel (F and BW; `madd` then
//! an add, which is what the compiler emitted for VNNI's `dpwssd` here
//! anyway; Q4_K's is in `packed_x86.rs`): a block's codes unpacked 64 values
//! at a time, in value order, their products with the activations summed
//! in pairs by `maddubs` and scaled in pairs (`madd`) into 16 i32 lanes,
//! then `kquant.rs`'s f32 steps lane by lane in one register. Up to eight
//! tokens share each block's unpacking.
//!
//! Unsafe code: loads of 64 bytes from slices indexed to that length
//! first, and calls of these functions once the CPU is known to have the
//! features.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::RowsK;
use crate::kquant::{Q6_K_BYTES, Q8KBlock};
use crate::simd256::{bits45, bsums, fold8, halves, load16, load32, prefetch, scaled, six};

/// Whether this CPU has the features: the kernels below may run.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
}

/// The kernel of Q6_K (rows with one, four or eight tokens), callable once
/// [`available`] said yes (the only caller, `RowDot::of`, asks first).
pub(crate) const Q6_K: RowsK =
    // SAFETY: `RowDot::of` hands it out only when the CPU has the features
    |w, rb, a, n, out, steps| unsafe { q6_k_rows(w, rb, a, n, out, steps) };

/// 64 codes of `y` from `at`.
#[target_feature(enable = "avx512f,avx512bw")]
fn acts64(y: &Q8KBlock, at: usize) -> __m512i {
    let q = &y.qs[at..at + 64];
    // SAFETY: `q` has 64 bytes; the load is unaligned
    unsafe { _mm512_loadu_si512(q.as_ptr().cast()) }
}

/// `lo` in the low half, `hi` in the high half.
#[target_feature(enable = "avx512f,avx512bw")]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// The lanes of the i16 scales that each of `maddubs`'s 32 pairs of a
/// 64-value vector `v` meets: `lanes` pairs per scale, from `v · 64 / (2 ·
/// lanes)`.
const fn spreads(lanes: usize) -> [[i16; 32]; 4] {
    let mut idx = [[0i16; 32]; 4];
    let mut v = 0;
    while v < 4 {
        let mut i = 0;
        while i < 32 {
            idx[v][i] = (v * 32 / lanes + i / lanes) as i16;
            i += 1;
        }
        v += 1;
    }
    idx
}

/// Q6_K: a scale per 16 values.
const SPREAD_Q6_K: [[i16; 32]; 4] = spreads(8);

/// The scales of `s` lined up with vector `v`'s pairs, by table `idx`.
#[target_feature(enable = "avx512f,avx512bw")]
fn spread(s: __m512i, idx: &[[i16; 32]; 4], v: usize) -> __m512i {
    let idx = &idx[v];
    // SAFETY: `idx` is 64 bytes; the load is unaligned
    let idx = unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) };
    _mm512_permutexvar_epi16(idx, s)
}

/// Lane `l` of 64 values' vector `v`: the scale of its 32 (`2v + l / 8`).
const SCALE_OF_LANE: [[i32; 16]; 4] = {
    let mut idx = [[0i32; 16]; 4];
    let mut v = 0;
    while v < 4 {
        let mut l = 0;
        while l < 16 {
            idx[v][l] = (2 * v + l / 8) as i32;
            l += 1;
        }
        v += 1;
    }
    idx
};

/// `acc + dd[2v + l / 8] · isum[l]` in each lane `l` (one FMA), `dd` the
/// eight products of the weights' and the activations' scales.
#[target_feature(enable = "avx512f,avx512bw")]
fn add_lanes(acc: __m512, dd: __m256, v: usize, isum: __m512i) -> __m512 {
    let idx = &SCALE_OF_LANE[v];
    // SAFETY: `idx` is 64 bytes; the load is unaligned
    let idx = unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) };
    let d = _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(dd));
    _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), acc)
}

/// The row's result: the 16 lanes folded in halves, less the offsets' 8
/// folded the same way (`kquant::fold`'s order).
#[target_feature(enable = "avx512f,avx512bw")]
fn fold(acc: __m512, off: __m256) -> f32 {
    let h = _mm256_add_ps(
        _mm512_castps512_ps256(acc),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc))),
    );
    fold8(h) - fold8(off)
}

/// `[w · a[t]]` for `N` tokens of a Q6_K row: the unsigned codes' sums,
/// less 32 times the scales' products with the code sums (the offsets).
#[target_feature(enable = "avx512f,avx512bw")]
fn q6_k_dots<const N: usize>(w: &[u8], a: [&[Q8KBlock]; N]) -> [f32; N] {
    let (mut acc, mut off) = ([_mm512_setzero_ps(); N], [_mm256_setzero_ps(); N]);
    for (i, b) in w.chunks_exact(Q6_K_BYTES).enumerate() {
        if N == 1 {
            prefetch(b);
        }
        let sc = _mm256_cvtepi8_epi16(load16(&b[192..]));
        let sc16 = _mm512_castsi256_si512(sc);
        let (d, _) = halves(&[b[208], b[209], 0, 0]);
        let dd: [__m256; N] = std::array::from_fn(|t| scaled(d, &a[t][i]));
        for n in 0..2 {
            let (l0, l1) = (load32(&b[64 * n..]), load32(&b[64 * n + 32..]));
            let h = load32(&b[128 + 32 * n..]);
            // values 128n + [0, 64), then [64, 128), in order
            let q = [
                join(six(l0, false, bits45(h, 0)), six(l1, false, bits45(h, 2))),
                join(six(l0, true, bits45(h, 4)), six(l1, true, bits45(h, 6))),
            ];
            for k in 0..2 {
                let v = 2 * n + k;
                let s = spread(sc16, &SPREAD_Q6_K, v);
                for t in 0..N {
                    let p = _mm512_maddubs_epi16(q[k], acts64(&a[t][i], 64 * v));
                    acc[t] = add_lanes(acc[t], dd[t], v, _mm512_madd_epi16(p, s));
                }
            }
        }
        for t in 0..N {
            let bias = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc, bsums(&a[t][i])));
            off[t] = _mm256_fmadd_ps(dd[t], _mm256_cvtepi32_ps(bias), off[t]);
        }
    }
    std::array::from_fn(|t| fold(acc[t], off[t]))
}

crate::rows_fn!(q6_k_rows, "avx512f,avx512bw", &[Q8KBlock], q6_k_dots);
