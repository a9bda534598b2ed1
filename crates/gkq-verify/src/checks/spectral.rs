//! A spectral block against its source tensor (`--source`): the
//! reconstruction streamed row by row, cast to the block's dtype as the
//! format stores values, and the relative Frobenius error compared with
//! the one the knot records (`spectral.rel_frobenius_error`); the energy
//! kept, `Σ_{i<K} S_i² / ‖W‖_F²` with the block's singular values `S`,
//! compared with `spectral.energy_kept`.

use gkq_format::{Block, Knot, cast_row};

use crate::report::{CheckFindings, Note};

/// How far the relative Frobenius error measured against `--source` may be
/// from the one recorded in `spectral.rel_frobenius_error` (relative, plus
/// an absolute 1e-9 for errors near 0): room for another summation order,
/// far below what a wrong or swapped factor gives.
pub const SPECTRAL_ERROR_TOLERANCE: f64 = 1e-4;

/// Streams a spectral block's reconstruction against its source tensor.
pub(crate) struct SpectralCheck<'k> {
    block: &'k Block,
    parts: gkq_format::SpectralParts,
    err: gkq_format::FrobeniusError,
    converted: Vec<u8>,
}

impl<'k> SpectralCheck<'k> {
    /// The check of `block`, if its factors decode.
    pub(crate) fn new(block: &'k Block, payload: &[u8]) -> Option<SpectralCheck<'k>> {
        Some(SpectralCheck {
            block,
            parts: gkq_format::SpectralParts::decode(block, payload).ok()?,
            err: gkq_format::FrobeniusError::default(),
            converted: Vec::new(),
        })
    }

    /// Adds `chunk` (whole source rows from `first_row`, in `from`).
    pub(crate) fn add(&mut self, chunk: &[u8], from: gkq_format::DType, first_row: u64) {
        let cols = self.parts.n.max(1);
        let mut exact = Vec::new();
        gkq_format::decode_f32(chunk, from, &mut exact);
        let w = self.parts.rows(first_row as usize, exact.len() / cols);
        let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.converted.clear();
        let mut approx = Vec::new();
        if cast_row(
            &bytes,
            gkq_format::DType::F32,
            self.block.dtype,
            &mut self.converted,
        )
        .is_some()
        {
            gkq_format::decode_f32(&self.converted, self.block.dtype, &mut approx);
        }
        self.err.add(&approx, &exact);
    }

    /// `Σ_{i<K} S_i² / ‖W‖_F²` (1 for an all-zero `W`, as writers record it).
    fn energy_kept(&self) -> f64 {
        let kept: f64 = self.parts.s.iter().map(|&s| f64::from(s).powi(2)).sum();
        let total = self.err.reference_sum_squares();
        if total > 0.0 { kept / total } else { 1.0 }
    }

    /// Compares the measured figures with the recorded ones.
    pub(crate) fn finish(
        self,
        knot: &Knot<'_>,
        tensor: &str,
        object: &str,
        acc: &mut CheckFindings,
    ) {
        let measured = self.err.relative();
        let header = knot.header().header();
        let figures = header.spectral_figures();
        let Some(f) = figures.iter().find(|f| f.block == self.block.name) else {
            let note = Note::SpectralUnrecorded {
                tensor: tensor.to_owned(),
                measured,
            };
            acc.note(object, note);
            return;
        };
        let want = f.rel_frobenius_error;
        let energy = self.energy_kept();
        let off = |measured: f64, want: f64| {
            (measured - want).abs() > SPECTRAL_ERROR_TOLERANCE * want + 1e-9
        };
        if off(energy, f.energy_kept) {
            let e = gkq_format::Error::FigureMismatch {
                block: tensor.to_owned(),
                key: gkq_format::keys::SPECTRAL_ENERGY,
                what: "energy kept (S² summed over the source's squared Frobenius norm)",
                recorded: f.energy_kept,
                measured: energy,
                tolerance: SPECTRAL_ERROR_TOLERANCE,
            };
            acc.fail(object, e);
        }
        if off(measured, want) {
            let e = gkq_format::Error::FigureMismatch {
                block: tensor.to_owned(),
                key: gkq_format::keys::SPECTRAL_REL_ERROR,
                what: "relative Frobenius error",
                recorded: want,
                measured,
                tolerance: SPECTRAL_ERROR_TOLERANCE,
            };
            acc.fail(object, e);
        } else if !off(energy, f.energy_kept) {
            let note = Note::SpectralAsRecorded {
                tensor: tensor.to_owned(),
                rank: self.parts.k,
                measured,
                energy: f.energy_kept,
            };
            acc.note(object, note);
        }
    }
}
