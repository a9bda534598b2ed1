//! The documented casts of docs/FORMAT.md section 6.

use half::{bf16, f16};

use crate::dtype::DType;

/// What a cast did to one run of elements.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CastReport {
    /// Largest `|x - cast(x)|` over finite inputs.
    pub max_abs_error: f64,
    /// Element index (within the run) of the first finite input that the
    /// target cannot hold: `|x| > 65504` for f16, a value rounding to
    /// infinity for bf16.
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

fn read_f32(chunk: &[u8], dtype: DType) -> f32 {
    match (dtype, chunk) {
        (DType::F32, [a, b, c, d]) => f32::from_le_bytes([*a, *b, *c, *d]),
        (DType::F16, [a, b]) => f16::from_le_bytes([*a, *b]).to_f32(),
        (DType::BF16, [a, b]) => bf16::from_le_bytes([*a, *b]).to_f32(),
        _ => f32::NAN,
    }
}

/// Decodes f32/f16/bf16 little-endian bytes into `out` (cleared first).
/// Returns `false` if `dtype` is not one of those or `src` is not whole elements.
pub fn decode_f32(src: &[u8], dtype: DType, out: &mut Vec<f32>) -> bool {
    out.clear();
    let size = usize::try_from(dtype.itemsize()).unwrap_or(1);
    if !dtype.is_castable_float() || !src.len().is_multiple_of(size) {
        return false;
    }
    out.extend(src.chunks_exact(size).map(|c| read_f32(c, dtype)));
    true
}

/// Casts whole elements of `src` (in `from`) to `to`, appending to `out`.
///
/// Same dtype: a byte copy. Otherwise both must be f32/f16/bf16; narrowing
/// rounds to nearest, ties to even. Returns `None` if the dtypes cannot be
/// cast or `src` is not whole elements.
pub fn cast_row(src: &[u8], from: DType, to: DType, out: &mut Vec<u8>) -> Option<CastReport> {
    let size = usize::try_from(from.itemsize()).ok()?;
    if !src.len().is_multiple_of(size) {
        return None;
    }
    if from == to {
        out.extend_from_slice(src);
        return Some(CastReport::default());
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
        // Widening is exact: no error to track.
        (DType::BF16, DType::F32) => {
            for (d, s) in pairs {
                let bits = u32::from(u16::from_le_bytes([
                    s.first().copied()?,
                    s.get(1).copied()?,
                ])) << 16;
                d.copy_from_slice(&bits.to_le_bytes());
            }
        }
        (DType::F16, DType::F32) => {
            for (d, s) in pairs {
                let x = f16::from_le_bytes([s.first().copied()?, s.get(1).copied()?]).to_f32();
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        _ => {
            for (i, (d, s)) in pairs.enumerate() {
                let x = read_f32(s, from);
                let (bytes, back): ([u8; 2], f32) = match to {
                    DType::F16 => {
                        let h = f16::from_f32(x);
                        if x.is_finite()
                            && x.abs() > f16::MAX.to_f32()
                            && report.first_overflow.is_none()
                        {
                            report.first_overflow = Some(i);
                        }
                        (h.to_le_bytes(), h.to_f32())
                    }
                    _ => {
                        let h = bf16::from_f32(x);
                        if x.is_finite() && h.is_infinite() && report.first_overflow.is_none() {
                            report.first_overflow = Some(i);
                        }
                        (h.to_le_bytes(), h.to_f32())
                    }
                };
                if x.is_finite() && back.is_finite() {
                    report.max_abs_error = report.max_abs_error.max(f64::from((x - back).abs()));
                }
                d.copy_from_slice(&bytes);
            }
        }
    }
    Some(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
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
    fn integers_pass_through_only() {
        let mut out = Vec::new();
        assert!(cast_row(&[1, 2, 3, 4], DType::I32, DType::I32, &mut out).is_some());
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(cast_row(&[1, 2, 3, 4], DType::I32, DType::F32, &mut out).is_none());
        assert!(cast_row(&[1, 2, 3], DType::F32, DType::F32, &mut out).is_none());
    }
}
