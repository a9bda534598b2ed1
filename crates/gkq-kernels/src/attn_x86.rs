//! AVX2 forms of `attn.rs`'s products, in its order, for f32 and f16.
//!
//! Unsafe code: loads of 8 values at offsets below a row's length less 7
//! (rows of whole 8s within their slices: `attn.rs` asserts it before it
//! calls), and calls of these functions once the CPU is known to have
//! AVX2, FMA and F16C.
#![allow(unsafe_code)]

use half::f16;
use std::arch::x86_64::*;

/// A score kernel and a sum kernel over rows of `T` (`attn.rs`'s `KvDot`,
/// `KvAxpy`).
type Pair<T> = (
    fn(&[f32], &[T], f32, &mut [f32]),
    fn(&[f32], &[T], &mut [f32]),
);

/// The f32 kernels, if this CPU has AVX2, FMA and F16C.
pub(crate) fn f32_kernels() -> Option<Pair<f32>> {
    crate::avx2::available().then_some((dot_f32, axpy_f32))
}

/// The f16 kernels, if this CPU has AVX2, FMA and F16C.
pub(crate) fn f16_kernels() -> Option<Pair<f16>> {
    crate::avx2::available().then_some((dot_f16, axpy_f16))
}

/// Eight values at `p`, widened to f32.
trait Load8: Copy {
    /// # Safety
    /// Eight values from `p` are readable; the CPU has F16C and AVX.
    unsafe fn load8(p: *const Self) -> __m256;
}

impl Load8 for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller's
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl Load8 for f16 {
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: the caller's
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
}

macro_rules! kernels {
    ($t:ty, $dot:ident, $axpy:ident) => {
        fn $dot(q: &[f32], k: &[$t], scale: f32, out: &mut [f32]) {
            if crate::avx2::available() {
                // SAFETY: the CPU has the features; whole rows (asserted)
                unsafe { dot(q, k, scale, out) }
            } else {
                unreachable!("selected only on AVX2 CPUs")
            }
        }

        fn $axpy(p: &[f32], v: &[$t], out: &mut [f32]) {
            if crate::avx2::available() {
                // SAFETY: as above
                unsafe { axpy(p, v, out) }
            } else {
                unreachable!("selected only on AVX2 CPUs")
            }
        }
    };
}

kernels!(f32, dot_f32, axpy_f32);
kernels!(f16, dot_f16, axpy_f16);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot<T: Load8>(q: &[f32], k: &[T], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    for (j, o) in out.iter_mut().enumerate() {
        let row = k[j * hd..(j + 1) * hd].as_ptr();
        let mut acc = _mm256_setzero_ps();
        for c in (0..hd).step_by(8) {
            // SAFETY: c + 8 ≤ hd, within q and the row
            unsafe {
                let qv = _mm256_loadu_ps(q.as_ptr().add(c));
                acc = _mm256_fmadd_ps(qv, T::load8(row.add(c)), acc);
            }
        }
        let x = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        let x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
        *o = _mm_cvtss_f32(x) * scale;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy<T: Load8>(p: &[f32], v: &[T], out: &mut [f32]) {
    let hd = out.len();
    let o = out.as_mut_ptr();
    for (j, &pj) in p.iter().enumerate() {
        let (row, pv) = (v[j * hd..(j + 1) * hd].as_ptr(), _mm256_set1_ps(pj));
        for c in (0..hd).step_by(8) {
            // SAFETY: c + 8 ≤ hd, within out and the row
            unsafe {
                let acc = _mm256_loadu_ps(o.add(c));
                _mm256_storeu_ps(o.add(c), _mm256_fmadd_ps(pv, T::load8(row.add(c)), acc));
            }
        }
    }
}
