//! The hyper-parameters of a decoder, from the package's `config.json`
//! (a companion file the knot pins by digest, docs/FORMAT.md 3.1), and its
//! architecture from the one table of them (`gkq_format::arch`).

use gkq_format::arch::{self, Activation, Arch, Decoder, EmbedScale, Norm, Part};
use serde::Deserialize;

use crate::error::{DecodeError, Result};

/// What the forward pass needs to know.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Architecture.
    pub arch: &'static Arch,
    /// How it computes (its row's).
    pub decoder: &'static Decoder,
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
    /// RoPE base (of the global layers, when some are local).
    pub rope_theta: f64,
    /// Vocabulary.
    pub vocab: usize,
    /// Longest sequence the model was trained for (`max_position_embeddings`), when given.
    pub max_positions: Option<usize>,
    /// The knot came from a GGUF (`gguf_architecture` in the derived
    /// config.json): llama.cpp's tensor names (and rotary layout, and norms).
    pub gguf: bool,
    /// Local attention: the window, every layer but each `pattern`-th
    /// (`(window, pattern, local rope base)`; Gemma 3: 512, 6, 10,000).
    pub sliding: Option<(usize, usize, f64)>,
    /// The scale of the attention scores (`1 / sqrt(head_dim)`, or Gemma's
    /// `query_pre_attn_scalar`).
    pub attn_scale: f64,
    /// The scale of the embedding rows (Gemma: `sqrt(hidden)`).
    pub embed_scale: Option<f64>,
    /// Added to every RMSNorm weight (Gemma's `1 + w` from safetensors;
    /// 0 for a GGUF, whose converter added it).
    pub norm_offset: f64,
    /// The feed-forward's activation.
    pub activation: Activation,
    /// `tanh` soft-capping of the logits (`final_logit_softcapping`).
    pub logit_softcap: Option<f64>,
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
    sliding_window: Option<usize>,
    sliding_window_pattern: Option<usize>,
    rope_local_base_freq: Option<f64>,
    query_pre_attn_scalar: Option<f64>,
    final_logit_softcapping: Option<f64>,
}

/// The architectures this crate runs, for messages.
pub fn supported() -> String {
    arch::names()
}

fn config_err<T>(m: impl std::fmt::Display) -> Result<T> {
    Err(DecodeError::Config(format!("config.json: {m}")))
}

/// The architecture `config.json` names, or why it is not one this crate
/// runs; and the activation it asks for, checked against the row with its
/// `rope_scaling`.
fn arch_of(bytes: &[u8]) -> Result<(&'static Arch, &'static Decoder, Activation)> {
    // the architecture first: another model's config lacks our fields,
    // and "missing field hidden_size" would hide the real cause
    let v: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| DecodeError::Config(format!("config.json: {e}")))?;
    let supported = supported();
    let Some(t) = v.get("model_type").and_then(serde_json::Value::as_str) else {
        return Err(DecodeError::Config(format!(
            "config.json has no model_type: gkq-decode runs {supported}"
        )));
    };
    let arch = arch::by_hf(t);
    let Some((arch, decoder)) = arch.and_then(|a| Some((a, a.decoder?))) else {
        let why = if arch.is_some_and(|a| a.encoder) {
            ": an encoder-only model has no LM head to decode with"
        } else {
            ""
        };
        return config_err(format!(
            "model_type {t:?} is not an architecture gkq-decode runs (it runs {supported}){why}"
        ));
    };
    let activation = decoder
        .check_config(&v)
        .map_err(|u| DecodeError::Config(format!("config.json: {u}")))?;
    Ok((arch, decoder, activation))
}

impl Config {
    /// Parses `config.json`.
    pub fn from_json(bytes: &[u8]) -> Result<Config> {
        let (arch, decoder, activation) = arch_of(bytes)?;
        let raw: Raw = serde_json::from_slice(bytes)
            .map_err(|e| DecodeError::Config(format!("config.json: {e}")))?;
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return config_err(format!(
                "{heads} attention heads cannot share {kv_heads} key/value heads"
            ));
        }
        let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / heads);
        let finite = |v: f64| v.is_finite() && v > 0.0;
        let (eps, theta) = (
            raw.rms_norm_eps.unwrap_or(1e-6),
            raw.rope_theta.unwrap_or(10_000.0),
        );
        if !finite(eps) || !finite(theta) {
            return config_err(format!(
                "rms_norm_eps {eps} and rope_theta {theta} must be finite and positive"
            ));
        }
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return config_err(format!("head_dim {head_dim} must be even and non-zero"));
        }
        let gguf = raw.gguf_architecture.is_some();
        let sliding = match (decoder.sliding, raw.sliding_window) {
            (Some(s), Some(w)) if w > 0 => Some((
                w,
                raw.sliding_window_pattern.unwrap_or(s.pattern).max(1),
                raw.rope_local_base_freq.unwrap_or(s.local_base),
            )),
            _ => None,
        };
        let scalar = raw
            .query_pre_attn_scalar
            .filter(|_| decoder.gemma_scales)
            .unwrap_or(head_dim as f64);
        if !finite(scalar) || sliding.is_some_and(|s| !finite(s.2)) {
            return config_err(
                "query_pre_attn_scalar and rope_local_base_freq must be finite and positive",
            );
        }
        Ok(Config {
            arch,
            decoder,
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
            gguf,
            sliding,
            attn_scale: 1.0 / scalar.sqrt(),
            embed_scale: match decoder.embed_scale {
                EmbedScale::None => None,
                EmbedScale::SqrtHidden => Some((raw.hidden_size as f64).sqrt()),
            },
            norm_offset: match decoder.norm {
                Norm::OnePlusW if !gguf => 1.0,
                Norm::OnePlusW | Norm::W => 0.0,
            },
            activation,
            logit_softcap: raw
                .final_logit_softcapping
                .filter(|&c| decoder.gemma_scales && finite(c)),
        })
    }

    /// Whether rotary pairs are adjacent dimensions (llama.cpp's Llama
    /// layout) rather than halves (Hugging Face's "rotate half").
    pub fn rope_interleaved(&self) -> bool {
        self.gguf && self.decoder.gguf_rope_pairs
    }

    /// The window and rope base of layer `l`: a local layer's, or `None`
    /// (every position) and the global base.
    pub fn layer_attention(&self, l: usize) -> (Option<usize>, f64) {
        match self.sliding {
            Some((window, pattern, base)) if l % pattern < pattern - 1 => (Some(window), base),
            _ => (None, self.rope_theta),
        }
    }

    /// The final norm's block.
    pub fn norm_name(&self) -> &'static str {
        if self.gguf {
            arch::OUTPUT_NORM.1
        } else {
            arch::OUTPUT_NORM.0
        }
    }

    /// The name of `part` of layer `l`, in this knot's naming; `None` when
    /// the architecture has no such part.
    pub fn layer_block(&self, l: usize, part: Part) -> Option<String> {
        self.arch.layer_tensor(l, part, self.gguf)
    }

    /// Checks these sizes against the knot's blocks, with checked
    /// arithmetic, before anything is allocated from them: the layer
    /// count, the width, the heads times their width, the MLP width and the
    /// vocabulary must all be what the blocks hold. `config.json` is pinned
    /// by the knot, but a publisher can still ship nonsense.
    pub fn check(&self, header: &gkq_format::Header) -> Result<()> {
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
            return config_err(format!(
                "num_hidden_layers is {}, but the knot holds {in_knot} layers",
                self.layers
            ));
        }
        let shape = |name: &str| -> Result<Vec<u64>> {
            header.block(name).map(|b| b.shape.clone()).ok_or_else(|| {
                DecodeError::Weights(format!(
                    "the knot has no block {name} (a {} model needs it)",
                    self.arch.name
                ))
            })
        };
        let as_u64 = |n: usize| n as u64;
        let embed = header
            .meta_str(gkq_format::keys::ROLE_TOKEN_EMBD)
            .ok_or_else(|| DecodeError::Weights("the knot has no role.token_embd".into()))?;
        let e = shape(embed)?;
        if e != [as_u64(self.vocab), as_u64(self.hidden)] {
            return config_err(format!(
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
        for (part, want) in [
            (Part::Q, [q, self.hidden]),
            (Part::K, [kv, self.hidden]),
            (Part::O, [self.hidden, q]),
            (Part::Gate, [self.intermediate, self.hidden]),
        ] {
            let Some(full) = self.layer_block(0, part) else {
                continue;
            };
            let have = shape(&full)?;
            if have != [as_u64(want[0]), as_u64(want[1])] {
                return config_err(format!(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Result<Config> {
        Config::from_json(
            format!(
                r#"{{"model_type":"llama","hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":4{extra}}}"#
            )
            .as_bytes(),
        )
    }

    /// The row decides; a value it does not implement is refused by its key.
    #[test]
    fn the_row_decides_and_refuses_what_it_lacks() {
        let c = config("").expect("llama");
        assert_eq!(c.activation, Activation::Silu);
        assert_eq!((c.embed_scale, c.norm_offset, c.sliding), (None, 0.0, None));
        let e = |extra: &str| config(extra).expect_err(extra).to_string();
        let relu = e(r#","hidden_act":"relu""#);
        assert!(
            relu.contains(r#"config.json: hidden_act is "relu""#),
            "{relu}"
        );
        let yarn = e(r#","rope_scaling":{"rope_type":"yarn","factor":4}"#);
        assert!(
            yarn.contains("rope_scaling is {") && yarn.contains("default, none"),
            "{yarn}"
        );
        let llama3 = e(r#","rope_scaling":{"type":"llama3","factor":8}"#);
        assert!(llama3.contains("llama3"), "{llama3}");
        config(r#","rope_scaling":null,"hidden_act":"silu""#).expect("no scaling");
        // Gemma 3 reads its own key, and scales as its row says
        let g = Config::from_json(
            br#"{"model_type":"gemma3_text","hidden_size":4,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":1,"head_dim":4,"vocab_size":4,"sliding_window":2,"query_pre_attn_scalar":16,"hidden_act":"relu"}"#,
        )
        .expect("gemma3: hidden_act is not its key");
        assert_eq!(g.activation, Activation::GeluTanh);
        assert_eq!((g.embed_scale, g.norm_offset), (Some(2.0), 1.0));
        assert_eq!((g.sliding, g.attn_scale), (Some((2, 6, 10_000.0)), 0.25));
    }
}
