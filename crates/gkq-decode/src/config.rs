//! The hyper-parameters of a decoder, from the package's `config.json`
//! (a companion file the knot pins by digest, docs/FORMAT.md 3.1).

use serde::Deserialize;

use crate::error::{DecodeError, Result};

/// The architectures this crate runs: pre-norm decoders with RMSNorm,
/// rotary positions (HF "rotate half" layout), grouped-query attention and
/// a SwiGLU MLP. Qwen2 adds biases to the q, k and v projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderFamily {
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
    pub arch: DecoderFamily,
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
    /// Longest sequence the model was trained for (`max_position_embeddings`), when given.
    pub max_positions: Option<usize>,
    /// The knot came from a GGUF (`gguf_architecture` in the derived
    /// config.json): llama.cpp's tensor names, and for Llama its rotary
    /// layout (q and k rows permuted so that pairs are adjacent).
    pub gguf: bool,
}

/// Positions a decode may reach when `config.json` gives no
/// `max_position_embeddings`.
pub const DEFAULT_MAX_POSITIONS: usize = 131_072;
/// The most positions gkq-decode runs whatever `max_position_embeddings`
/// claims (16,777,216: past any published context length).
pub(crate) const MAX_POSITIONS: usize = 1 << 24;

#[derive(Deserialize)]
struct Raw {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    vocab_size: usize,
    max_position_embeddings: Option<usize>,
    gguf_architecture: Option<String>,
}

/// The architectures this crate runs, for messages.
pub const SUPPORTED: &str = "qwen2, llama, mistral";

impl Config {
    /// Parses `config.json`.
    pub fn from_json(bytes: &[u8]) -> Result<Config> {
        // the architecture first: another model's config lacks our fields,
        // and "missing field hidden_size" would hide the real cause
        #[derive(Deserialize)]
        struct Kind {
            model_type: Option<String>,
        }
        let kind: Kind = serde_json::from_slice(bytes)
            .map_err(|e| DecodeError::Config(format!("config.json: {e}")))?;
        let arch = match kind.model_type.as_deref() {
            Some("qwen2") => DecoderFamily::Qwen2,
            Some("llama") => DecoderFamily::Llama,
            Some("mistral") => DecoderFamily::Mistral,
            Some(other) => {
                let encoder = [
                    "bert",
                    "roberta",
                    "distilbert",
                    "xlm-roberta",
                    "electra",
                    "mpnet",
                ];
                let why = if encoder.contains(&other) {
                    ": an encoder-only model has no LM head to decode with"
                } else {
                    ""
                };
                return Err(DecodeError::Config(format!(
                    "config.json: model_type {other:?} is not an architecture gkq-decode runs (it runs {SUPPORTED}){why}"
                )));
            }
            None => {
                return Err(DecodeError::Config(format!(
                    "config.json has no model_type: gkq-decode runs {SUPPORTED}"
                )));
            }
        };
        let raw: Raw = serde_json::from_slice(bytes)
            .map_err(|e| DecodeError::Config(format!("config.json: {e}")))?;
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(DecodeError::Config(format!(
                "config.json: {heads} attention heads cannot share {kv_heads} key/value heads"
            )));
        }
        let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / heads);
        let finite = |v: f64| v.is_finite() && v > 0.0;
        let (eps, theta) = (
            raw.rms_norm_eps.unwrap_or(1e-6),
            raw.rope_theta.unwrap_or(10_000.0),
        );
        if !finite(eps) || !finite(theta) {
            return Err(DecodeError::Config(format!(
                "config.json: rms_norm_eps {eps} and rope_theta {theta} must be finite and positive"
            )));
        }
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
            eps,
            rope_theta: theta,
            vocab: raw.vocab_size,
            max_positions: raw.max_position_embeddings,
            gguf: raw.gguf_architecture.is_some(),
        })
    }

    /// Whether rotary pairs are adjacent dimensions (llama.cpp's Llama
    /// layout) rather than halves (Hugging Face's "rotate half").
    pub fn rope_interleaved(&self) -> bool {
        self.gguf && self.arch == DecoderFamily::Llama
    }

    /// The final norm's block.
    pub fn norm_name(&self) -> &'static str {
        if self.gguf {
            "output_norm.weight"
        } else {
            "model.norm.weight"
        }
    }

    /// The name of layer `l`'s block `hf` (Hugging Face's name after
    /// `model.layers.{l}.`), in this knot's naming.
    pub fn layer_block(&self, l: usize, hf: &str) -> String {
        if !self.gguf {
            return format!("model.layers.{l}.{hf}");
        }
        let g = match hf {
            "input_layernorm.weight" => "attn_norm.weight",
            "self_attn.q_proj.weight" => "attn_q.weight",
            "self_attn.k_proj.weight" => "attn_k.weight",
            "self_attn.v_proj.weight" => "attn_v.weight",
            "self_attn.o_proj.weight" => "attn_output.weight",
            "self_attn.q_proj.bias" => "attn_q.bias",
            "self_attn.k_proj.bias" => "attn_k.bias",
            "self_attn.v_proj.bias" => "attn_v.bias",
            "post_attention_layernorm.weight" => "ffn_norm.weight",
            "mlp.gate_proj.weight" => "ffn_gate.weight",
            "mlp.up_proj.weight" => "ffn_up.weight",
            "mlp.down_proj.weight" => "ffn_down.weight",
            other => other,
        };
        format!("blk.{l}.{g}")
    }

    /// Checks these sizes against the knot's blocks, with checked
    /// arithmetic, before anything is allocated from them: the layer
    /// count, the width, the heads times their width, the MLP width and the
    /// vocabulary must all be what the blocks hold. `config.json` is pinned
    /// by the knot, but a publisher can still ship nonsense.
    pub fn check(&self, header: &gkq_format::Header) -> Result<()> {
        let bad = |m: String| Err(DecodeError::Config(format!("config.json: {m}")));
        let in_knot = header
            .blocks
            .iter()
            .filter_map(|b| {
                let prefix = if self.gguf { "blk." } else { "model.layers." };
                let rest = b.name.strip_prefix(prefix)?;
                rest.split('.').next()?.parse::<usize>().ok()
            })
            .max()
            .map_or(0, |m| m + 1);
        if self.layers != in_knot {
            return bad(format!(
                "num_hidden_layers is {}, but the knot holds {in_knot} layers",
                self.layers
            ));
        }
        let shape = |name: &str| -> Result<Vec<u64>> {
            header.block(name).map(|b| b.shape.clone()).ok_or_else(|| {
                DecodeError::Weights(format!(
                    "the knot has no block {name} (a {:?} model needs it)",
                    self.arch
                ))
            })
        };
        let as_u64 = |n: usize| n as u64;
        let embed = header
            .meta_str(gkq_format::keys::ROLE_TOKEN_EMBD)
            .ok_or_else(|| DecodeError::Weights("the knot has no role.token_embd".into()))?;
        let e = shape(embed)?;
        if e != [as_u64(self.vocab), as_u64(self.hidden)] {
            return bad(format!(
                "vocab_size {} and hidden_size {} do not match the embedding {embed} of shape {e:?}",
                self.vocab, self.hidden
            ));
        }
        let width = |heads: usize, what: &str| {
            heads.checked_mul(self.head_dim).ok_or_else(|| {
                DecodeError::Config(format!(
                    "config.json: {what} {heads} × head_dim {} overflows",
                    self.head_dim
                ))
            })
        };
        let (q, kv) = (
            width(self.heads, "num_attention_heads")?,
            width(self.kv_heads, "num_key_value_heads")?,
        );
        for (name, want) in [
            ("self_attn.q_proj.weight", [q, self.hidden]),
            ("self_attn.k_proj.weight", [kv, self.hidden]),
            ("self_attn.o_proj.weight", [self.hidden, q]),
            ("mlp.gate_proj.weight", [self.intermediate, self.hidden]),
        ] {
            let full = self.layer_block(0, name);
            let have = shape(&full)?;
            if have != [as_u64(want[0]), as_u64(want[1])] {
                return bad(format!(
                    "heads {}, key/value heads {}, head_dim {}, hidden_size {} and intermediate_size {} imply {full} of shape {want:?}, but the knot's is {have:?}",
                    self.heads, self.kv_heads, self.head_dim, self.hidden, self.intermediate
                ));
            }
        }
        Ok(())
    }

    /// The most positions a decode may reach: `max_position_embeddings`,
    /// else [`DEFAULT_MAX_POSITIONS`]; never more than 16,777,216.
    pub fn position_limit(&self) -> usize {
        self.max_positions
            .unwrap_or(DEFAULT_MAX_POSITIONS)
            .min(MAX_POSITIONS)
    }
}
