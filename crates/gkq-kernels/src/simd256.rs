//! The 256-bit helpers of the SIMD kernels: loads from slices indexed to
//! their length first, a fold of eight lanes, and the prefetch of the
//! one-token paths. Callable from functions with AVX2, FMA and F16C
//! (which AVX-512 F implies).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

/// 32 bytes of `b` (indexed to them first).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load32(b: &[u8]) -> __m256i {
    let b = &b[..32];
    // SAFETY: `b` has 32 bytes; the load is unaligned
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// 16 bytes of `b` (indexed to them first).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load16(b: &[u8]) -> __m128i {
    let b = &b[..16];
    // SAFETY: `b` has 16 bytes; the load is unaligned
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// Eight lanes folded in halves (`kquant::fold`'s order).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fold8(h: __m256) -> f32 {
    let q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
    let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)))
}

/// How far ahead of the block in hand a one-token kernel asks for the
/// weights (`bench`: on this machine's two cores, 1 KiB ahead and 4 KiB
/// gave less than 2 KiB).
const AHEAD: usize = 2048;

/// Asks for the cache lines of the weights [`AHEAD`] bytes past block `b`
/// (any address: a prefetch never faults). A one-token product waits on
/// memory: with the hardware's prefetch alone, two cores read a Q4_K
/// matrix at 15.9–19.1 GB/s (medians of alternating runs), 17.0–21.7
/// with this one; Q6_K, Q4_0 and Q8_0 gain as much or more.
#[inline(always)]
pub(crate) fn prefetch(b: &[u8]) {
    let at = b.as_ptr().wrapping_add(AHEAD);
    for line in (0..b.len()).step_by(64) {
        // SAFETY: a prefetch reads nothing the program sees and never faults
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line).cast()) };
    }
}
