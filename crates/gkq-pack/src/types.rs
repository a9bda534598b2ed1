//! Which type each tensor is stored in (`--quant`, `--token-embedding-type`,
//! `--output-tensor-type`), with llama-quantize's meanings:
//!
//! - `--quant T` stores every 2-D float weight matrix in `T`; 1-D tensors
//!   (norms, biases) and tensors that are not floats stay as they are.
//! - The token embedding takes `--token-embedding-type`, else `T`.
//! - The output projection (lm_head) takes `--output-tensor-type`, else
//!   llama-quantize's default for it: `Q6_K`, or `Q8_0` when `T` is `Q8_0`
//!   or the row length is not a multiple of `T`'s block; `F16` when it is
//!   not a multiple of 32 (where llama-quantize stops with an error).
//! - In a tied model the one tensor is the output: it takes whichever of the
//!   two role types is given (both, differing, is refused), else the
//!   output's default.
//! - A row length that is not a whole number of blocks falls back as
//!   llama.cpp does: `Q4_K` → `Q5_0`, `Q5_K` → `Q5_1`, `Q6_K` → `Q8_0`, then
//!   `F16` if the row is not a multiple of 32 either; a 32-value type to
//!   `F16`. A type given for a role has no fallback: such a tensor is an
//!   error (llama-quantize takes that type as given).
//! - `--quant PRESET` (`presets.rs`) adds llama-quantize's per-layer rules
//!   for `attn_v` and `ffn_down`.

use std::collections::HashMap;

use gkq_format::DType;
use gkq_format::arch::{self, Arch};
use gkq_source::{SourceModel, SourceTensor};
use serde::Serialize;

use crate::error::{PackError, Result};
use crate::roles::RolePlan;

/// The type options of a pack (all `None`: every tensor as today).
#[derive(Clone, Debug, Default)]
pub struct QuantOptions {
    /// `--quant`: the type of the 2-D weight matrices.
    pub weights: Option<DType>,
    /// `--quant PRESET`: llama-quantize's per-tensor rules on top of it.
    pub mix: crate::Mix,
    /// `--token-embedding-type`.
    pub token_embedding: Option<DType>,
    /// `--output-tensor-type`.
    pub output: Option<DType>,
    /// `--allow-nonfinite`: quantize tensors holding NaN or infinities.
    pub allow_nonfinite: bool,
    /// `--allow-requantize`: a tensor of a block type may be stored in
    /// another type (dequantized, then quantized, as llama-quantize does).
    pub allow_requantize: bool,
}

impl QuantOptions {
    /// Whether any type was asked for.
    pub fn any(&self) -> bool {
        self.weights.is_some() || self.token_embedding.is_some() || self.output.is_some()
    }
}

/// A tensor stored in another type than the one asked for, for the report.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Fallback {
    /// The tensor.
    pub tensor: String,
    /// The type asked for.
    pub asked: String,
    /// The type it is stored in.
    pub stored: String,
    /// Why.
    pub reason: String,
}

/// Each tensor's stored type, where the options change it.
#[derive(Debug, Default)]
pub(crate) struct TypePlan {
    types: HashMap<String, DType>,
    pub(crate) fallbacks: Vec<Fallback>,
}

impl TypePlan {
    /// The type `tensor` is stored in, if the options decide it.
    pub(crate) fn of(&self, tensor: &str) -> Option<DType> {
        self.types.get(tensor).copied()
    }
}

/// The output projection's type when none is given (llama-quantize's
/// `llama_tensor_get_type` for `output.weight`), except that rows q8_0
/// cannot hold are f16 here, where llama-quantize stops.
fn default_output(weights: DType, cols: u64) -> DType {
    let fits = weights.row_bytes(cols).is_some();
    if DType::Q8_0.row_bytes(cols).is_none() {
        DType::F16
    } else if !fits || weights == DType::Q8_0 {
        DType::Q8_0
    } else {
        DType::Q6_K
    }
}

/// The lm_head's type for weights in `w`: the default, or `w` itself
/// under `--pure`.
fn output_type(q: &QuantOptions, w: DType, cols: u64) -> DType {
    if q.mix == crate::Mix::Pure {
        w
    } else {
        default_output(w, cols)
    }
}

/// `asked` for a row of `cols` values, or its fallback (with the reason),
/// as llama-quantize's `tensor_type_fallback`: a K type to its 32-value
/// type, then f16; a 32-value type to f16. A type given explicitly for a
/// role (`explicit`) has no fallback, as llama-quantize takes it as given.
fn fit(tensor: &str, asked: DType, cols: u64, explicit: bool) -> Result<(DType, Option<String>)> {
    if asked.row_bytes(cols).is_some() {
        return Ok((asked, None));
    }
    let (per, _) = asked.block().expect("float types hold any row");
    let second = match asked.quant_fallback() {
        Some(d) => d,
        None if !explicit => {
            let why = format!("{cols} values per row are not a multiple of {per}");
            return Ok((DType::F16, Some(why)));
        }
        None => {
            return Err(PackError::QuantShape {
                tensor: tensor.to_owned(),
                dtype: asked,
                cols,
                per,
            });
        }
    };
    let why = format!("{cols} values per row are not a multiple of {per}");
    if second.row_bytes(cols).is_some() {
        return Ok((second, Some(why)));
    }
    Ok((DType::F16, Some(format!("{why}, nor of 32"))))
}

/// llama.cpp's layer count for its mixes: the layers the names number.
fn layer_count(src: &SourceModel, arch: Option<&Arch>) -> usize {
    src.tensors
        .iter()
        .filter_map(|t| arch::layer_part(arch, &t.name))
        .map(|(l, _)| l + 1)
        .max()
        .unwrap_or(0)
}

/// Decides the types of every tensor the options touch.
/// `arch` names the layers' parts (llama.cpp's mixes give some more bits).
pub(crate) fn decide(
    q: &QuantOptions,
    src: &SourceModel,
    roles: &RolePlan,
    arch: Option<&Arch>,
) -> Result<TypePlan> {
    let mut plan = TypePlan::default();
    if !q.any() {
        return Ok(plan);
    }
    let output = src.tensor(roles.lm_head.as_deref().unwrap_or(""));
    let embed_type = if roles.tied {
        match (q.token_embedding, q.output) {
            (Some(a), Some(b)) if a != b => {
                return Err(PackError::TiedTypes {
                    tensor: roles.embed.clone(),
                    embedding: a,
                    output: b,
                });
            }
            (a, b) => a.or(b).or_else(|| {
                q.weights
                    .map(|w| output_type(q, w, cols_of(src, &roles.embed)))
            }),
        }
    } else {
        q.token_embedding.or(q.weights)
    };
    let layers = layer_count(src, arch);
    for t in &src.tensors {
        let is_output = output.is_some_and(|o| o.name == t.name);
        let explicit = (t.name == roles.embed
            && (q.token_embedding.is_some() || (roles.tied && q.output.is_some())))
            || (is_output && q.output.is_some());
        let asked = if t.name == roles.embed {
            embed_type
        } else if is_output {
            q.output
                .or_else(|| q.weights.map(|w| output_type(q, w, t.shape[1])))
        } else if is_weight_matrix(t) {
            let part = arch::layer_part(arch, &t.name);
            q.weights
                .map(|w| crate::presets::mixed(w, q.mix, part, layers))
        } else {
            None
        };
        let Some(asked) = asked else { continue };
        if t.dtype == asked {
            // already in the asked type: its bytes pass through unchanged
            plan.types.insert(t.name.clone(), asked);
            continue;
        }
        if t.dtype.is_quantized() && !q.allow_requantize {
            return Err(PackError::Requantize {
                tensor: t.name.clone(),
                from: t.dtype,
                to: asked,
            });
        }
        if !t.dtype.is_castable_float() && !t.dtype.is_quantized() {
            return Err(PackError::NotCastable {
                tensor: t.name.clone(),
                from: t.dtype.to_string(),
                to: asked.to_string(),
            });
        }
        let (stored, why) = fit(&t.name, asked, t.shape[1], explicit)?;
        if let Some(reason) = why {
            plan.fallbacks.push(Fallback {
                tensor: t.name.clone(),
                asked: asked.to_string(),
                stored: stored.to_string(),
                reason,
            });
        }
        plan.types.insert(t.name.clone(), stored);
    }
    Ok(plan)
}

/// A 2-D float or block-type tensor: what `--quant` applies to.
fn is_weight_matrix(t: &SourceTensor) -> bool {
    t.shape.len() == 2 && (t.dtype.is_castable_float() || t.dtype.is_quantized())
}

fn cols_of(src: &SourceModel, name: &str) -> u64 {
    src.tensor(name).map_or(0, |t| t.shape[1])
}
