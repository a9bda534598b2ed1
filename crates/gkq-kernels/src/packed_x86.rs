//! `packed.rs`'s kernels for x86-64, Q4_0's, Q4_K's and Q6_K's: AVX-512
//! with VNNI
//! (a group's 16 rows in the lanes of one register, `dpbusd` summing each
//! 4 products of a row's unsigned codes with a token's four codes,
//! broadcast), and AVX2 (8 rows a register, `maddubs` pairs summed in
//! i16, exact below 2^15).
//!
//! Unsafe code: loads of 16, 32 or 64 bytes from slices indexed to that
//! length first, and calls of these functions once the CPU is known to
//! have the features.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::kquant::Q8KBlock;
use crate::packed::{BLOCK, BLOCK_K, BLOCK_Q6, GROUP, packed_fn};
use crate::simd256::{load16, load32, prefetch};
use crate::{Packed, PackedK, Q8Token};

/// The AVX-512 VNNI kernel of packed Q4_0, callable once
/// `avx512q::available` said yes (the only caller, `RowDot::of`, asks).
pub(crate) const Q4_0_AVX512: Packed =
    // SAFETY (each): `RowDot::of` hands these out only when the CPU has
    // the features
    |w, rb, rows, a, n, out, steps| unsafe { q4_0_512(w, rb, rows, a, n, out, steps) };
/// The AVX2 one, once `avx2::available` said yes.
pub(crate) const Q4_0_AVX2: Packed =
    |w, rb, rows, a, n, out, steps| unsafe { q4_0_256(w, rb, rows, a, n, out, steps) };

/// Token `y`'s codes `4j .. 4j + 4` of block `i`, as one i32.
#[inline(always)]
fn word(y: &Q8Token<'_>, i: usize, j: usize) -> i32 {
    let q = &y.qs[32 * i + 4 * j..32 * i + 4 * j + 4];
    i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8])
}

/// 64 bytes of `b` (indexed to them first).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn load64(b: &[u8]) -> __m512i {
    let b = &b[..64];
    // SAFETY: `b` has 64 bytes; the load is unaligned
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

/// A group's 16 rows with `N` tokens: lane `r` row `r`'s product.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn group512<const N: usize>(g: &[u8], a: [Q8Token<'_>; N]) -> [[f32; GROUP]; N] {
    let mut acc = [_mm512_setzero_ps(); N];
    let low = _mm512_set1_epi8(0x0F);
    for (i, b) in g.chunks_exact(BLOCK).enumerate() {
        if N == 1 {
            prefetch(b);
        }
        let dw = _mm512_cvtph_ps(load32(b));
        // codes 4j .. 4j + 4 of each row in lane r
        let q: [__m512i; 8] = std::array::from_fn(|j| {
            let x = load64(&b[32 + 64 * (j % 4)..]);
            let x = if j < 4 { x } else { _mm512_srli_epi16::<4>(x) };
            _mm512_and_si512(x, low)
        });
        for t in 0..N {
            let y = &a[t];
            let mut s0 = _mm512_set1_epi32(-8 * y.bsums[i]);
            let mut s1 = _mm512_setzero_si512();
            for j in 0..4 {
                s0 = _mm512_dpbusd_epi32(s0, q[j], _mm512_set1_epi32(word(y, i, j)));
                s1 = _mm512_dpbusd_epi32(s1, q[j + 4], _mm512_set1_epi32(word(y, i, j + 4)));
            }
            let s = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            let dd = _mm512_mul_ps(dw, _mm512_set1_ps(y.d[i]));
            acc[t] = _mm512_fmadd_ps(dd, s, acc[t]);
        }
    }
    std::array::from_fn(|t| {
        let mut o = [0f32; GROUP];
        // SAFETY: `o` has 16 f32; the store is unaligned
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), acc[t]) };
        o
    })
}

/// A group's 16 rows with `N` tokens, eight rows at a time.
#[target_feature(enable = "avx2,fma,f16c")]
fn group256<const N: usize>(g: &[u8], a: [Q8Token<'_>; N]) -> [[f32; GROUP]; N] {
    let mut out = [[0f32; GROUP]; N];
    let (low, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); N];
        for (i, b) in g.chunks_exact(BLOCK).enumerate() {
            if N == 1 && h == 0 {
                prefetch(b);
            }
            let dw = _mm256_cvtph_ps(load16(&b[16 * h..]));
            let q: [__m256i; 8] = std::array::from_fn(|j| {
                let x = load32(&b[32 + 64 * (j % 4) + 32 * h..]);
                let x = if j < 4 { x } else { _mm256_srli_epi16::<4>(x) };
                _mm256_and_si256(x, low)
            });
            for t in 0..N {
                let y = &a[t];
                // each pair at most 2 · 15 · 127, eight of them below 2^15
                let mut p = _mm256_setzero_si256();
                for (j, &q) in q.iter().enumerate() {
                    let x = _mm256_set1_epi32(word(y, i, j));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(q, x));
                }
                let s = _mm256_add_epi32(
                    _mm256_madd_epi16(p, ones),
                    _mm256_set1_epi32(-8 * y.bsums[i]),
                );
                let dd = _mm256_mul_ps(dw, _mm256_set1_ps(y.d[i]));
                acc[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s), acc[t]);
            }
        }
        for t in 0..N {
            // SAFETY: `out[t]` has 8 f32 from 8h; the store is unaligned
            unsafe { _mm256_storeu_ps(out[t][8 * h..].as_mut_ptr(), acc[t]) };
        }
    }
    out
}

packed_fn!(
    q4_0_512,
    "avx512f,avx512bw,avx512vnni",
    group512,
    Q8Token<'_>
);
packed_fn!(q4_0_256, "avx2,fma,f16c", group256, Q8Token<'_>);

/// The AVX-512 VNNI kernel of packed Q4_K, callable once
/// `avx512q::available` said yes (the only caller, `RowDot::of`, asks).
pub(crate) const Q4_K_AVX512: PackedK =
    |w, rb, rows, a, n, out, steps| unsafe { q4_k_512(w, rb, rows, a, n, out, steps) };
/// The AVX2 one, once `avx2::available` said yes.
pub(crate) const Q4_K_AVX2: PackedK =
    |w, rb, rows, a, n, out, steps| unsafe { q4_k_256(w, rb, rows, a, n, out, steps) };

/// How far ahead of the packed K block in hand a one-token kernel asks
/// for the weights: four blocks. The 1.5B's generation, alternating runs
/// of 48 tokens (Q4_K): 2 KiB ahead, all of a block's 36 lines at its
/// start, 32–34 tok/s; an eighth of a block per sub-block, one block ahead
/// 33–37, two 29–40, four 34–43 (llama.cpp 29–33 in the same runs).
const AHEAD_BLOCKS: usize = 4;

/// Asks for the eighth `j` of the packed K block (of `block` bytes)
/// [`AHEAD_BLOCKS`] past block `b`: the lines come in as the 32 values are
/// worked through, not all at once (any address: a prefetch never faults).
#[inline(always)]
fn prefetch_part(b: &[u8], j: usize, block: usize) {
    let at = b
        .as_ptr()
        .wrapping_add(AHEAD_BLOCKS * block + j * block / 8);
    for line in (0..block / 8).step_by(64) {
        // SAFETY: a prefetch reads nothing the program sees and never faults
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line).cast()) };
    }
}

/// Token `y`'s codes `at .. at + 4`, as one i32.
#[inline(always)]
fn word_k(y: &Q8KBlock, at: usize) -> i32 {
    let q = &y.qs[at..at + 4];
    i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8])
}

/// A packed Q4_K block's 6-bit scales (`m`: its minimums) of sub-blocks
/// 0..4 and 4..8, a byte each in the lanes' four (ggml's
/// `get_scale_min_k4`, sixteen rows at a time): from the scale words
/// `w0`, `w1`, `w2`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn scales512(w: [__m512i; 3], m: bool) -> [__m512i; 2] {
    let (six, four, two) = (
        _mm512_set1_epi32(0x3f3f_3f3f),
        _mm512_set1_epi32(0x0f0f_0f0f),
        _mm512_set1_epi32(0x0303_0303),
    );
    let (lo, hi) = if m {
        (w[1], _mm512_srli_epi32::<4>(w[2]))
    } else {
        (w[0], w[2])
    };
    let top = _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(lo), two));
    [
        _mm512_and_si512(lo, six),
        _mm512_or_si512(_mm512_and_si512(hi, four), top),
    ]
}

/// Byte `j` of each lane of `v`, as f32.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn byte512(v: __m512i, j: usize) -> __m512 {
    let b = _mm512_srl_epi32(v, _mm_cvtsi32_si128(8 * j as i32));
    _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(0xFF)))
}

/// A packed Q4_K group's 16 rows with `N` tokens: lane `r` row `r`'s.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn group512_k<const N: usize>(g: &[u8], a: [&[Q8KBlock]; N]) -> [[f32; GROUP]; N] {
    let mut acc = [_mm512_setzero_ps(); N];
    let low = _mm512_set1_epi8(0x0F);
    for (i, b) in g.chunks_exact(BLOCK_K).enumerate() {
        let (d, dmin) = (
            _mm512_cvtph_ps(load32(b)),
            _mm512_cvtph_ps(load32(&b[32..])),
        );
        let w = [load64(&b[64..]), load64(&b[128..]), load64(&b[192..])];
        let (sc, m) = (scales512(w, false), scales512(w, true));
        for j in 0..8 {
            if N == 1 {
                prefetch_part(b, j, BLOCK_K);
            }
            let dsc = _mm512_mul_ps(d, byte512(sc[j / 4], j % 4));
            let dm = _mm512_mul_ps(dmin, byte512(m[j / 4], j % 4));
            // sub-block j: the low nibbles of words 8 (j / 2) .., or the high
            let q: [__m512i; 8] = std::array::from_fn(|k| {
                let x = load64(&b[256 + 64 * (8 * (j / 2) + k)..]);
                let x = if j % 2 == 0 {
                    x
                } else {
                    _mm512_srli_epi16::<4>(x)
                };
                _mm512_and_si512(x, low)
            });
            for t in 0..N {
                let y = &a[t][i];
                let (mut s0, mut s1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for k in 0..4 {
                    let (x0, x1) = (word_k(y, 32 * j + 4 * k), word_k(y, 32 * j + 16 + 4 * k));
                    s0 = _mm512_dpbusd_epi32(s0, q[k], _mm512_set1_epi32(x0));
                    s1 = _mm512_dpbusd_epi32(s1, q[k + 4], _mm512_set1_epi32(x1));
                }
                let s = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
                let da = _mm512_set1_ps(y.d[j]);
                acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dsc, da), s, acc[t]);
                let p = _mm512_set1_ps(f32::from(y.psums[j]));
                acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dm, da), p, acc[t]);
            }
        }
    }
    std::array::from_fn(|t| {
        let mut o = [0f32; GROUP];
        // SAFETY: `o` has 16 f32; the store is unaligned
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), acc[t]) };
        o
    })
}

/// [`scales512`] for eight rows.
#[target_feature(enable = "avx2,fma,f16c")]
fn scales256(w: [__m256i; 3], m: bool) -> [__m256i; 2] {
    let (six, four, two) = (
        _mm256_set1_epi32(0x3f3f_3f3f),
        _mm256_set1_epi32(0x0f0f_0f0f),
        _mm256_set1_epi32(0x0303_0303),
    );
    let (lo, hi) = if m {
        (w[1], _mm256_srli_epi32::<4>(w[2]))
    } else {
        (w[0], w[2])
    };
    let top = _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(lo), two));
    [
        _mm256_and_si256(lo, six),
        _mm256_or_si256(_mm256_and_si256(hi, four), top),
    ]
}

/// Byte `j` of each lane of `v`, as f32.
#[target_feature(enable = "avx2,fma,f16c")]
fn byte256(v: __m256i, j: usize) -> __m256 {
    let b = _mm256_srl_epi32(v, _mm_cvtsi32_si128(8 * j as i32));
    _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(0xFF)))
}

/// A packed Q4_K group's 16 rows with `N` tokens, eight rows at a time.
#[target_feature(enable = "avx2,fma,f16c")]
fn group256_k<const N: usize>(g: &[u8], a: [&[Q8KBlock]; N]) -> [[f32; GROUP]; N] {
    let mut out = [[0f32; GROUP]; N];
    let (low, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); N];
        for (i, b) in g.chunks_exact(BLOCK_K).enumerate() {
            let d = _mm256_cvtph_ps(load16(&b[16 * h..]));
            let dmin = _mm256_cvtph_ps(load16(&b[32 + 16 * h..]));
            let w = std::array::from_fn(|k| load32(&b[64 + 64 * k + 32 * h..]));
            let (sc, m) = (scales256(w, false), scales256(w, true));
            for j in 0..8 {
                if N == 1 && h == 0 {
                    prefetch_part(b, j, BLOCK_K);
                }
                let dsc = _mm256_mul_ps(d, byte256(sc[j / 4], j % 4));
                let dm = _mm256_mul_ps(dmin, byte256(m[j / 4], j % 4));
                let q: [__m256i; 8] = std::array::from_fn(|k| {
                    let x = load32(&b[256 + 64 * (8 * (j / 2) + k) + 32 * h..]);
                    let x = if j % 2 == 0 {
                        x
                    } else {
                        _mm256_srli_epi16::<4>(x)
                    };
                    _mm256_and_si256(x, low)
                });
                for t in 0..N {
                    let y = &a[t][i];
                    // each pair at most 2 · 15 · 127, eight of them below 2^15
                    let mut p = _mm256_setzero_si256();
                    for (k, &q) in q.iter().enumerate() {
                        let x = _mm256_set1_epi32(word_k(y, 32 * j + 4 * k));
                        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(q, x));
                    }
                    let s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
                    let da = _mm256_set1_ps(y.d[j]);
                    acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dsc, da), s, acc[t]);
                    let ps = _mm256_set1_ps(f32::from(y.psums[j]));
                    acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(dm, da), ps, acc[t]);
                }
            }
        }
        for t in 0..N {
            // SAFETY: `out[t]` has 8 f32 from 8h; the store is unaligned
            unsafe { _mm256_storeu_ps(out[t][8 * h..].as_mut_ptr(), acc[t]) };
        }
    }
    out
}

packed_fn!(
    q4_k_512,
    "avx512f,avx512bw,avx512vnni",
    group512_k,
    &[Q8KBlock]
);
packed_fn!(q4_k_256, "avx2,fma,f16c", group256_k, &[Q8KBlock]);

/// The AVX-512 VNNI kernel of packed Q6_K (as [`Q4_K_AVX512`]).
pub(crate) const Q6_K_AVX512: PackedK =
    |w, rb, rows, a, n, out, steps| unsafe { q6_k_512(w, rb, rows, a, n, out, steps) };
/// The AVX2 one.
pub(crate) const Q6_K_AVX2: PackedK =
    |w, rb, rows, a, n, out, steps| unsafe { q6_k_256(w, rb, rows, a, n, out, steps) };

/// The signed scale byte `s` (of 16) of each row, from the scale words.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn scale512(w: &[__m512i; 4], s: usize) -> __m512i {
    let up = _mm512_sll_epi32(w[s / 4], _mm_cvtsi32_si128(24 - 8 * (s % 4) as i32));
    _mm512_srai_epi32::<24>(up)
}

/// A packed Q6_K group's 16 rows with `N` tokens: lane `r` row `r`'s.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn group512_q6<const N: usize>(g: &[u8], a: [&[Q8KBlock]; N]) -> [[f32; GROUP]; N] {
    let mut acc = [_mm512_setzero_ps(); N];
    let (low, two) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x03));
    for (i, b) in g.chunks_exact(BLOCK_Q6).enumerate() {
        let d = _mm512_cvtph_ps(load32(b));
        let w: [__m512i; 4] = std::array::from_fn(|k| load64(&b[32 + 64 * k..]));
        for j in 0..8 {
            if N == 1 {
                prefetch_part(b, j, BLOCK_Q6);
            }
            let (n, p) = (j / 4, j % 4);
            let sc = [scale512(&w, 2 * j), scale512(&w, 2 * j + 1)];
            let q: [__m512i; 8] = std::array::from_fn(|k| {
                let ql = load64(&b[288 + 64 * (16 * n + 8 * (p % 2) + k)..]);
                let ql = if p < 2 {
                    ql
                } else {
                    _mm512_srli_epi16::<4>(ql)
                };
                let qh = load64(&b[2336 + 64 * (8 * n + k)..]);
                let qh = _mm512_srl_epi16(qh, _mm_cvtsi32_si128(2 * p as i32));
                let hi = _mm512_slli_epi16::<4>(_mm512_and_si512(qh, two));
                _mm512_or_si512(_mm512_and_si512(ql, low), hi)
            });
            for t in 0..N {
                let y = &a[t][i];
                let mut s = [0, 1].map(|h| _mm512_set1_epi32(-32 * i32::from(y.bsums[2 * j + h])));
                for k in 0..4 {
                    let (x0, x1) = (word_k(y, 32 * j + 4 * k), word_k(y, 32 * j + 16 + 4 * k));
                    s[0] = _mm512_dpbusd_epi32(s[0], q[k], _mm512_set1_epi32(x0));
                    s[1] = _mm512_dpbusd_epi32(s[1], q[k + 4], _mm512_set1_epi32(x1));
                }
                let tt = _mm512_add_epi32(
                    _mm512_mullo_epi32(sc[0], s[0]),
                    _mm512_mullo_epi32(sc[1], s[1]),
                );
                let dd = _mm512_mul_ps(d, _mm512_set1_ps(y.d[j]));
                acc[t] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(tt), acc[t]);
            }
        }
    }
    std::array::from_fn(|t| {
        let mut o = [0f32; GROUP];
        // SAFETY: `o` has 16 f32; the store is unaligned
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), acc[t]) };
        o
    })
}

/// [`scale512`] for eight rows.
#[target_feature(enable = "avx2,fma,f16c")]
fn scale256(w: &[__m256i; 4], s: usize) -> __m256i {
    let up = _mm256_sll_epi32(w[s / 4], _mm_cvtsi32_si128(24 - 8 * (s % 4) as i32));
    _mm256_srai_epi32::<24>(up)
}

/// A packed Q6_K group's 16 rows with `N` tokens, eight rows at a time.
#[target_feature(enable = "avx2,fma,f16c")]
fn group256_q6<const N: usize>(g: &[u8], a: [&[Q8KBlock]; N]) -> [[f32; GROUP]; N] {
    let mut out = [[0f32; GROUP]; N];
    let (low, two, ones) = (
        _mm256_set1_epi8(0x0F),
        _mm256_set1_epi8(0x03),
        _mm256_set1_epi16(1),
    );
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); N];
        for (i, b) in g.chunks_exact(BLOCK_Q6).enumerate() {
            let d = _mm256_cvtph_ps(load16(&b[16 * h..]));
            let w: [__m256i; 4] = std::array::from_fn(|k| load32(&b[32 + 64 * k + 32 * h..]));
            for j in 0..8 {
                if N == 1 && h == 0 {
                    prefetch_part(b, j, BLOCK_Q6);
                }
                let (n, p) = (j / 4, j % 4);
                let sc = [scale256(&w, 2 * j), scale256(&w, 2 * j + 1)];
                let q: [__m256i; 8] = std::array::from_fn(|k| {
                    let ql = load32(&b[288 + 64 * (16 * n + 8 * (p % 2) + k) + 32 * h..]);
                    let ql = if p < 2 {
                        ql
                    } else {
                        _mm256_srli_epi16::<4>(ql)
                    };
                    let qh = load32(&b[2336 + 64 * (8 * n + k) + 32 * h..]);
                    let qh = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * p as i32));
                    let hi = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, two));
                    _mm256_or_si256(_mm256_and_si256(ql, low), hi)
                });
                for t in 0..N {
                    let y = &a[t][i];
                    // a pair at most 2 · 63 · 127: two pairs in i16, then i32
                    let pair = |k: usize| {
                        let x = |k: usize| _mm256_set1_epi32(word_k(y, 32 * j + 4 * k));
                        let p = _mm256_add_epi16(
                            _mm256_maddubs_epi16(q[k], x(k)),
                            _mm256_maddubs_epi16(q[k + 1], x(k + 1)),
                        );
                        _mm256_madd_epi16(p, ones)
                    };
                    let s = [0, 1].map(|e| {
                        let off = _mm256_set1_epi32(-32 * i32::from(y.bsums[2 * j + e]));
                        _mm256_add_epi32(_mm256_add_epi32(pair(4 * e), pair(4 * e + 2)), off)
                    });
                    let tt = _mm256_add_epi32(
                        _mm256_mullo_epi32(sc[0], s[0]),
                        _mm256_mullo_epi32(sc[1], s[1]),
                    );
                    let dd = _mm256_mul_ps(d, _mm256_set1_ps(y.d[j]));
                    acc[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(tt), acc[t]);
                }
            }
        }
        for t in 0..N {
            // SAFETY: `out[t]` has 8 f32 from 8h; the store is unaligned
            unsafe { _mm256_storeu_ps(out[t][8 * h..].as_mut_ptr(), acc[t]) };
        }
    }
    out
}

packed_fn!(
    q6_k_512,
    "avx512f,avx512bw,avx512vnni",
    group512_q6,
    &[Q8KBlock]
);
packed_fn!(q6_k_256, "avx2,fma,f16c", group256_q6, &[Q8KBlock]);
