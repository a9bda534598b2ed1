//! The AVX2 form of `kquant.rs`'s Q6_K kernel, for CPUs without AVX-512
//! (Q4_K's is in `packed_x86.rs`): the 16
//! lanes of `avx512.rs` as two registers of 8 (values `64v .. 64v + 32` in
//! the first, the next 32 in the second), the same exact integers, the
//! same f32 steps lane by lane, so the same bits. Up to eight tokens share
//! each block's unpacking.
//!
//! Unsafe code: calls of these functions once the CPU is known to have
//! AVX2, FMA and F16C.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::RowsK;
use crate::kquant::{Q6_K_BYTES, Q8KBlock};
use crate::simd256::{bits45, bsums, fold8, halves, load16, load32, prefetch, scaled, six};

/// The kernel of Q6_K (rows with one, four or eight tokens), callable once
/// `avx2::available()` said yes (the only caller, `RowDot::of`, asks).
pub(crate) const Q6_K: RowsK =
    // SAFETY: `RowDot::of` hands it out only when the CPU has the features
    |w, rb, a, n, out, steps| unsafe { q6_k_rows(w, rb, a, n, out, steps) };

/// 32 activations of `y` from `at`.
#[target_feature(enable = "avx2,fma,f16c")]
fn acts32(y: &Q8KBlock, at: usize) -> __m256i {
    let q = &y.qs[at..at + 32];
    // SAFETY: `q` has 32 bytes; the load is unaligned
    unsafe { _mm256_loadu_si256(q.as_ptr().cast()) }
}

/// The lanes of one half: `acc + d · (codes · acts, scaled in pairs)`.
#[target_feature(enable = "avx2,fma,f16c")]
fn add_half(acc: __m256, d: f32, q: __m256i, a: __m256i, s: __m256i) -> __m256 {
    let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), s);
    _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc)
}

/// The row's result: the two halves added lane by lane, folded in halves,
/// less the offsets folded the same way (`kquant::fold`'s order).
#[target_feature(enable = "avx2,fma,f16c")]
fn fold(acc: [__m256; 2], off: __m256) -> f32 {
    fold8(_mm256_add_ps(acc[0], acc[1])) - fold8(off)
}

/// `y`'s eight scales times `d`, as an array.
#[target_feature(enable = "avx2,fma,f16c")]
fn scales_of(d: f32, y: &Q8KBlock) -> [f32; 8] {
    let mut out = [0f32; 8];
    // SAFETY: `out` is 32 bytes; the store is unaligned
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), scaled(d, y)) };
    out
}

/// `[w · a[t]]` for `N` tokens of a Q6_K row.
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k_dots<const N: usize>(w: &[u8], a: [&[Q8KBlock]; N]) -> [f32; N] {
    let (mut acc, mut off) = ([[_mm256_setzero_ps(); 2]; N], [_mm256_setzero_ps(); N]);
    for (i, b) in w.chunks_exact(Q6_K_BYTES).enumerate() {
        if N == 1 {
            prefetch(b);
        }
        let sc = _mm256_cvtepi8_epi16(load16(&b[192..]));
        let (d, _) = halves(&[b[208], b[209], 0, 0]);
        let dd: [[f32; 8]; N] = std::array::from_fn(|t| scales_of(d, &a[t][i]));
        for n in 0..2 {
            let (l0, l1) = (load32(&b[64 * n..]), load32(&b[64 * n + 32..]));
            let h = load32(&b[128 + 32 * n..]);
            // values 128n + [0, 32), [32, 64), [64, 96), [96, 128)
            let q = [
                six(l0, false, bits45(h, 0)),
                six(l1, false, bits45(h, 2)),
                six(l0, true, bits45(h, 4)),
                six(l1, true, bits45(h, 6)),
            ];
            for (k, q) in q.into_iter().enumerate() {
                // the scales of values 128n + 32k + [0, 16) and [16, 32)
                let s0 = i16::from(b[192 + 8 * n + 2 * k] as i8);
                let s1 = i16::from(b[192 + 8 * n + 2 * k + 1] as i8);
                let s = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
                let (v, h) = (4 * n + k, k % 2);
                for t in 0..N {
                    let at = acts32(&a[t][i], 32 * v);
                    acc[t][h] = add_half(acc[t][h], dd[t][v], q, at, s);
                }
            }
        }
        for t in 0..N {
            let bias = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc, bsums(&a[t][i])));
            off[t] = _mm256_fmadd_ps(scaled(d, &a[t][i]), _mm256_cvtepi32_ps(bias), off[t]);
        }
    }
    std::array::from_fn(|t| fold(acc[t], off[t]))
}

crate::rows_fn!(q6_k_rows, "avx2,fma,f16c", &[Q8KBlock], q6_k_dots);
