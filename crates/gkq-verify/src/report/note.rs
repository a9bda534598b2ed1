//! What a check notes without failing.

use gkq_format::DType;

/// Information that does not fail a check.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Note {
    /// A block narrower than its source, by the publisher's choice.
    Lossy {
        /// The tensor.
        tensor: String,
        /// The block's dtype.
        block: String,
        /// The source's dtype.
        source: DType,
        /// The largest error.
        max_error: f64,
    },
    /// A spectral block whose error the knot does not record.
    SpectralUnrecorded {
        /// The tensor.
        tensor: String,
        /// The error measured.
        measured: f64,
    },
    /// A spectral block whose error is as recorded.
    SpectralAsRecorded {
        /// The tensor.
        tensor: String,
        /// Its rank.
        rank: usize,
        /// The error measured.
        measured: f64,
        /// `spectral.energy_kept` as recorded.
        energy: f64,
    },
    /// A quantized block whose errors the knot does not record.
    QuantUnrecorded {
        /// The tensor.
        tensor: String,
        /// Its block type.
        dtype: DType,
        /// The root mean square error measured.
        rmse: f64,
        /// The largest absolute error measured.
        max_abs_error: f64,
    },
    /// A quantized block, re-quantized to the same bytes, whose errors are as recorded.
    QuantAsRecorded {
        /// The tensor.
        tensor: String,
        /// Its block type.
        dtype: DType,
        /// The root mean square error measured.
        rmse: f64,
        /// The largest absolute error measured.
        max_abs_error: f64,
    },
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Note::Lossy {
                tensor,
                block,
                source,
                max_error,
            } => write!(
                f,
                "tensor {tensor:?} is lossy: the knot holds it as {block}, narrower than its source {source} (largest error {max_error:e}); every value is the documented cast"
            ),
            Note::SpectralUnrecorded { tensor, measured } => write!(
                f,
                "spectral block {tensor:?}: relative Frobenius error {measured:.4e} against the source (the knot records none)"
            ),
            Note::SpectralAsRecorded {
                tensor,
                rank,
                measured,
                energy,
            } => write!(
                f,
                "spectral block {tensor:?} (rank {rank}): relative Frobenius error {measured:.4e} against the source, as recorded; energy kept {energy}"
            ),
            Note::QuantUnrecorded {
                tensor,
                dtype,
                rmse,
                max_abs_error,
            } => write!(
                f,
                "{dtype} block {tensor:?}: rmse {rmse:.4e}, max abs error {max_abs_error:.4e} against the source (the knot records none)"
            ),
            Note::QuantAsRecorded {
                tensor,
                dtype,
                rmse,
                max_abs_error,
            } => write!(
                f,
                "{dtype} block {tensor:?}: rmse {rmse:.4e}, max abs error {max_abs_error:.4e} against the source, as recorded"
            ),
        }
    }
}
