//! Quantizing weights: `gkq_format::quant::quantize_seen` (the reference
//! quantizers, FORMAT.md 3.5), with AVX2 forms of the 32-value types' where
//! the CPU has them (`weights_x86.rs`). They give the reference's bytes
//! and dequantized values bit for bit: the same operations on each value,
//! in the same order, eight values at a time (the tests below hold them to it
//! on random blocks and on the values the reference branches on).

use gkq_format::DType;
use gkq_format::quant;

/// Quantizes `src` (whole blocks of values) to `dtype`, appending the
/// blocks to `out`, and hands the values and the values their blocks
/// dequantize to, a few blocks at a time, to `seen`: what
/// [`gkq_format::quant::quantize_seen`] does, with the same bytes and
/// values, on this CPU's fastest form of the type's quantizer. `false`
/// when `dtype` is not a block type or `src` is not whole blocks.
pub fn quantize_seen(
    src: &[f32],
    dtype: DType,
    out: &mut Vec<u8>,
    seen: impl FnMut(&[f32], &[f32]),
) -> bool {
    match fast(dtype) {
        Some(block) => quant::quantize_seen_by(src, dtype, out, block, seen),
        None => quant::quantize_seen(src, dtype, out, seen),
    }
}

/// The fast quantizer of `dtype` on this CPU, if it has one.
fn fast(dtype: DType) -> Option<crate::Quantizer> {
    #[cfg(target_arch = "x86_64")]
    if crate::avx2::available() {
        return crate::weights_x86::block(dtype);
    }
    let _ = dtype;
    None
}

/// Lanes of [`Differences`]: value `i` of a call adds to lane `i % 8`.
pub const DIFF_LANES: usize = 8;

/// The squared and the largest differences of dequantized values from
/// their source, in f64, by lanes ([`DIFF_LANES`]): the lanes are added
/// in order at the end, so the figures do not depend on the machine, the
/// threads or how the values are handed in.
#[derive(Clone, Copy, Debug, Default)]
pub struct Differences {
    /// Σ (x − y)² of each lane.
    pub sum: [f64; DIFF_LANES],
    /// The largest |x − y| of each lane.
    pub max: [f64; DIFF_LANES],
}

impl Differences {
    /// Adds `y` against `x` (of one length, a multiple of [`DIFF_LANES`]),
    /// each difference `|f64(x) − f64(y)|` squared into its lane's sum and
    /// compared with its maximum. `false`, with nothing added, when a value
    /// of either is not finite (or the lengths are not as said).
    pub fn add(&mut self, x: &[f32], y: &[f32]) -> bool {
        if x.len() != y.len() || !x.len().is_multiple_of(DIFF_LANES) {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        if crate::avx2::available() {
            return crate::weights_x86::add_differences(&mut self.sum, &mut self.max, x, y);
        }
        self.add_portable(x, y)
    }

    /// [`Differences::add`] on any CPU (lengths checked by the caller).
    fn add_portable(&mut self, x: &[f32], y: &[f32]) -> bool {
        let finite = |v: &[f32]| v.iter().fold(true, |ok, v| ok & v.is_finite());
        if !(finite(x) & finite(y)) {
            return false;
        }
        for (a, b) in x.chunks_exact(DIFF_LANES).zip(y.chunks_exact(DIFF_LANES)) {
            for k in 0..DIFF_LANES {
                let d = (f64::from(a[k]) - f64::from(b[k])).abs();
                self.sum[k] += d * d;
                self.max[k] = if d > self.max[k] { d } else { self.max[k] };
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::noise;
    use gkq_format::quant::QK;

    /// A `quantize_seen`, ours or the reference.
    type Quantizer = fn(&[f32], DType, &mut Vec<u8>, &mut dyn FnMut(&[f32], &[f32])) -> bool;

    /// Bytes and dequantized values (as bits) of `x` by `f`.
    fn run(f: Quantizer, x: &[f32], dtype: DType) -> (Vec<u8>, Vec<u32>) {
        let (mut out, mut y) = (vec![7u8], Vec::new());
        assert!(f(x, dtype, &mut out, &mut |_, v| y
            .extend(v.iter().map(|v| v.to_bits()))));
        (out, y)
    }

    /// Blocks on which the reference branches: zeros of both signs, ties
    /// of magnitude with either sign first, NaN, infinities, subnormals
    /// (a scale whose inverse overflows), magnitudes whose scale overflows
    /// f16, and products a half from an integer.
    fn edge_blocks() -> Vec<f32> {
        let mut v: Vec<[f32; QK]> = vec![[0.0; QK], [-0.0; QK]];
        let ramp: [f32; QK] = std::array::from_fn(|i| i as f32 - 15.5);
        for (at, x) in [
            (3, f32::NAN),
            (31, f32::NAN),
            (0, f32::INFINITY),
            (31, f32::NEG_INFINITY),
            (9, 1e-40),
            (5, 7e5),
            (5, -7e5),
            (17, 3e38),
        ] {
            let mut b = ramp;
            b[at] = x;
            v.push(b);
        }
        let mut tie = ramp;
        (tie[2], tie[30]) = (-16.0, 16.0);
        v.push(tie);
        v.push(std::array::from_fn(|i| if i == 4 { 1e-40 } else { 0.0 }));
        v.push(std::array::from_fn(|i| [f32::NAN, 0.0, -0.0][i % 3]));
        v.push([f32::NAN; QK]);
        // extremes that are zeros of both signs: the first one is kept
        v.push(std::array::from_fn(|i| [0.0, -0.0][i % 2]));
        let up: [f32; QK] = std::array::from_fn(|i| [-0.0, 0.0].get(i).map_or(i as f32, |z| *z));
        v.push(up);
        v.push(up.map(|x| -x));
        // amax 127: the inverse scale is 1, so these are exact halves
        v.push(std::array::from_fn(|i| {
            [127.0, 2.5, -2.5, 0.5, -0.5, 126.5][i % 6]
        }));
        v.push(std::array::from_fn(|i| (i as f32 - 8.0) * 0.5));
        v.concat()
    }

    /// This CPU's quantizers give the reference's bytes and values bit for
    /// bit, on random blocks of several magnitudes and on the edges above.
    #[test]
    fn quantizers_equal_the_reference() {
        let mut x = Vec::new();
        for (i, scale) in [1e-30f32, 1e-6, 0.02, 1.0, 300.0, 6e4, 1e6]
            .iter()
            .enumerate()
        {
            x.extend(noise(QK * 64, i as u64).iter().map(|v| v * scale));
        }
        x.extend(edge_blocks());
        x.extend(noise(3 * QK, 99)); // past a multiple of the 1,024 handed on
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::Q6_K, // the reference's own, in whole blocks of 256
        ] {
            let block = dtype.block().map_or(1, |(values, _)| values as usize);
            let x = &x[..x.len() / block * block];
            let ours = run(|x, t, o, f| quantize_seen(x, t, o, f), x, dtype);
            let theirs = run(|x, t, o, f| quant::quantize_seen(x, t, o, f), x, dtype);
            assert_eq!(ours.0, theirs.0, "{dtype:?} bytes");
            assert_eq!(ours.1, theirs.1, "{dtype:?} dequantized values");
        }
        let mut out = Vec::new();
        assert!(!quantize_seen(
            &x[..QK + 1],
            DType::Q4_0,
            &mut out,
            |_, _| {}
        ));
        assert!(!quantize_seen(&x[..QK], DType::F16, &mut out, |_, _| {}));
        assert!(out.is_empty());
    }

    /// This CPU's differences are the portable loop's bit for bit, and
    /// neither adds anything when a value is not finite.
    #[test]
    fn differences_equal_the_portable_loop() {
        let x = noise(8 * 301, 5);
        let y: Vec<f32> = x.iter().map(|v| v * 0.97 + 1e-3).collect();
        let (mut ours, mut theirs) = (Differences::default(), Differences::default());
        for (x, y) in x.chunks(8 * 40).zip(y.chunks(8 * 40)) {
            assert!(ours.add(x, y) && theirs.add_portable(x, y));
        }
        let bits = |d: &Differences| (d.sum.map(f64::to_bits), d.max.map(f64::to_bits));
        assert_eq!(bits(&ours), bits(&theirs));
        assert!(ours.sum.iter().all(|&s| s > 0.0));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut z = y.clone();
            z[8 * 300 + 5] = bad;
            let before = bits(&ours);
            assert!(!ours.add(&x, &z) && !theirs.add_portable(&x, &z));
            assert!(!ours.add(&z, &x));
            assert_eq!(bits(&ours), before, "nothing added");
        }
        assert!(!ours.add(&x[..9], &y[..9]) && !ours.add(&x[..8], &y[..16]));
    }
}
