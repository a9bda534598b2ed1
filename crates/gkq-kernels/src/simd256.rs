//! The 256-bit helpers of the K kernels (`avx512.rs`, `avx2k.rs`): loads
//! from slices indexed to their length first, the scales' conversions, and
//! Q6_K's unpacking; and the prefetch of every SIMD kernel's one-token
//! path. Callable from functions with AVX2, FMA and F16C (which AVX-512 F
//! implies).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::kquant::Q8KBlock;

/// 32 bytes of `b` (indexed to them first).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load32(b: &[u8]) -> __m256i {
    let b = &b[..32];
    // SAFETY: `b` has 32 bytes; the load is unaligned
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// The f32 scale pair at `b` (two f16: Q4_K's `d` and `dmin`), exactly.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn halves(b: &[u8]) -> (f32, f32) {
    let b = &b[..4];
    let h = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
        b[0], b[1], b[2], b[3],
    ])));
    (_mm_cvtss_f32(h), _mm_cvtss_f32(_mm_movehdup_ps(h)))
}

/// The 16 sums of 16 codes of `y`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn bsums(y: &Q8KBlock) -> __m256i {
    // SAFETY: `bsums` is 32 bytes; the load is unaligned
    unsafe { _mm256_loadu_si256(y.bsums.as_ptr().cast()) }
}

/// `d` times each of `y`'s eight scales.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn scaled(d: f32, y: &Q8KBlock) -> __m256 {
    // SAFETY: `d` is 32 bytes; the load is unaligned
    _mm256_mul_ps(_mm256_set1_ps(d), unsafe { _mm256_loadu_ps(y.d.as_ptr()) })
}

/// `v`'s two bits at `shift` of each byte, moved to bits 4 and 5.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn bits45(v: __m256i, shift: i32) -> __m256i {
    let v = _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift));
    _mm256_slli_epi16::<4>(_mm256_and_si256(v, _mm256_set1_epi8(3)))
}

/// The low nibbles of `v` (`high`: the high ones) with bits 4 and 5 `h`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn six(v: __m256i, high: bool, h: __m256i) -> __m256i {
    let v = if high { _mm256_srli_epi16::<4>(v) } else { v };
    _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi8(0x0F)), h)
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
