//! A quantized block against its source tensor (`--source`): the bytes are
//! compared by the source check (re-quantized, they must be the same);
//! here the error figures are measured again, the dequantized values
//! against the source's, and compared with `quant.rmse` and
//! `quant.max_abs_error` (FORMAT.md 3.5) within the spectral figures'
//! tolerance.

use gkq_format::{Block, DType, Knot, decode_f32};

use super::spectral::SPECTRAL_ERROR_TOLERANCE;
use crate::report::{CheckFindings, Note};

/// Sums of one quantized block's errors, chunk by chunk.
pub(crate) struct QuantCheck<'k> {
    block: &'k Block,
    sum_sq: f64,
    count: u64,
    max_abs: f64,
}

impl<'k> QuantCheck<'k> {
    /// The check of a dense block of a block type.
    pub(crate) fn new(block: &'k Block) -> Option<QuantCheck<'k>> {
        block.dtype.is_quantized().then_some(QuantCheck {
            block,
            sum_sq: 0.0,
            count: 0,
            max_abs: 0.0,
        })
    }

    /// Adds whole source rows `chunk` (in `from`) against the block's
    /// bytes `got` for the same rows (positions where either value is not
    /// finite are left out, as writers leave them out).
    pub(crate) fn add(&mut self, chunk: &[u8], from: DType, got: &[u8]) {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        if !decode_f32(chunk, from, &mut x) || !decode_f32(got, self.block.dtype, &mut y) {
            return;
        }
        for (&a, &b) in x.iter().zip(&y) {
            if a.is_finite() && b.is_finite() {
                let d = f64::from(a) - f64::from(b);
                self.sum_sq += d * d;
                self.max_abs = self.max_abs.max(d.abs());
                self.count += 1;
            }
        }
    }

    /// Compares the measured figures with the recorded ones.
    pub(crate) fn finish(self, knot: &Knot<'_>, object: &str, acc: &mut CheckFindings) {
        let rmse = if self.count == 0 {
            0.0
        } else {
            (self.sum_sq / self.count as f64).sqrt()
        };
        let header = knot.header().header();
        let figures = header.quant_figures();
        let name = &self.block.name;
        let Some(f) = figures.iter().find(|f| f.block == name) else {
            let note = Note::QuantUnrecorded {
                tensor: name.clone(),
                dtype: self.block.dtype,
                rmse,
                max_abs_error: self.max_abs,
            };
            acc.note(object, note);
            return;
        };
        let checks = [
            (
                gkq_format::keys::QUANT_RMSE,
                "root mean square error",
                f.rmse,
                rmse,
            ),
            (
                gkq_format::keys::QUANT_MAX_ABS_ERROR,
                "largest absolute error",
                f.max_abs_error,
                self.max_abs,
            ),
        ];
        let mut ok = true;
        for (key, what, recorded, measured) in checks {
            if (measured - recorded).abs() > SPECTRAL_ERROR_TOLERANCE * recorded + 1e-9 {
                ok = false;
                let e = gkq_format::Error::FigureMismatch {
                    block: name.clone(),
                    key,
                    what,
                    recorded,
                    measured,
                    tolerance: SPECTRAL_ERROR_TOLERANCE,
                };
                acc.fail(object, e);
            }
        }
        if ok {
            let note = Note::QuantAsRecorded {
                tensor: name.clone(),
                dtype: self.block.dtype,
                rmse,
                max_abs_error: self.max_abs,
            };
            acc.note(object, note);
        }
    }
}
