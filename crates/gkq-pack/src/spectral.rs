//! `gkq-pack --spectral PATTERN=SPEC` (issue 14): matching tensors become
//! rank-K `SPECTRAL` blocks (docs/FORMAT.md section 5).
//!
//! A pre-pass, before the knot is laid out (a payload's length must be
//! known then), reads each matching tensor, takes its thin SVD with `faer`
//! in f64 on one thread (faer's default algorithm, built without rayon),
//! keeps K singular triplets, makes their signs canonical (the entry of
//! largest magnitude of each column of U is positive), rounds U, S and Vt
//! to f32, and encodes them (gkq-format). The payloads stay in memory until
//! the main pass writes them: each is smaller than its dense tensor.
//!
//! The figures recorded (`spectral.*` keys, FORMAT.md 3.1) are the relative
//! Frobenius error of the block as stored (factors rounded or quantised,
//! reconstructed by section 5, cast to the block's dtype) against the source
//! values, and the energy share Σ_{i<K} σ_i² / Σ σ_i² of the f64 SVD.

use std::time::Instant;

use gkq_format::Role;
use gkq_format::{
    Block, DType, Encoding, FrobeniusError, Payload, Quant, SpectralParts, decode_f32,
    reconstruct_spectral,
};
use gkq_source::{SourceModel, SourceTensor};
use rayon::prelude::*;
use serde::Serialize;

use crate::error::{PackError, Result};
use crate::roles::RolePlan;

/// How many singular triplets to keep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// `rank:K`.
    Rank(u32),
    /// `energy:x`: the smallest K keeping at least this share of Σσ².
    Energy(f64),
}

/// One `--spectral PATTERN=SPEC`.
#[derive(Clone, Debug)]
pub struct SpectralSpec {
    /// The argument as given.
    pub arg: String,
    /// The glob over tensor names (`*`, `?`, `[...]`).
    pub pattern: glob::Pattern,
    /// The rank rule.
    pub target: Target,
    /// `quant:u8` gives [`Quant::U8Affine`].
    pub quant: Quant,
    /// `factors:DTYPE` (f32, f16, bf16); default: the tensor's own dtype.
    pub factors: Option<DType>,
}

impl std::str::FromStr for SpectralSpec {
    type Err = PackError;

    /// `PATTERN=rank:K` or `PATTERN=energy:x`, then optionally
    /// `,quant:u8` and `,factors:f32|f16|bf16`.
    fn from_str(arg: &str) -> Result<SpectralSpec> {
        let bad = |reason: String| PackError::SpectralSpec {
            arg: arg.to_owned(),
            reason,
        };
        let (pattern, spec) = arg.rsplit_once('=').ok_or_else(|| {
            bad(
                "expected PATTERN=SPEC, e.g. 'model.layers.*.self_attn.k_proj.weight=rank:64'"
                    .into(),
            )
        })?;
        let pattern = glob::Pattern::new(pattern).map_err(|e| bad(format!("pattern: {e}")))?;
        let (mut target, mut quant, mut factors) = (None, Quant::None, None);
        let mut seen: Vec<(&str, &str)> = Vec::new();
        for part in spec.split(',') {
            let (key, value) = part
                .split_once(':')
                .ok_or_else(|| bad(format!("{part:?} is not KEY:VALUE")))?;
            // rank and energy are one setting: the target
            let slot = if key == "energy" { "rank" } else { key };
            if let Some((_, prev)) = seen.iter().find(|(s, _)| *s == slot) {
                let what = if *prev == key {
                    format!("{key}: is given twice")
                } else {
                    "rank: and energy: both choose the rank; give one".to_owned()
                };
                return Err(bad(what));
            }
            seen.push((slot, key));
            match key {
                "rank" => {
                    let k: u32 = value
                        .parse()
                        .ok()
                        .filter(|&k| k > 0 && k <= gkq_format::layout::MAX_RANK)
                        .ok_or_else(|| bad(format!("rank {value:?} is not in 1..=65536")))?;
                    target = Some(Target::Rank(k));
                }
                "energy" => {
                    let x: f64 = value
                        .parse()
                        .ok()
                        .filter(|x: &f64| *x > 0.0 && *x <= 1.0)
                        .ok_or_else(|| bad(format!("energy {value:?} is not in (0, 1]")))?;
                    target = Some(Target::Energy(x));
                }
                "quant" if value == "u8" => quant = Quant::U8Affine,
                "quant" if value == "none" => quant = Quant::None,
                "quant" => return Err(bad(format!("quant {value:?} is not u8 or none"))),
                "factors" => {
                    let d: DType = value
                        .parse()
                        .ok()
                        .filter(|d: &DType| d.is_castable_float())
                        .ok_or_else(|| bad(format!("factors {value:?} is not f32, f16 or bf16")))?;
                    factors = Some(d);
                }
                _ => {
                    return Err(bad(format!(
                        "unknown key {key:?} (rank, energy, quant, factors)"
                    )));
                }
            }
        }
        let target = target.ok_or_else(|| bad("needs rank:K or energy:x".into()))?;
        if quant == Quant::U8Affine && factors.is_some() {
            return Err(bad("quant:u8 stores u8 factors; drop factors:".into()));
        }
        Ok(SpectralSpec {
            arg: arg.to_owned(),
            pattern,
            target,
            quant,
            factors,
        })
    }
}

/// A spectral block of the pack report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SpectralReport {
    /// Tensor (block) name.
    pub tensor: String,
    /// `[M, N]`.
    pub shape: [u64; 2],
    /// K.
    pub rank: u32,
    /// Dtype of U and Vt as stored (`u8` with quant 1).
    pub factor_dtype: String,
    /// 0 (plain factors) or 1 (u8 per-row affine).
    pub quant: u8,
    /// Payload bytes.
    pub bytes: u64,
    /// Bytes of the tensor dense in its dtype.
    pub dense_bytes: u64,
    /// Recorded in `spectral.rel_frobenius_error`.
    pub rel_frobenius_error: f64,
    /// Recorded in `spectral.energy_kept`.
    pub energy_kept: f64,
    /// Time of the SVD, encoding and error check of this tensor.
    pub seconds: f64,
}

/// A factorised tensor, ready to be written.
pub(crate) struct Factored {
    pub(crate) block: Block,
    pub(crate) payload: Vec<u8>,
    pub(crate) report: SpectralReport,
}

/// The tensors each spec matches, checked: only 2-D float matrices are
/// candidates (a broad pattern skips norms and biases), every spec matches
/// at least one, none is the embedding or lm_head, none is matched twice.
fn matches<'s>(
    src: &'s SourceModel,
    roles: &RolePlan,
    specs: &'s [SpectralSpec],
) -> Result<Vec<(&'s SourceTensor, &'s SpectralSpec)>> {
    let mut out: Vec<(&SourceTensor, &SpectralSpec)> = Vec::new();
    for spec in specs {
        let named: Vec<&SourceTensor> = src
            .tensors
            .iter()
            .filter(|t| spec.pattern.matches(&t.name))
            .collect();
        let matrices: Vec<&SourceTensor> = named
            .iter()
            .copied()
            .filter(|t| t.shape.len() == 2 && t.dtype.is_castable_float() && t.len > 0)
            .collect();
        if matrices.is_empty() {
            return Err(match named.first() {
                None => PackError::SpectralNoMatch {
                    arg: spec.arg.clone(),
                },
                Some(t) => PackError::Spectral {
                    tensor: t.name.clone(),
                    reason: format!(
                        "is {} {:?}, and --spectral {} matches no 2-D float matrix (f32, f16, bf16)",
                        t.dtype, t.shape, spec.arg
                    ),
                },
            });
        }
        for t in matrices {
            let role = if t.name == roles.embed {
                Some(Role::TokenEmbd)
            } else if roles.lm_head.as_deref() == Some(t.name.as_str())
                || roles.lm_head_block.as_deref() == Some(t.name.as_str())
            {
                Some(Role::LmHead)
            } else {
                None
            };
            if let Some(role) = role {
                return Err(PackError::SpectralRefused {
                    arg: spec.arg.clone(),
                    tensor: t.name.clone(),
                    role,
                });
            }
            if let Some((_, other)) = out.iter().find(|(o, _)| o.name == t.name) {
                return Err(PackError::Spectral {
                    tensor: t.name.clone(),
                    reason: format!(
                        "matched by both --spectral {} and --spectral {}",
                        other.arg, spec.arg
                    ),
                });
            }
            out.push((t, spec));
        }
    }
    out.sort_by_key(|(t, _)| src.tensors.iter().position(|s| s.name == t.name));
    Ok(out)
}

/// Factorises every tensor the specs match, several at once, in source order.
pub(crate) fn factor_all(
    src: &SourceModel,
    roles: &RolePlan,
    specs: &[SpectralSpec],
) -> Result<Vec<Factored>> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let chosen = matches(src, roles, specs)?;
    chosen
        .par_iter()
        .map(|(t, spec)| {
            let mut raw = vec![0u8; usize::try_from(t.len).unwrap_or(0)];
            src.read(t, 0, &mut raw)?;
            factor(t, &raw, spec)
        })
        .collect()
}

/// The smallest K keeping at least `share` of Σσ² (σ non-increasing).
pub(crate) fn rank_for_energy(sigma: &[f64], share: f64) -> usize {
    let total: f64 = sigma.iter().map(|s| s * s).sum();
    let mut kept = 0.0;
    for (k, s) in sigma.iter().enumerate() {
        if kept >= share * total {
            return k.max(1);
        }
        kept += s * s;
    }
    sigma.len()
}

/// The K leading singular triplets of a thin SVD (`u` m×d, `v` n×d, row-
/// major) as f32 factors, each column's sign made canonical: the entry of
/// largest magnitude of each kept column of U is positive (V's column
/// flips with it, so U·diag(S)·Vt is unchanged).
fn truncated_factors(
    (u, sigma, v): (&[f64], &[f64], &[f64]),
    (m, n, d): (usize, usize, usize),
    k: usize,
) -> SpectralParts {
    let sign: Vec<f64> = (0..k)
        .map(|c| {
            let mut best = 0.0f64;
            for i in 0..m {
                let x = u[i * d + c];
                if x.abs() > best.abs() {
                    best = x;
                }
            }
            if best < 0.0 { -1.0 } else { 1.0 }
        })
        .collect();
    let mut parts = SpectralParts {
        m,
        n,
        k,
        u: Vec::with_capacity(m * k),
        s: sigma[..k].iter().map(|&x| x as f32).collect(),
        vt: Vec::with_capacity(k * n),
    };
    for i in 0..m {
        parts
            .u
            .extend((0..k).map(|c| (u[i * d + c] * sign[c]) as f32));
    }
    for (c, s) in sign.iter().enumerate() {
        parts.vt.extend((0..n).map(|j| (v[j * d + c] * s) as f32));
    }
    parts
}

/// The block of a factorised tensor (its payload's length known).
fn spectral_block(
    t: &SourceTensor,
    rank: u32,
    factor_dtype: DType,
    quant: Quant,
    len: u64,
) -> Block {
    Block {
        name: t.name.clone(),
        dtype: t.dtype,
        flags: 0,
        shape: t.shape.clone(),
        encoding: Encoding::Spectral {
            rank,
            factor_dtype,
            quant,
            payload: Payload {
                offset: 0,
                len,
                sha256: [0; 32],
            },
        },
        columnar: Vec::new(),
    }
}

/// The relative Frobenius error of the block as a node will reconstruct it
/// (FORMAT.md section 5, cast to the block's dtype) against `source`.
fn stored_error(block: &Block, payload: &[u8], source: &[f32]) -> std::result::Result<f64, String> {
    let stored = reconstruct_spectral(block, payload).map_err(|e| e.to_string())?;
    let mut approx = Vec::new();
    decode_f32(&stored, block.dtype, &mut approx);
    let mut err = FrobeniusError::default();
    err.add(&approx, source);
    Ok(err.relative())
}

fn factor(t: &SourceTensor, raw: &[u8], spec: &SpectralSpec) -> Result<Factored> {
    let started = Instant::now();
    let (m, n) = (t.shape[0] as usize, t.shape[1] as usize);
    let bad = |reason: String| PackError::Spectral {
        tensor: t.name.clone(),
        reason,
    };
    let mut source = Vec::new();
    decode_f32(raw, t.dtype, &mut source);
    if let Some(i) = source.iter().position(|x| !x.is_finite()) {
        return Err(bad(format!(
            "row {} col {} is {}: no SVD of non-finite values",
            i / n,
            i % n,
            source[i]
        )));
    }
    let wide: Vec<f64> = source.iter().map(|&x| f64::from(x)).collect();
    let (u, sigma, v) = crate::svd::thin_svd(&wide, m, n)?;
    let d = sigma.len();
    let k = match spec.target {
        Target::Rank(k) if k as usize > d => {
            return Err(bad(format!("rank {k} is over min(rows, cols) = {d}")));
        }
        Target::Rank(k) => k as usize,
        Target::Energy(x) => rank_for_energy(&sigma, x),
    };
    let total: f64 = sigma.iter().map(|s| s * s).sum();
    let tail: f64 = sigma[k..].iter().rev().map(|s| s * s).sum();
    let energy_kept = if total > 0.0 {
        (1.0 - tail / total).clamp(0.0, 1.0)
    } else {
        1.0
    };
    let parts = truncated_factors((&u, &sigma, &v), (m, n, d), k);
    let factor_dtype = match spec.quant {
        Quant::U8Affine => DType::U8,
        Quant::None => spec.factors.unwrap_or(t.dtype),
    };
    let payload = parts
        .encode(factor_dtype, spec.quant)
        .map_err(|e| bad(e.to_string()))?;
    let dense_bytes = t.len;
    if payload.len() as u64 >= dense_bytes {
        return Err(bad(format!(
            "a rank-{k} spectral block ({} bytes, {factor_dtype} factors) is not smaller than the dense tensor ({dense_bytes} bytes); choose a lower rank, 16-bit factors or quant:u8",
            payload.len()
        )));
    }
    let rank = u32::try_from(k).map_err(|_| bad("rank too large".into()))?;
    let block = spectral_block(t, rank, factor_dtype, spec.quant, payload.len() as u64);
    let rel_frobenius_error = stored_error(&block, &payload, &source).map_err(bad)?;
    let report = SpectralReport {
        tensor: t.name.clone(),
        shape: [t.shape[0], t.shape[1]],
        rank: k as u32,
        factor_dtype: factor_dtype.to_string(),
        quant: u8::from(spec.quant == Quant::U8Affine),
        bytes: payload.len() as u64,
        dense_bytes,
        rel_frobenius_error,
        energy_kept,
        seconds: started.elapsed().as_secs_f64(),
    };
    Ok(Factored {
        block,
        payload,
        report,
    })
}
