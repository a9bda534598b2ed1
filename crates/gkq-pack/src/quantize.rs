//! Converting whole rows to the type a tensor is stored in (a block type,
//! or f16 for a fallback), with what it cost: the squared and largest
//! errors against the source, and the first value that was not finite or
//! did not stay finite. Groups of rows are converted in parallel; their
//! figures are combined in row order, so the result does not depend on the
//! number of threads.

use gkq_format::{DType, cast_row, decode_f32};
use rayon::prelude::*;

/// Rows per rayon task.
const ROWS_PER_TASK: usize = 64;

/// What converting some rows measured (positions where the source or the
/// stored value is not finite are left out of the errors).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Measure {
    /// Σ (source − stored)², in f64.
    pub(crate) sum_sq: f64,
    /// Values compared.
    pub(crate) count: u64,
    /// The largest |source − stored|.
    pub(crate) max_abs: f64,
    /// The first source value that is NaN or infinite (element index).
    pub(crate) first_nonfinite: Option<u64>,
    /// The first finite source value whose stored value is not finite.
    pub(crate) first_overflow: Option<u64>,
}

impl Measure {
    /// Adds `other`, whose element indexes start at `offset`.
    pub(crate) fn merge(&mut self, other: Measure, offset: u64) {
        self.sum_sq += other.sum_sq;
        self.count += other.count;
        self.max_abs = self.max_abs.max(other.max_abs);
        let first = |a: Option<u64>, b: Option<u64>| a.or(b.map(|i| i + offset));
        self.first_nonfinite = first(self.first_nonfinite, other.first_nonfinite);
        self.first_overflow = first(self.first_overflow, other.first_overflow);
    }

    /// The root mean square error (0 for no values).
    pub(crate) fn rmse(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            (self.sum_sq / self.count as f64).sqrt()
        }
    }
}

/// `values` (decoded source) stored as `to`, into `out`, and what it cost
/// (a block type's measured block by block, as each is quantized).
fn convert_values(x: &[f32], to: DType, out: &mut Vec<u8>) -> Measure {
    let mut e = Errors::default();
    if to.is_quantized() {
        let whole = gkq_kernels::quantize_seen(x, to, out, |x, y| e.add(x, y));
        debug_assert!(whole, "rows are whole blocks");
    } else {
        let start = out.len();
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        cast_row(&bytes, DType::F32, to, out).expect("f32 casts to a float type");
        let mut y = Vec::with_capacity(x.len());
        decode_f32(&out[start..], to, &mut y);
        e.add(x, &y);
    }
    e.finish()
}

/// Lanes of the error sums: element `i` adds to lane `i % LANES`, and the
/// lanes are added in order at the end, so the sums do not depend on the
/// machine, the thread count or how the values are handed in
/// ([`gkq_kernels::Differences`], which adds the finite ones).
const LANES: usize = gkq_kernels::DIFF_LANES;

/// The errors of stored values against their source, as they come: over
/// the positions where both are finite, and the first non-finite of each.
#[derive(Default)]
struct Errors {
    lanes: gkq_kernels::Differences,
    count: [u64; LANES],
    /// Values added so far.
    seen: u64,
    first_nonfinite: Option<u64>,
    first_overflow: Option<u64>,
}

impl Errors {
    /// Adds `y` (stored) against `x` (source): a multiple of [`LANES`]
    /// values, but for the last call.
    fn add(&mut self, x: &[f32], y: &[f32]) {
        let whole = x.len() / LANES * LANES;
        let ((xs, x_tail), (ys, y_tail)) = (x.split_at(whole), y.split_at(whole));
        let finite = |v: &[f32]| v.iter().all(|v| v.is_finite());
        // the usual case: every value finite, the whole lanes in SIMD
        if finite(x_tail) && finite(y_tail) && self.lanes.add(xs, ys) {
            let n = (whole / LANES) as u64;
            self.count.iter_mut().for_each(|c| *c += n);
            for (k, (&a, &b)) in x_tail.iter().zip(y_tail).enumerate() {
                self.one(k, a, b);
            }
        } else {
            for (i, (&a, &b)) in x.iter().zip(y).enumerate() {
                if a.is_finite() && b.is_finite() {
                    self.one(i % LANES, a, b);
                }
            }
            let at = |i: Option<usize>| i.map(|i| self.seen + i as u64);
            let nonfinite = at(x.iter().position(|a| !a.is_finite()));
            let overflow = at(x
                .iter()
                .zip(y)
                .position(|(a, b)| a.is_finite() && !b.is_finite()));
            self.first_nonfinite = self.first_nonfinite.or(nonfinite);
            self.first_overflow = self.first_overflow.or(overflow);
        }
        self.seen += x.len() as u64;
    }

    /// One pair of finite values, in lane `k`.
    fn one(&mut self, k: usize, a: f32, b: f32) {
        let d = (f64::from(a) - f64::from(b)).abs();
        self.lanes.sum[k] += d * d;
        self.lanes.max[k] = self.lanes.max[k].max(d);
        self.count[k] += 1;
    }

    fn finish(self) -> Measure {
        Measure {
            sum_sq: self.lanes.sum.iter().sum(),
            count: self.count.iter().sum(),
            max_abs: self.lanes.max.iter().fold(0.0, |a, &b| a.max(b)),
            first_nonfinite: self.first_nonfinite,
            first_overflow: self.first_overflow,
        }
    }
}

/// Converts whole rows of `cols` values of `src` (in `from`, a float type,
/// or a block type dequantized first: `--allow-requantize`)
/// to `to` (a block type, or a float type). Returns the bytes and what the
/// conversion measured.
pub(crate) fn convert_rows(src: &[u8], from: DType, to: DType, cols: usize) -> (Vec<u8>, Measure) {
    let in_row = from.row_bytes(cols as u64).unwrap_or(0) as usize;
    let per_task = in_row.max(1) * ROWS_PER_TASK;
    let parts: Vec<(Vec<u8>, Measure)> = src
        .par_chunks(per_task)
        .map(|c| {
            let mut x = Vec::new();
            decode_f32(c, from, &mut x);
            let mut out = Vec::new();
            let m = convert_values(&x, to, &mut out);
            (out, m)
        })
        .collect();
    let mut total = Measure::default();
    let mut bytes = Vec::with_capacity(parts.iter().map(|p| p.0.len()).sum());
    let per_elems = (cols * ROWS_PER_TASK) as u64;
    for (i, (b, m)) in parts.into_iter().enumerate() {
        total.merge(m, i as u64 * per_elems);
        bytes.extend_from_slice(&b);
    }
    (bytes, total)
}

/// A figure of `quant.rmse` or `quant.max_abs_error` as written: a decimal
/// of exactly [`FIGURE_WIDTH`] characters (rounded at its last place), so
/// that the header's size is known before the figures are measured.
pub(crate) fn figure(x: f64) -> String {
    let int_digits = format!("{:.0}", x.trunc()).len();
    let frac = FIGURE_WIDTH.saturating_sub(int_digits + 1).max(1);
    let s = format!("{x:.frac$}");
    // rounding up can add a digit (9.99… → 10.0…): drop the last one
    if s.len() > FIGURE_WIDTH && frac > 1 {
        return format!("{x:.prec$}", prec = frac - 1);
    }
    s
}

/// Characters of a written figure: 12 places at the least for errors below
/// 10^10 (the largest a finite block-type value can be off by is below
/// 10^9), far inside the verifier's tolerance of 1e-4 relative + 1e-9.
pub(crate) const FIGURE_WIDTH: usize = 24;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_have_one_width_and_read_back_close() {
        for x in [
            0.0,
            1e-30,
            3.25e-4,
            0.5,
            9.999_999_999_999_99,
            12.0,
            123_456_789.25,
        ] {
            let s = figure(x);
            assert_eq!(s.len(), FIGURE_WIDTH, "{x}: {s}");
            let back: f64 = s.parse().expect("a decimal");
            assert!((back - x).abs() <= 1e-11 * x.max(1.0), "{x}: {s}");
        }
        assert_eq!(figure(0.0), format!("0.{}", "0".repeat(FIGURE_WIDTH - 2)));
    }

    #[test]
    fn figures_do_not_depend_on_the_thread_count() {
        let cols = 256;
        let x: Vec<f32> = (0..cols * 300)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 300.0)
            .collect();
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let run = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool")
                .install(|| convert_rows(&bytes, DType::F32, DType::Q4_K, cols))
        };
        let (a, ma) = run(1);
        let (b, mb) = run(3);
        assert_eq!(a, b);
        assert_eq!(ma.sum_sq.to_bits(), mb.sum_sq.to_bits());
        assert_eq!(ma.max_abs.to_bits(), mb.max_abs.to_bits());
        assert_eq!(ma.count, (cols * 300) as u64);
    }

    #[test]
    fn nonfinite_values_are_found_and_left_out() {
        let mut x = vec![0.25f32; 64];
        x[40] = f32::NAN;
        x[41] = f32::INFINITY;
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let (_, m) = convert_rows(&bytes, DType::F32, DType::Q8_0, 32);
        assert_eq!(m.first_nonfinite, Some(40));
        let big: Vec<u8> = [1e30f32; 32].iter().flat_map(|v| v.to_le_bytes()).collect();
        let (_, m) = convert_rows(&big, DType::F32, DType::Q8_0, 32);
        assert_eq!(m.first_overflow, Some(0));
        assert_eq!(m.count, 0);
    }
}
