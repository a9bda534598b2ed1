//! The hyper-parameters of a decoder, from the package's `config.json`
//! (a companion file the knot pins by digest, docs/FORMAT.md 3.1).

use serde::Deserialize;

use crate::error::{DecodeError, Result};

/// The architectures this crate runs: pre-norm decoders with RMSNorm,
/// rotary positions (HF "rotate half" layout), grouped-query attention and
/// a SwiGLU MLP. Qwen2 adds biases to the q, k and v projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `qwen2`.
    Qwen2,
    /// `llama`.
    Llama,
    /// `mistral` (as llama; sliding windows longer than the context change nothing).
    Mistral,
}

/// What the forward pass needs to know.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Architecture.
    pub arch: Arch,
    /// Width of the residual stream.
    pub hidden: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Vocabulary.
    pub vocab: usize,
}

#[derive(Deserialize)]
struct Raw {
    model_type: String,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    vocab_size: usize,
}

impl Config {
    /// Parses `config.json`.
    pub fn from_json(bytes: &[u8]) -> Result<Config> {
        let raw: Raw = serde_json::from_slice(bytes)
            .map_err(|e| DecodeError::Config(format!("config.json: {e}")))?;
        let arch = match raw.model_type.as_str() {
            "qwen2" => Arch::Qwen2,
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            other => {
                return Err(DecodeError::Config(format!(
                    "config.json: model_type {other:?} is not one of qwen2, llama, mistral"
                )));
            }
        };
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(DecodeError::Config(format!(
                "config.json: {heads} attention heads cannot share {kv_heads} key/value heads"
            )));
        }
        let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / heads);
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(DecodeError::Config(format!(
                "config.json: head_dim {head_dim} must be even and non-zero"
            )));
        }
        Ok(Config {
            arch,
            hidden: raw.hidden_size,
            intermediate: raw.intermediate_size,
            layers: raw.num_hidden_layers,
            heads,
            kv_heads,
            head_dim,
            eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: raw.rope_theta.unwrap_or(10_000.0),
            vocab: raw.vocab_size,
        })
    }
}
