//! The documented casts of docs/FORMAT.md section 6.

use half::{bf16, f16};

use crate::dtype::DType;

/// What a cast did to one run of elements.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CastReport {
    /// Largest `|x - cast(x)|` over finite inputs.
    pub max_abs_error: f64,
    /// Element index (within the run) of the first finite input that rounds
    /// to infinity in the target (`|x| >= 65520` for f16; values in
    /// `(65504, 65520)` round to the finite 65504 and only add to the error).
    pub first_overflow: Option<usize>,
}

impl CastReport {
    /// Combines the report of a later run (`offset` elements in) into this one.
    pub fn merge(&mut self, later: CastReport, offset: usize) {
        self.max_abs_error = self.max_abs_error.max(later.max_abs_error);
        if self.first_overflow.is_none() {
            self.first_overflow = later.first_overflow.map(|i| i.saturating_add(offset));
        }
    }
}

fn f32_of(c: &[u8]) -> f32 {
    match c {
        [a, b, c, d] => f32::from_le_bytes([*a, *b, *c, *d]),
        _ => f32::NAN,
    }
}

fn f16_of(c: &[u8]) -> f32 {
    match c {
        [a, b] => f16::from_le_bytes([*a, *b]).to_f32(),
        _ => f32::NAN,
    }
}

/// `half`'s `bf16::to_f32` (the high half of an f32, a NaN made quiet)
/// without a branch, so that decoding a row vectorizes.
fn bf16_of(c: &[u8]) -> f32 {
    match c {
        [a, b] => {
            let h = u16::from_le_bytes([*a, *b]);
            let quiet = if h & 0x7FFF > 0x7F80 { 0x0040 } else { 0 };
            f32::from_bits(u32::from(h | quiet) << 16)
        }
        _ => f32::NAN,
    }
}

/// Elements decoded per step by the loops below.
const BLOCK: usize = 1024;

/// A cast that a block type is one side of (section 6): dequantized to f32
/// exactly, then cast to a float dtype, or quantized from the f32 values
/// (ggml's reference quantizer, section 3.5). The error is the largest
/// `|x - cast(x)|`; no value overflows.
fn requantize(src: &[u8], from: DType, to: DType, out: &mut Vec<u8>) -> Option<CastReport> {
    let mut x = Vec::new();
    if !decode_f32(src, from, &mut x) {
        return None;
    }
    let start = out.len();
    if to.is_quantized() {
        if !crate::quant::quantize(&x, to, out) {
            return None;
        }
    } else {
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        cast_row(&bytes, DType::F32, to, out)?;
    }
    let mut y = Vec::new();
    decode_f32(out.get(start..)?, to, &mut y).then_some(())?;
    let max_abs_error = x
        .iter()
        .zip(&y)
        .filter(|(a, _)| a.is_finite())
        .map(|(a, b)| (f64::from(*a) - f64::from(*b)).abs())
        .fold(0.0, f64::max);
    Some(CastReport {
        max_abs_error,
        first_overflow: None,
    })
}

/// Decodes `out.len()` elements of `src` (in `dtype`) into `out`, with the
/// dtype matched once per block so that each inner loop is monomorphic.
fn decode_into(src: &[u8], dtype: DType, out: &mut [f32]) {
    #[inline]
    fn fill(src: &[u8], out: &mut [f32], size: usize, read: impl Fn(&[u8]) -> f32) {
        for (o, c) in out.iter_mut().zip(src.chunks_exact(size)) {
            *o = read(c);
        }
    }
    match dtype {
        DType::F32 => fill(src, out, 4, f32_of),
        DType::F16 => fill(src, out, 2, f16_of),
        _ => fill(src, out, 2, bf16_of),
    }
}

/// Decodes f32/f16/bf16 little-endian bytes, or dequantizes whole blocks
/// of a block type (section 3.5), into `out` (cleared first). Returns
/// `false` if `dtype` is neither or `src` is not whole elements (blocks).
pub fn decode_f32(src: &[u8], dtype: DType, out: &mut Vec<f32>) -> bool {
    if dtype.is_quantized() {
        return crate::quant::dequantize(src, dtype, out);
    }
    out.clear();
    let size = usize::try_from(dtype.itemsize()).unwrap_or(1);
    if !dtype.is_castable_float() || !src.len().is_multiple_of(size) {
        return false;
    }
    out.resize(src.len().checked_div(size).unwrap_or(0), 0.0);
    decode_into(src, dtype, out);
    true
}

/// Casts whole elements of `src` (in `from`) to `to`, appending to `out`.
///
/// Same dtype: a byte copy. Otherwise both must be f32/f16/bf16; narrowing
/// rounds to nearest, ties to even. Returns `None` if the dtypes cannot be
/// cast or `src` is not whole elements.
pub fn cast_row(src: &[u8], from: DType, to: DType, out: &mut Vec<u8>) -> Option<CastReport> {
    if from == to {
        let whole = match from.block() {
            Some((_, b)) => src.len().is_multiple_of(usize::try_from(b).ok()?),
            None => src
                .len()
                .is_multiple_of(usize::try_from(from.itemsize()).ok()?.max(1)),
        };
        whole.then(|| out.extend_from_slice(src))?;
        return Some(CastReport::default());
    }
    if from.is_quantized() || to.is_quantized() {
        return requantize(src, from, to, out);
    }
    let size = usize::try_from(from.itemsize()).ok()?;
    if !src.len().is_multiple_of(size) {
        return None;
    }
    if !from.is_castable_float() || !to.is_castable_float() {
        return None;
    }
    let to_size = usize::try_from(to.itemsize()).ok()?;
    let count = src.len().checked_div(size)?;
    let start = out.len();
    out.resize(start.checked_add(count.checked_mul(to_size)?)?, 0);
    let dst = out.get_mut(start..)?;
    let pairs = dst.chunks_exact_mut(to_size).zip(src.chunks_exact(size));
    let mut report = CastReport::default();
    match (from, to) {
        // The common narrowing, on bits, in a loop the compiler vectorises.
        (DType::F32, DType::BF16) => report = f32_to_bf16(src, dst),
        // Widening is exact: no error to track.
        (DType::BF16, DType::F32) => {
            for (d, s) in pairs {
                if let ([d0, d1, d2, d3], [s0, s1]) = (d, s) {
                    let mut h = u16::from_le_bytes([*s0, *s1]);
                    // Section 6: a NaN gets its quiet bit set (as `half` does).
                    if h & 0x7fff > 0x7f80 {
                        h |= 0x0040;
                    }
                    let [_, _, hi0, hi1] = (u32::from(h) << 16).to_le_bytes();
                    (*d0, *d1, *d2, *d3) = (0, 0, hi0, hi1);
                }
            }
        }
        (DType::F16, DType::F32) => {
            for (d, s) in pairs {
                let x = f16::from_le_bytes([s.first().copied()?, s.get(1).copied()?]).to_f32();
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        _ => {
            let mut x = [0f32; BLOCK];
            let step = BLOCK.saturating_mul(size);
            for (b, (dc, sc)) in dst
                .chunks_mut(BLOCK.saturating_mul(to_size))
                .zip(src.chunks(step))
                .enumerate()
            {
                let n = sc.len().checked_div(size).unwrap_or(0).min(BLOCK);
                let x = x.get_mut(..n)?;
                decode_into(sc, from, x);
                let base = b.saturating_mul(BLOCK);
                let r = if to == DType::F16 {
                    narrow(x, dc, |v| {
                        let h = f16::from_f32(v);
                        (h.to_le_bytes(), h.to_f32())
                    })
                } else {
                    narrow(x, dc, |v| {
                        let h = bf16::from_f32(v);
                        (h.to_le_bytes(), h.to_f32())
                    })
                };
                report.merge(r, base);
            }
        }
    }
    Some(report)
}

/// Section 6's F32 → BF16 on bits: round to nearest even, NaNs quieted
/// with their top payload bits kept. Same results as `half`'s
/// `bf16::from_f32` (a test compares every exponent).
fn f32_to_bf16(src: &[u8], dst: &mut [u8]) -> CastReport {
    // Branch-free and integer-only in the loop, so that it vectorises: the
    // largest error is kept as the bits of a non-negative f32 (their order
    // is the values' order).
    let mut max_bits = 0u32;
    let mut overflows = false;
    for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(4)) {
        let x = match s {
            [a, b, c, e] => u32::from_le_bytes([*a, *b, *c, *e]),
            _ => 0,
        };
        let nan = x & 0x7fff_ffff > 0x7f80_0000;
        let rounded = x.wrapping_add(0x7fff_u32.wrapping_add((x >> 16) & 1)) >> 16;
        let h = if nan { (x >> 16) | 0x0040 } else { rounded };
        let back = h << 16;
        let finite_in = x & 0x7f80_0000 != 0x7f80_0000;
        let finite_out = back & 0x7f80_0000 != 0x7f80_0000;
        // exact in f32: a value minus its rounding to fewer mantissa bits
        let diff = (f32::from_bits(x) - f32::from_bits(back)).abs().to_bits();
        max_bits = max_bits.max(if finite_in && finite_out { diff } else { 0 });
        overflows |= finite_in && !finite_out;
        let [lo, hi, _, _] = h.to_le_bytes();
        if let [d0, d1] = d {
            (*d0, *d1) = (lo, hi);
        }
    }
    let max = f32::from_bits(max_bits);
    let first_overflow = if overflows {
        src.chunks_exact(4).position(|s| {
            let v = f32_of(s);
            v.is_finite() && bf16::from_f32(v).is_infinite()
        })
    } else {
        None
    };
    CastReport {
        max_abs_error: f64::from(max),
        first_overflow,
    }
}

/// Narrows decoded values into `dst` (2 bytes each) with `to`, which
/// returns the bytes and the value they widen back to; reports the largest
/// rounding error and the first finite value that became infinite.
#[inline]
fn narrow(x: &[f32], dst: &mut [u8], to: impl Fn(f32) -> ([u8; 2], f32)) -> CastReport {
    let mut report = CastReport::default();
    for (i, (v, d)) in x.iter().zip(dst.chunks_exact_mut(2)).enumerate() {
        let (bytes, back) = to(*v);
        if v.is_finite() {
            if back.is_infinite() {
                if report.first_overflow.is_none() {
                    report.first_overflow = Some(i);
                }
            } else {
                report.max_abs_error = report.max_abs_error.max(f64::from((v - back).abs()));
            }
        }
        d.copy_from_slice(&bytes);
    }
    report
}

/// Largest `|a[i] - b[i]|` between two runs of float elements of the same
/// count (f32/f16/bf16 widened exactly to f32, or a block type's
/// dequantized values; difference in f64), ignoring
/// positions where either side is not finite. `None` if the dtypes are not
/// float dtypes or the counts differ.
pub fn max_abs_diff(a: &[u8], a_dtype: DType, b: &[u8], b_dtype: DType) -> Option<f64> {
    if a_dtype.is_quantized() || b_dtype.is_quantized() {
        // a block type (section 3.5): its dequantized values
        let (mut xa, mut xb) = (Vec::new(), Vec::new());
        if !decode_f32(a, a_dtype, &mut xa)
            || !decode_f32(b, b_dtype, &mut xb)
            || xa.len() != xb.len()
        {
            return None;
        }
        let finite = xa
            .iter()
            .zip(&xb)
            .filter(|(x, y)| x.is_finite() && y.is_finite());
        return Some(
            finite
                .map(|(x, y)| (f64::from(*x) - f64::from(*y)).abs())
                .fold(0.0, f64::max),
        );
    }
    let (sa, sb) = (
        usize::try_from(a_dtype.itemsize()).ok()?,
        usize::try_from(b_dtype.itemsize()).ok()?,
    );
    if !a_dtype.is_castable_float()
        || !b_dtype.is_castable_float()
        || !a.len().is_multiple_of(sa)
        || !b.len().is_multiple_of(sb)
        || a.len().checked_div(sa) != b.len().checked_div(sb)
    {
        return None;
    }
    if a_dtype == b_dtype && a == b {
        return Some(0.0);
    }
    let (mut xa, mut xb) = ([0f32; BLOCK], [0f32; BLOCK]);
    let mut max = 0f64;
    for (ca, cb) in a
        .chunks(BLOCK.saturating_mul(sa))
        .zip(b.chunks(BLOCK.saturating_mul(sb)))
    {
        let n = ca.len().checked_div(sa).unwrap_or(0).min(BLOCK);
        let (xa, xb) = (xa.get_mut(..n)?, xb.get_mut(..n)?);
        decode_into(ca, a_dtype, xa);
        decode_into(cb, b_dtype, xb);
        for (x, y) in xa.iter().zip(xb.iter()) {
            if x.is_finite() && y.is_finite() {
                max = max.max((f64::from(*x) - f64::from(*y)).abs());
            }
        }
    }
    Some(max)
}

/// The index of the first element of `values` (in `dtype`) that, cast to
/// `target` as section 6 says, does not give the bits of the same element of
/// `reference` (in `target`); `None` when every element does. This is the
/// test behind the `SOURCE_EXACT` and `BLOCK_EXACT` flags (section 3.4).
/// A length mismatch reports the first element past the shorter side.
pub fn first_inexact(
    values: &[u8],
    dtype: DType,
    reference: &[u8],
    target: DType,
) -> Option<usize> {
    // a block type is compared block by block (section 3.5)
    let unit = target.block().map_or(target.itemsize(), |(_, b)| b);
    let isz = usize::try_from(unit).unwrap_or(1).max(1);
    let cast;
    let got: &[u8] = if dtype == target {
        values
    } else {
        let mut out = Vec::with_capacity(reference.len());
        if cast_row(values, dtype, target, &mut out).is_none() {
            return Some(0);
        }
        cast = out;
        &cast
    };
    if got == reference {
        return None;
    }
    let same = got
        .chunks(isz)
        .zip(reference.chunks(isz))
        .position(|(a, b)| a != b);
    match same {
        Some(i) => Some(i),
        None if got.len() != reference.len() => got.len().min(reference.len()).checked_div(isz),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Every bf16 decodes to `half`'s f32, NaN payloads included.
    #[test]
    fn bf16_decodes_as_half_does_for_every_pattern() {
        for bits in 0..=u16::MAX {
            let want = bf16::from_bits(bits).to_f32().to_bits();
            assert_eq!(bf16_of(&bits.to_le_bytes()).to_bits(), want, "{bits:#06x}");
        }
    }

    #[test]
    fn widening_is_exact_and_round_trips() {
        let vals = [0.0f32, -0.0, 1.0, -2.5, 65504.0, 1e-7, f32::INFINITY];
        for narrow in [DType::F16, DType::BF16] {
            let mut n = Vec::new();
            cast_row(&f32s(&vals), DType::F32, narrow, &mut n).expect("castable");
            let mut wide = Vec::new();
            let r = cast_row(&n, narrow, DType::F32, &mut wide).expect("castable");
            assert_eq!(r.max_abs_error, 0.0);
            let mut again = Vec::new();
            cast_row(&wide, DType::F32, narrow, &mut again).expect("castable");
            assert_eq!(again, n, "narrow(widen(x)) == x for {narrow}");
        }
    }

    #[test]
    fn narrowing_rounds_to_nearest_even() {
        // 1 + 2^-11 is halfway between two f16 values: ties to even gives 1.0.
        let mut out = Vec::new();
        let r = cast_row(
            &f32s(&[1.0 + 2f32.powi(-11)]),
            DType::F32,
            DType::F16,
            &mut out,
        )
        .expect("castable");
        assert_eq!(out, f16::from_f32(1.0).to_le_bytes());
        assert!((r.max_abs_error - 2f64.powi(-11)).abs() < 1e-12);
        // bf16: 1 + 2^-8 ties to 1.0, 1 + 3*2^-8 ties up to 1 + 2^-6.
        out.clear();
        cast_row(
            &f32s(&[1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8)]),
            DType::F32,
            DType::BF16,
            &mut out,
        )
        .expect("castable");
        assert_eq!(out.get(..2), Some(&bf16::from_f32(1.0).to_le_bytes()[..]));
        assert_eq!(
            out.get(2..4),
            Some(&bf16::from_bits(0x3f82).to_le_bytes()[..])
        );
    }

    #[test]
    fn f16_overflow_is_reported() {
        let mut out = Vec::new();
        let r = cast_row(
            &f32s(&[1.0, 65504.0, -70000.0, 1e6]),
            DType::F32,
            DType::F16,
            &mut out,
        )
        .expect("castable");
        assert_eq!(r.first_overflow, Some(2));
        let r = cast_row(&f32s(&[f32::MAX]), DType::F32, DType::BF16, &mut out).expect("castable");
        assert_eq!(r.first_overflow, Some(0));
    }

    #[test]
    fn f16_values_that_round_to_max_are_not_overflows() {
        // (65504, 65520) rounds to the finite 65504 under ties-to-even; 65520 rounds to inf.
        let mut out = Vec::new();
        let r = cast_row(
            &f32s(&[65505.0, 65519.996, -65519.0]),
            DType::F32,
            DType::F16,
            &mut out,
        )
        .expect("castable");
        assert_eq!(r.first_overflow, None);
        assert_eq!(out, [[0xff, 0x7b], [0xff, 0x7b], [0xff, 0xfb]].concat());
        assert!(r.max_abs_error > 15.0 && r.max_abs_error < 16.0);
        let r =
            cast_row(&f32s(&[1.0, 65520.0]), DType::F32, DType::F16, &mut out).expect("castable");
        assert_eq!(r.first_overflow, Some(1));
    }

    /// docs/FORMAT.md section 6 pins the NaN bits of every cast.
    #[test]
    fn f32_to_bf16_on_bits_agrees_with_half() {
        // every exponent, mantissas around the rounding point, signs, NaNs
        let mut vals = Vec::new();
        for e in 0u32..256 {
            for m in [
                0u32, 1, 0x7fff, 0x8000, 0x8001, 0x1_7fff, 0x1_8000, 0x7f_ffff, 0x40_0000,
                0x3f_8000,
            ] {
                for sign in [0u32, 1] {
                    vals.push((sign << 31) | (e << 23) | m);
                }
            }
        }
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut ours = vec![0u8; vals.len() * 2];
        let r = f32_to_bf16(&bytes, &mut ours);
        let mut max = 0f64;
        for (v, o) in vals.iter().zip(ours.chunks(2)) {
            let x = f32::from_bits(*v);
            let h = bf16::from_f32(x);
            assert_eq!(o, h.to_le_bytes(), "{v:#010x}");
            if x.is_finite() && h.to_f32().is_finite() {
                max = max.max(f64::from((x - h.to_f32()).abs()));
            }
        }
        assert_eq!(r.max_abs_error, max);
        assert_eq!(
            r.first_overflow,
            vals.iter().position(|v| {
                let x = f32::from_bits(*v);
                x.is_finite() && bf16::from_f32(x).is_infinite()
            })
        );
    }

    #[test]
    fn nan_bits_are_specified() {
        let cast = |bits: &[u8], from: DType, to: DType| {
            let mut out = Vec::new();
            cast_row(bits, from, to, &mut out).expect("castable");
            out
        };
        // f32 signalling NaN with payload, negative: sign kept, quiet bit set, top bits kept.
        let snan = 0xff80_1234u32.to_le_bytes();
        assert_eq!(
            cast(&snan, DType::F32, DType::BF16),
            0xffc0u16.to_le_bytes()
        );
        assert_eq!(cast(&snan, DType::F32, DType::F16), 0xfe00u16.to_le_bytes());
        let payload = 0x7fa0_2000u32.to_le_bytes(); // quiet bit clear, payload in the top bits
        assert_eq!(
            cast(&payload, DType::F32, DType::BF16),
            0x7fe0u16.to_le_bytes()
        );
        assert_eq!(
            cast(&payload, DType::F32, DType::F16),
            0x7f01u16.to_le_bytes()
        );
        // widening: quiet bit set, payload shifted up
        assert_eq!(
            cast(&0x7f81u16.to_le_bytes(), DType::BF16, DType::F32),
            0x7fc1_0000u32.to_le_bytes()
        );
        assert_eq!(
            cast(&0xfc01u16.to_le_bytes(), DType::F16, DType::F32),
            0xffc0_2000u32.to_le_bytes()
        );
        // decode_f32 agrees with the widening cast bit for bit
        let mut v = Vec::new();
        decode_f32(&0x7f81u16.to_le_bytes(), DType::BF16, &mut v);
        assert_eq!(v.first().map(|x| x.to_bits()), Some(0x7fc1_0000));
    }

    #[test]
    fn max_abs_diff_widens_exactly() {
        let a = f32s(&[1.0, 2.0, f32::NAN]);
        let mut b = Vec::new();
        cast_row(
            &f32s(&[1.0 + 2f32.powi(-9), 2.0, 5.0]),
            DType::F32,
            DType::BF16,
            &mut b,
        )
        .expect("castable");
        assert_eq!(max_abs_diff(&a, DType::F32, &b, DType::BF16), Some(0.0));
        let c = f32s(&[1.5, 2.0, 0.0]);
        assert_eq!(max_abs_diff(&a, DType::F32, &c, DType::F32), Some(0.5));
        assert_eq!(
            max_abs_diff(&a, DType::F32, c.get(..4).unwrap_or_default(), DType::F32),
            None
        );
    }

    #[test]
    fn integers_pass_through_only() {
        let mut out = Vec::new();
        assert!(cast_row(&[1, 2, 3, 4], DType::I32, DType::I32, &mut out).is_some());
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(cast_row(&[1, 2, 3, 4], DType::I32, DType::F32, &mut out).is_none());
        assert!(cast_row(&[1, 2, 3], DType::F32, DType::F32, &mut out).is_none());
    }
}
