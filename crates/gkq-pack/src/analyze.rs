//! `gkq-pack --analyze` (issue 14, part 1): the singular value spectrum of
//! every 2-D float tensor of a model, to tell a publisher where a spectral
//! block (docs/FORMAT.md section 5) would be safe. Nothing is written.
//!
//! Singular values come from `faer` (one thread, so the figures do not
//! depend on the machine's core count), computed in **f64** from the
//! source values widened exactly. By Eckart–Young, the best rank-k
//! approximation keeps the k largest singular values, so everything below
//! follows from them: the energy kept `Σ_{i<k} σ_i² / Σ σ_i²` and the
//! relative Frobenius error `sqrt(1 - energy)`.

use std::path::Path;

use gkq_format::{DType, Role};
use gkq_source::{SourceModel, hub};
use serde::Serialize;

use crate::error::Result;
use crate::roles;

/// The ranks the report evaluates.
pub const RANKS: [u64; 4] = [32, 64, 128, 256];
/// The energy fractions whose rank the report gives.
pub const ENERGIES: [f64; 3] = [0.99, 0.999, 0.9999];

/// One rank's figures.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AtRank {
    /// The rank (capped at `min(rows, cols)`).
    pub rank: u64,
    /// `||W - W_k||_F / ||W||_F`.
    pub rel_frobenius_error: f64,
    /// Bytes of a quant-0 spectral block with 16-bit (f16/bf16) factors:
    /// `2·(M·K + K·N) + 4·K`.
    pub bytes_quant0_16bit: u64,
    /// Bytes of a quant-0 spectral block with f32 factors: `4·(M·K + K·N) + 4·K`.
    pub bytes_quant0_f32: u64,
    /// Bytes of a quant-1 (u8 per-row affine) spectral block:
    /// `M·K + K·N + 8·M + 12·K`.
    pub bytes_quant1: u64,
}

/// The analysis of one tensor.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TensorAnalysis {
    /// Tensor name.
    pub tensor: String,
    /// `token_embd`, `lm_head`, or none.
    pub role: Option<String>,
    /// Source dtype.
    pub dtype: String,
    /// `[M, N]`.
    pub shape: [u64; 2],
    /// Bytes of the dense tensor in its source dtype.
    pub dense_bytes: u64,
    /// Smallest rank keeping 99 %, 99.9 % and 99.99 % of the energy (Σσ²).
    pub rank_for_energy: [u64; 3],
    /// The figures at ranks 32, 64, 128 and 256.
    pub at_rank: Vec<AtRank>,
    /// The largest singular value.
    pub sigma_max: f64,
    /// Time to read this tensor and compute its singular values.
    pub seconds: f64,
}

/// What `--analyze` prints.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AnalyzeReport {
    /// How the figures were computed.
    pub method: String,
    /// Every 2-D float tensor, in source order.
    pub tensors: Vec<TensorAnalysis>,
}

/// The figures of a matrix with singular values `sigma` (any order).
pub(crate) fn analyze_spectrum(
    tensor: &str,
    dtype: DType,
    (m, n): (u64, u64),
    mut sigma: Vec<f64>,
) -> TensorAnalysis {
    sigma.sort_by(|a, b| b.total_cmp(a));
    let energy: Vec<f64> = sigma.iter().map(|s| s * s).collect();
    let total: f64 = energy.iter().sum();
    let full = sigma.len() as u64;
    let rank_for = |p: f64| -> u64 {
        if total <= 0.0 {
            return 0;
        }
        crate::spectral::rank_for_energy(&sigma, p) as u64
    };
    let err_at = |k: u64| -> f64 {
        if total <= 0.0 {
            return 0.0;
        }
        let k = usize::try_from(k.min(full)).unwrap_or(0);
        // the tail, summed small to large, rather than 1 - kept/total
        let tail: f64 = energy[k..].iter().rev().sum();
        if tail > 0.0 {
            (tail / total).sqrt()
        } else {
            0.0
        }
    };
    let at_rank = RANKS
        .iter()
        .map(|&r| {
            let k = r.min(full);
            AtRank {
                rank: k,
                rel_frobenius_error: err_at(k),
                bytes_quant0_16bit: 2 * (m * k + k * n) + 4 * k,
                bytes_quant0_f32: 4 * (m * k + k * n) + 4 * k,
                bytes_quant1: m * k + k * n + 8 * m + 12 * k,
            }
        })
        .collect();
    TensorAnalysis {
        tensor: tensor.to_owned(),
        role: None,
        dtype: dtype.to_string(),
        shape: [m, n],
        dense_bytes: m * n * dtype.itemsize(),
        rank_for_energy: [
            rank_for(ENERGIES[0]),
            rank_for(ENERGIES[1]),
            rank_for(ENERGIES[2]),
        ],
        at_rank,
        sigma_max: sigma.first().copied().unwrap_or(0.0),
        seconds: 0.0,
    }
}

pub(crate) use crate::svd::singular_values;

/// Analyzes every 2-D float tensor of the model in `model_dir` (a
/// directory, a GGUF file, or an `ORG/NAME` in the local Hugging Face cache).
pub fn analyze(model_dir: &Path, progress: &dyn crate::Progress) -> Result<AnalyzeReport> {
    let located = hub::locate(model_dir)?;
    let src = SourceModel::open(&located.source)?;
    let cfg = crate::model_config(&located, &src)?;
    let roles = roles::decide(&cfg, &src, None, None).ok();
    let chosen: Vec<_> = src
        .tensors
        .iter()
        .filter(|t| t.shape.len() == 2 && t.dtype.is_castable_float() && t.len > 0)
        .collect();
    progress.start(chosen.iter().map(|t| t.len).sum());
    let mut out = Vec::with_capacity(chosen.len());
    let mut raw = Vec::new();
    for t in chosen {
        let started = std::time::Instant::now();
        let (m, n) = (t.shape[0], t.shape[1]);
        raw.resize(usize::try_from(t.len).unwrap_or(0), 0);
        src.read(t, 0, &mut raw)?;
        let mut wide = Vec::new();
        gkq_format::decode_f32(&raw, t.dtype, &mut wide);
        let values: Vec<f64> = wide.iter().map(|&v| f64::from(v)).collect();
        let sigma = singular_values(&values, m as usize, n as usize)?;
        let mut a = analyze_spectrum(&t.name, t.dtype, (m, n), sigma);
        a.role = roles.as_ref().and_then(|r| {
            if t.name == r.embed {
                Some(Role::TokenEmbd.as_str().to_owned())
            } else if r.lm_head.as_deref() == Some(t.name.as_str()) {
                Some(Role::LmHead.as_str().to_owned())
            } else {
                None
            }
        });
        a.seconds = started.elapsed().as_secs_f64();
        out.push(a);
        progress.advance(t.len);
    }
    Ok(AnalyzeReport {
        method: "singular values by faer (one thread) in f64 from the source values widened exactly; errors by Eckart-Young from the singular values".into(),
        tensors: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank-16 matrix plus noise of 1e-4: 99.99 % of the energy needs
    /// rank 16, and the error at rank 32 is the noise's share.
    #[test]
    fn low_rank_plus_noise() {
        let (m, n, r) = (200usize, 120usize, 16usize);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        };
        let u: Vec<f64> = (0..m * r).map(|_| rnd()).collect();
        let v: Vec<f64> = (0..r * n).map(|_| rnd()).collect();
        let mut w = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0;
                for k in 0..r {
                    acc += u[i * r + k] * v[k * n + j];
                }
                w[i * n + j] = acc + 1e-4 * rnd();
            }
        }
        let s = singular_values(&w, m, n).expect("svd");
        let a = analyze_spectrum("w", DType::F32, (m as u64, n as u64), s);
        assert_eq!(a.rank_for_energy[2], 16, "{:?}", a.rank_for_energy);
        assert!(a.rank_for_energy[0] <= 16);
        let e32 = a.at_rank[0].rel_frobenius_error;
        // noise of 1e-4 against entries of size ~ sqrt(16/9): about 1e-4
        assert!(e32 > 1e-5 && e32 < 3e-4, "{e32}");
        assert_eq!(a.at_rank[3].rank, 120, "capped at min(m, n)");
        assert_eq!(a.at_rank[3].rel_frobenius_error, 0.0);
        assert_eq!(
            a.at_rank[0].bytes_quant0_16bit,
            2 * (200 * 32 + 32 * 120) + 4 * 32
        );
        assert_eq!(
            a.at_rank[0].bytes_quant1,
            200 * 32 + 32 * 120 + 8 * 200 + 12 * 32
        );
        assert_eq!(a.dense_bytes, 200 * 120 * 4);
    }
}
