//! The decoder architectures the toolchain knows, one table entry each, as
//! llama.cpp's `llama-arch.cpp` keeps them: the names of the architecture in
//! Hugging Face's `config.json` and in a GGUF's `general.architecture`, and
//! the tensor of each role of a layer in both naming conventions. gkq-source
//! derives a GGUF's `config.json` from it, gkq-export writes llama.cpp's
//! names with it, and gkq-decode loads a layer's blocks by role. Adding an
//! architecture is one entry here plus its layer code in gkq-decode. No I/O.

/// What a tensor of a layer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    /// The norm before attention.
    AttnNorm,
    /// Query projection.
    Q,
    /// Key projection.
    K,
    /// Value projection.
    V,
    /// Output projection of attention.
    O,
    /// Query bias (Qwen2).
    QBias,
    /// Key bias (Qwen2).
    KBias,
    /// Value bias (Qwen2).
    VBias,
    /// The norm of each query head (Gemma 3).
    QNorm,
    /// The norm of each key head (Gemma 3).
    KNorm,
    /// The norm after attention, before the residual add (Gemma 3).
    PostAttnNorm,
    /// The norm before the feed-forward.
    FfnNorm,
    /// The norm after the feed-forward, before the residual add (Gemma 3).
    PostFfnNorm,
    /// Gate projection.
    Gate,
    /// Up projection.
    Up,
    /// Down projection.
    Down,
}

mod decoder;

pub use decoder::{
    Activation, Decoder, Derived, DerivedKey, EmbedScale, GEMMA3_CHAT_TEMPLATE, Norm, Sliding,
    Unsupported,
};
use decoder::{GEMMA3, LLAMA, QWEN2};

/// A model architecture: how its checkpoint names its tensors and, for the
/// decoders this toolchain runs, how it computes (the one table of what an
/// architecture is: source, packer, decoder and export read its row, and
/// no code tests an architecture's name).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arch {
    /// Its name here (`llama`, `qwen2`, `gemma3`, `bert`, …).
    pub name: &'static str,
    /// Its `model_type` values in Hugging Face's `config.json`.
    pub hf_model_types: &'static [&'static str],
    /// Its class in `architectures[0]` (the one a derived config writes).
    pub hf_class: &'static str,
    /// The starts of the classes that are it when `model_type` is not one
    /// of [`Arch::hf_model_types`] (`Qwen3` for `Qwen3ForCausalLM`),
    /// compared without case.
    pub class_prefixes: &'static [&'static str],
    /// Its `general.architecture` in a GGUF, when llama.cpp has one.
    pub gguf: Option<&'static str>,
    /// The parts of a layer, in groups; none for an architecture whose
    /// layers the toolchain does not name.
    parts: &'static [Parts],
    /// The token embedding's and lm_head's tensors in a checkpoint, and
    /// whether they are tied when `config.json` does not say.
    pub roles: Roles,
    /// How it computes, when gkq-decode runs it.
    pub decoder: Option<&'static Decoder>,
    /// An encoder: no causal LM head to decode with.
    pub encoder: bool,
}

/// The role tensors of a naming convention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Roles {
    /// The embedding's names, most likely first.
    pub embed: &'static [&'static str],
    /// The lm_head's names.
    pub lm_head: &'static [&'static str],
    /// `tie_word_embeddings` when the config does not say.
    pub tied_default: bool,
}

/// The roles of llama.cpp's names (a GGUF, whatever its architecture).
pub const GGUF_ROLES: Roles = Roles {
    embed: &["token_embd.weight"],
    lm_head: &["output.weight"],
    tied_default: true,
};

/// A group of a layer's parts: `(part, Hugging Face name after
/// "model.layers.{l}.", llama.cpp name after "blk.{l}.")`.
type Parts = &'static [(Part, &'static str, &'static str)];

const ATTENTION: Parts = &[
    (Part::Q, "self_attn.q_proj.weight", "attn_q.weight"),
    (Part::K, "self_attn.k_proj.weight", "attn_k.weight"),
    (Part::V, "self_attn.v_proj.weight", "attn_v.weight"),
    (Part::O, "self_attn.o_proj.weight", "attn_output.weight"),
    (Part::Gate, "mlp.gate_proj.weight", "ffn_gate.weight"),
    (Part::Up, "mlp.up_proj.weight", "ffn_up.weight"),
    (Part::Down, "mlp.down_proj.weight", "ffn_down.weight"),
    (Part::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
];
const LLAMA_NORM: Parts = &[(
    Part::FfnNorm,
    "post_attention_layernorm.weight",
    "ffn_norm.weight",
)];
const QWEN2_BIAS: Parts = &[
    (Part::QBias, "self_attn.q_proj.bias", "attn_q.bias"),
    (Part::KBias, "self_attn.k_proj.bias", "attn_k.bias"),
    (Part::VBias, "self_attn.v_proj.bias", "attn_v.bias"),
];
// Gemma 2 and 3 name a norm as Llama does for another role
const GEMMA3_NORMS: Parts = &[
    (Part::QNorm, "self_attn.q_norm.weight", "attn_q_norm.weight"),
    (Part::KNorm, "self_attn.k_norm.weight", "attn_k_norm.weight"),
    (
        Part::PostAttnNorm,
        "post_attention_layernorm.weight",
        "post_attention_norm.weight",
    ),
    (
        Part::FfnNorm,
        "pre_feedforward_layernorm.weight",
        "ffn_norm.weight",
    ),
    (
        Part::PostFfnNorm,
        "post_feedforward_layernorm.weight",
        "post_ffw_norm.weight",
    ),
];
const LLAMA_PARTS: &[Parts] = &[ATTENTION, LLAMA_NORM];
const QWEN2_PARTS: &[Parts] = &[ATTENTION, LLAMA_NORM, QWEN2_BIAS];
const GEMMA3_PARTS: &[Parts] = &[ATTENTION, GEMMA3_NORMS];

/// The roles of a Llama-style checkpoint.
const DECODER_ROLES: Roles = Roles {
    embed: &["model.embed_tokens.weight", "embed_tokens.weight"],
    lm_head: &["lm_head.weight"],
    tied_default: false,
};

/// A Llama-style architecture the packer knows but gkq-decode does not run.
const fn packed_only(
    name: &'static str,
    hf_model_types: &'static [&'static str],
    hf_class: &'static str,
    class_prefixes: &'static [&'static str],
    parts: &'static [Parts],
    roles: Roles,
) -> Arch {
    Arch {
        name,
        hf_model_types,
        hf_class,
        class_prefixes,
        gguf: None,
        parts,
        roles,
        decoder: None,
        encoder: false,
    }
}

/// An encoder (or GPT-2): its role tensors only; its `model_type` is its
/// name, and its classes start with it.
const fn roles_only(
    name: &'static str,
    encoder: bool,
    model_type: &'static [&'static str],
    hf_class: &'static str,
    embed: &'static [&'static str],
    lm_head: &'static [&'static str],
) -> Arch {
    Arch {
        name,
        hf_model_types: model_type,
        hf_class,
        class_prefixes: model_type,
        gguf: None,
        parts: &[],
        roles: Roles {
            embed,
            lm_head,
            tied_default: true,
        },
        decoder: None,
        encoder,
    }
}

/// Gemma's roles: tied unless the config says otherwise.
const GEMMA_ROLES: Roles = Roles {
    tied_default: true,
    ..DECODER_ROLES
};

/// Llama (Mistral's row differs in its names only).
const LLAMA_ARCH: Arch = Arch {
    name: "llama",
    hf_model_types: &["llama"],
    hf_class: "LlamaForCausalLM",
    class_prefixes: &["llama"],
    gguf: Some("llama"),
    parts: LLAMA_PARTS,
    roles: DECODER_ROLES,
    decoder: Some(&LLAMA),
    encoder: false,
};

/// Every architecture: the decoders gkq-decode runs first, then those
/// only packed (their role tensors and layer names known).
pub const ARCHS: &[Arch] = &[
    Arch {
        name: "qwen2",
        hf_model_types: &["qwen2"],
        hf_class: "Qwen2ForCausalLM",
        class_prefixes: &["qwen2for"],
        gguf: Some("qwen2"),
        parts: QWEN2_PARTS,
        roles: DECODER_ROLES,
        decoder: Some(&QWEN2),
        encoder: false,
    },
    LLAMA_ARCH,
    // llama.cpp converts Mistral to its llama architecture
    Arch {
        name: "mistral",
        hf_model_types: &["mistral"],
        hf_class: "MistralForCausalLM",
        class_prefixes: &["mistral"],
        ..LLAMA_ARCH
    },
    Arch {
        name: "gemma3",
        hf_model_types: &["gemma3_text", "gemma3"],
        hf_class: "Gemma3ForCausalLM",
        class_prefixes: &["gemma3"],
        gguf: Some("gemma3"),
        parts: GEMMA3_PARTS,
        roles: GEMMA_ROLES,
        decoder: Some(&GEMMA3),
        encoder: false,
    },
    packed_only(
        "qwen_moe",
        &["qwen2_moe", "qwen3", "qwen3_moe"],
        "Qwen3ForCausalLM",
        &["qwen"],
        QWEN2_PARTS,
        DECODER_ROLES,
    ),
    packed_only(
        "mixtral",
        &["mixtral", "phi3"],
        "MixtralForCausalLM",
        &["mixtral", "phi3"],
        LLAMA_PARTS,
        DECODER_ROLES,
    ),
    // Gemma 2 names its norms as Gemma 3 does; Gemma 1 as Llama does
    packed_only(
        "gemma2",
        &["gemma2"],
        "Gemma2ForCausalLM",
        &["gemma2"],
        GEMMA3_PARTS,
        GEMMA_ROLES,
    ),
    packed_only(
        "gemma",
        &["gemma"],
        "GemmaForCausalLM",
        &["gemma"],
        LLAMA_PARTS,
        GEMMA_ROLES,
    ),
    roles_only(
        "gpt2",
        false,
        &["gpt2"],
        "GPT2LMHeadModel",
        &["transformer.wte.weight", "wte.weight"],
        &["lm_head.weight"],
    ),
    roles_only(
        "bert",
        true,
        &["bert"],
        "BertForMaskedLM",
        &[
            "bert.embeddings.word_embeddings.weight",
            "embeddings.word_embeddings.weight",
        ],
        &["cls.predictions.decoder.weight"],
    ),
    roles_only(
        "roberta",
        true,
        &["roberta"],
        "RobertaForMaskedLM",
        &[
            "roberta.embeddings.word_embeddings.weight",
            "embeddings.word_embeddings.weight",
        ],
        &["lm_head.decoder.weight"],
    ),
];

/// The token embedding's name: Hugging Face's, llama.cpp's.
pub const TOKEN_EMBD: (&str, &str) = ("model.embed_tokens.weight", "token_embd.weight");
/// The lm_head's name.
pub const OUTPUT: (&str, &str) = ("lm_head.weight", "output.weight");
/// The final norm's name.
pub const OUTPUT_NORM: (&str, &str) = ("model.norm.weight", "output_norm.weight");

/// The architecture of a Hugging Face `model_type` (compared without case).
pub fn by_hf(model_type: &str) -> Option<&'static Arch> {
    ARCHS.iter().find(|a| {
        a.hf_model_types
            .iter()
            .any(|t| t.eq_ignore_ascii_case(model_type))
    })
}

/// The architecture of a `config.json`: by its `model_type`, else by the
/// start of its class (`architectures[0]`).
pub fn of_config(model_type: &str, class: &str) -> Option<&'static Arch> {
    let class = class.to_ascii_lowercase();
    by_hf(model_type).or_else(|| {
        ARCHS
            .iter()
            .find(|a| a.class_prefixes.iter().any(|p| class.starts_with(p)))
    })
}

/// The decoder of a GGUF's `general.architecture` (the first entry whose
/// llama.cpp name it is: `llama` is Llama, not Mistral).
pub fn by_gguf(name: &str) -> Option<&'static Arch> {
    ARCHS
        .iter()
        .find(|a| a.gguf == Some(name) && a.decoder.is_some())
}

/// The names of the architectures gkq-decode runs, for messages
/// (`qwen2, llama, …`).
pub fn names() -> String {
    let names: Vec<&str> = ARCHS
        .iter()
        .filter(|a| a.decoder.is_some())
        .map(|a| a.name)
        .collect();
    names.join(", ")
}

/// The layer and the part a tensor name is: llama.cpp's names
/// (`blk.3.ffn_down.weight`) are one vocabulary whatever the architecture;
/// Hugging Face's (`model.layers.3.mlp.down_proj.weight`) are the
/// architecture's own (`post_attention_layernorm` is Llama's FFN norm,
/// Gemma 3's norm after attention), so need it.
pub fn layer_part(arch: Option<&Arch>, name: &str) -> Option<(usize, Part)> {
    let (rest, parts, gguf) = match name.strip_prefix("blk.") {
        Some(r) => (
            r,
            ARCHS.iter().flat_map(Arch::parts).collect::<Vec<_>>(),
            true,
        ),
        None => (
            name.strip_prefix("model.layers.")?,
            arch?.parts().collect(),
            false,
        ),
    };
    let (layer, part) = rest.split_once('.')?;
    let layer = layer.parse().ok()?;
    parts
        .into_iter()
        .find(|(_, h, g)| if gguf { *g == part } else { *h == part })
        .map(|(p, _, _)| (layer, *p))
}

impl Arch {
    /// Each part of a layer: `(part, Hugging Face name, llama.cpp name)`.
    fn parts(&self) -> impl Iterator<Item = &'static (Part, &'static str, &'static str)> {
        self.parts.iter().flat_map(|g| g.iter())
    }

    /// The layer and the part a tensor name of this architecture is, in
    /// either convention ([`layer_part`]).
    pub fn layer_part(&self, name: &str) -> Option<(usize, Part)> {
        layer_part(Some(self), name)
    }

    /// The name of `part` of layer `layer`: llama.cpp's when `gguf`, else
    /// Hugging Face's; `None` when the architecture has no such part.
    pub fn layer_tensor(&self, layer: usize, part: Part, gguf: bool) -> Option<String> {
        let (_, hf, g) = self.parts().find(|(p, _, _)| *p == part)?;
        Some(if gguf {
            format!("blk.{layer}.{g}")
        } else {
            format!("model.layers.{layer}.{hf}")
        })
    }

    /// Whether the architecture has `part`.
    pub fn has(&self, part: Part) -> bool {
        self.parts().any(|(p, _, _)| *p == part)
    }

    /// llama.cpp's name of a Hugging Face tensor name of this architecture.
    pub fn gguf_name(&self, hf: &str) -> Option<String> {
        for (h, g) in [TOKEN_EMBD, OUTPUT, OUTPUT_NORM] {
            if hf == h {
                return Some(g.to_owned());
            }
        }
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, part) = rest.split_once('.')?;
        let (_, _, g) = self.parts().find(|(_, h, _)| *h == part)?;
        Some(format!("blk.{layer}.{g}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways() {
        let llama = by_hf("llama").expect("llama");
        assert_eq!(by_gguf("llama"), Some(llama));
        assert_eq!(
            llama
                .gguf_name("model.layers.3.mlp.up_proj.weight")
                .as_deref(),
            Some("blk.3.ffn_up.weight")
        );
        assert_eq!(llama.gguf_name("model.rotary.inv_freq"), None);
        assert_eq!(
            llama.layer_part("model.layers.11.self_attn.v_proj.weight"),
            Some((11, Part::V))
        );
        assert_eq!(
            llama.layer_part("blk.0.ffn_down.weight"),
            Some((0, Part::Down))
        );
        assert_eq!(llama.layer_part("blk.x.ffn_down.weight"), None);
        // llama.cpp's names need no architecture; Hugging Face's do
        assert_eq!(
            layer_part(None, "blk.1.post_ffw_norm.weight"),
            Some((1, Part::PostFfnNorm))
        );
        assert_eq!(layer_part(None, "model.layers.1.mlp.up_proj.weight"), None);
        // a config names its architecture by model_type, else by class
        assert_eq!(
            of_config("", "Qwen3MoeForCausalLM").map(|a| a.name),
            Some("qwen_moe")
        );
        assert_eq!(
            of_config("", "Qwen2ForCausalLM").map(|a| a.name),
            Some("qwen2")
        );
        assert_eq!(of_config("LLAMA", "").map(|a| a.name), Some("llama"));
        assert_eq!(of_config("", "BertModel").map(|a| a.name), Some("bert"));
        assert_eq!(of_config("t5", "T5Model"), None);
        assert_eq!(llama.layer_part("output.weight"), None);
        let g = by_hf("gemma3_text").expect("gemma3");
        // one name, two parts: each architecture's own
        let name = "model.layers.2.post_attention_layernorm.weight";
        assert_eq!(llama.layer_part(name), Some((2, Part::FfnNorm)));
        assert_eq!(g.layer_part(name), Some((2, Part::PostAttnNorm)));
        assert_eq!(
            g.layer_tensor(2, Part::PostFfnNorm, true).as_deref(),
            Some("blk.2.post_ffw_norm.weight")
        );
        assert_eq!(
            g.gguf_name("model.layers.0.pre_feedforward_layernorm.weight")
                .as_deref(),
            Some("blk.0.ffn_norm.weight")
        );
        assert!(!llama.has(Part::QNorm) && g.has(Part::QNorm));
        assert_eq!(names(), "qwen2, llama, mistral, gemma3");
    }
}
