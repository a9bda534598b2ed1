//! The two SVDs gkq-pack takes (`--analyze`, `--spectral`), with `faer` in
//! f64 on one thread. `faer` is the `spectral` feature (on by default): a
//! build without it (`cargo xtask demo` builds that one, to start sooner)
//! packs dense and refuses these two flags, naming the feature.

use crate::error::{PackError, Result};

#[cfg(feature = "spectral")]
/// The thin SVD of a row-major `m × n` matrix in f64 on one thread:
/// `(U m×d, σ d, V n×d)` with `d = min(m, n)`, σ non-increasing.
pub(crate) fn thin_svd(
    values: &[f64],
    m: usize,
    n: usize,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let mat = faer::Mat::<f64>::from_fn(m, n, |i, j| values[i * n + j]);
    let svd = mat
        .thin_svd()
        .map_err(|e| PackError::Dtype(format!("SVD did not converge: {e:?}")))?;
    let d = m.min(n);
    let (u, s, v) = (svd.U(), svd.S().column_vector(), svd.V());
    let mut uu = Vec::with_capacity(m * d);
    for i in 0..m {
        uu.extend((0..d).map(|k| u[(i, k)]));
    }
    let mut vv = Vec::with_capacity(n * d);
    for j in 0..n {
        vv.extend((0..d).map(|k| v[(j, k)]));
    }
    Ok((uu, (0..d).map(|k| s[k]).collect(), vv))
}

#[cfg(feature = "spectral")]
/// Singular values of a row-major `m × n` matrix, in f64, on one thread.
pub(crate) fn singular_values(values: &[f64], m: usize, n: usize) -> Result<Vec<f64>> {
    let mat = faer::Mat::<f64>::from_fn(m, n, |i, j| values[i * n + j]);
    let s = mat
        .as_ref()
        .singular_values()
        .map_err(|e| PackError::Dtype(format!("SVD did not converge: {e:?}")))?;
    Ok(s)
}

#[cfg(not(feature = "spectral"))]
fn without() -> PackError {
    PackError::NoSpectral
}

/// Without the `spectral` feature: the error that names it.
#[cfg(not(feature = "spectral"))]
pub(crate) fn thin_svd(
    _values: &[f64],
    _m: usize,
    _n: usize,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    Err(without())
}

/// Without the `spectral` feature: the error that names it.
#[cfg(not(feature = "spectral"))]
pub(crate) fn singular_values(_values: &[f64], _m: usize, _n: usize) -> Result<Vec<f64>> {
    Err(without())
}
