//! AVX2 forms of `attn16.rs`'s f16 products, in its order.
//!
//! Unsafe code: loads of 8 values at offsets below a row's length less 7
//! (rows of whole 8s, within their slices: the callers assert it), and
//! calls of these functions once the CPU is known to have AVX2, FMA and
//! F16C.
#![allow(unsafe_code)]

use half::f16;
use std::arch::x86_64::*;

/// `attn16::dot_f16` on this CPU, if it has AVX2, FMA and F16C.
pub(crate) fn dot_f16(q: &[f32], k: &[f16], scale: f32, out: &mut [f32]) -> bool {
    let ok = crate::avx2::available();
    if ok {
        // SAFETY: the CPU has the features; whole rows (the caller asserts)
        unsafe { dot(q, k, scale, out) };
    }
    ok
}

/// `attn16::axpy_f16` on this CPU, if it has AVX2, FMA and F16C.
pub(crate) fn axpy_f16(p: &[f32], v: &[f16], out: &mut [f32]) -> bool {
    let ok = crate::avx2::available();
    if ok {
        // SAFETY: as in `dot_f16`
        unsafe { axpy(p, v, out) };
    }
    ok
}

/// Eight f16 at `p` widened (F16C).
#[inline(always)]
unsafe fn load8(p: *const f16) -> __m256 {
    // SAFETY: the caller reads 8 values within its slice
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot(q: &[f32], k: &[f16], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    for (j, o) in out.iter_mut().enumerate() {
        let row = k[j * hd..(j + 1) * hd].as_ptr();
        let mut acc = _mm256_setzero_ps();
        for c in (0..hd).step_by(8) {
            // SAFETY: c + 8 ≤ hd, within q and the row
            unsafe {
                let qv = _mm256_loadu_ps(q.as_ptr().add(c));
                acc = _mm256_fmadd_ps(qv, load8(row.add(c)), acc);
            }
        }
        let x = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        let x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
        *o = _mm_cvtss_f32(x) * scale;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy(p: &[f32], v: &[f16], out: &mut [f32]) {
    let hd = out.len();
    let o = out.as_mut_ptr();
    for (j, &pj) in p.iter().enumerate() {
        let (row, pv) = (v[j * hd..(j + 1) * hd].as_ptr(), _mm256_set1_ps(pj));
        for c in (0..hd).step_by(8) {
            // SAFETY: c + 8 ≤ hd, within out and the row
            unsafe {
                let acc = _mm256_loadu_ps(o.add(c));
                _mm256_storeu_ps(o.add(c), _mm256_fmadd_ps(pv, load8(row.add(c)), acc));
            }
        }
    }
}
