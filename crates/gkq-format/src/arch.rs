//! The decoder architectures the toolchain knows, one table entry each, as
//! llama.cpp's `llama-arch.cpp` keeps them: the names of the architecture in
//! Hugging Face's `config.json` and in a GGUF's `general.architecture`, and
//! the tensor of each role of a layer in both naming conventions. gkq-source
//! derives a GGUF's `config.json` from it, gkq-export writes llama.cpp's
//! names with it, and gkq-decode loads a layer's blocks by role. Adding an
//! architecture is one entry here plus its layer code in gkq-decode. No I/O:
//! names only.

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

/// A decoder architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arch {
    /// Its name here (`llama`, `qwen2`, `mistral`, `gemma3`).
    pub name: &'static str,
    /// Its `model_type` values in Hugging Face's `config.json`.
    pub hf_model_types: &'static [&'static str],
    /// Its class in `architectures[0]`.
    pub hf_architecture: &'static str,
    /// Its `general.architecture` in a GGUF.
    pub gguf: &'static str,
    /// Each part of a layer: `(part, Hugging Face name after
    /// "model.layers.{l}.", llama.cpp name after "blk.{l}.")`.
    pub parts: &'static [(Part, &'static str, &'static str)],
    /// Whether llama.cpp's converter permuted q and k so that rotary pairs
    /// are adjacent (its Llama layout): a GGUF-born knot's q and k rows are
    /// then rotated in pairs, and an export permutes safetensors' rows.
    pub gguf_rope_pairs: bool,
    /// Whether llama.cpp's converter stored its RMSNorm weights as `1 + w`
    /// where Hugging Face stores `w` (Gemma): a decoder adds the 1 to a
    /// safetensors-born knot's norms, not to a GGUF-born one's.
    pub norm_plus_one: bool,
    /// The chat template to use when the package carries none (the one
    /// its publisher documents).
    pub chat_template: Option<&'static str>,
}

const LLAMA_PARTS: &[(Part, &str, &str)] = &[
    (Part::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
    (Part::Q, "self_attn.q_proj.weight", "attn_q.weight"),
    (Part::K, "self_attn.k_proj.weight", "attn_k.weight"),
    (Part::V, "self_attn.v_proj.weight", "attn_v.weight"),
    (Part::O, "self_attn.o_proj.weight", "attn_output.weight"),
    (
        Part::FfnNorm,
        "post_attention_layernorm.weight",
        "ffn_norm.weight",
    ),
    (Part::Gate, "mlp.gate_proj.weight", "ffn_gate.weight"),
    (Part::Up, "mlp.up_proj.weight", "ffn_up.weight"),
    (Part::Down, "mlp.down_proj.weight", "ffn_down.weight"),
];

const QWEN2_PARTS: &[(Part, &str, &str)] = &[
    (Part::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
    (Part::Q, "self_attn.q_proj.weight", "attn_q.weight"),
    (Part::K, "self_attn.k_proj.weight", "attn_k.weight"),
    (Part::V, "self_attn.v_proj.weight", "attn_v.weight"),
    (Part::O, "self_attn.o_proj.weight", "attn_output.weight"),
    (
        Part::FfnNorm,
        "post_attention_layernorm.weight",
        "ffn_norm.weight",
    ),
    (Part::Gate, "mlp.gate_proj.weight", "ffn_gate.weight"),
    (Part::Up, "mlp.up_proj.weight", "ffn_up.weight"),
    (Part::Down, "mlp.down_proj.weight", "ffn_down.weight"),
    (Part::QBias, "self_attn.q_proj.bias", "attn_q.bias"),
    (Part::KBias, "self_attn.k_proj.bias", "attn_k.bias"),
    (Part::VBias, "self_attn.v_proj.bias", "attn_v.bias"),
];

const GEMMA3_PARTS: &[(Part, &str, &str)] = &[
    (Part::AttnNorm, "input_layernorm.weight", "attn_norm.weight"),
    (Part::Q, "self_attn.q_proj.weight", "attn_q.weight"),
    (Part::K, "self_attn.k_proj.weight", "attn_k.weight"),
    (Part::V, "self_attn.v_proj.weight", "attn_v.weight"),
    (Part::O, "self_attn.o_proj.weight", "attn_output.weight"),
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
    (Part::Gate, "mlp.gate_proj.weight", "ffn_gate.weight"),
    (Part::Up, "mlp.up_proj.weight", "ffn_up.weight"),
    (Part::Down, "mlp.down_proj.weight", "ffn_down.weight"),
];

/// Gemma 3's chat template, as Google publishes it with the instruction
/// tuned models (a GGUF of a base model may carry none).
pub const GEMMA3_CHAT_TEMPLATE: &str = "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n";

/// Every architecture.
pub const ARCHS: &[Arch] = &[
    Arch {
        name: "qwen2",
        hf_model_types: &["qwen2"],
        hf_architecture: "Qwen2ForCausalLM",
        gguf: "qwen2",
        parts: QWEN2_PARTS,
        gguf_rope_pairs: false,
        norm_plus_one: false,
        chat_template: None,
    },
    Arch {
        name: "llama",
        hf_model_types: &["llama"],
        hf_architecture: "LlamaForCausalLM",
        gguf: "llama",
        parts: LLAMA_PARTS,
        gguf_rope_pairs: true,
        norm_plus_one: false,
        chat_template: None,
    },
    Arch {
        name: "mistral",
        hf_model_types: &["mistral"],
        hf_architecture: "MistralForCausalLM",
        // llama.cpp converts Mistral to its llama architecture
        gguf: "llama",
        parts: LLAMA_PARTS,
        gguf_rope_pairs: true,
        norm_plus_one: false,
        chat_template: None,
    },
    Arch {
        name: "gemma3",
        hf_model_types: &["gemma3_text", "gemma3"],
        hf_architecture: "Gemma3ForCausalLM",
        gguf: "gemma3",
        parts: GEMMA3_PARTS,
        gguf_rope_pairs: false,
        norm_plus_one: true,
        chat_template: Some(GEMMA3_CHAT_TEMPLATE),
    },
];

/// The token embedding's name: Hugging Face's, llama.cpp's.
pub const TOKEN_EMBD: (&str, &str) = ("model.embed_tokens.weight", "token_embd.weight");
/// The lm_head's name.
pub const OUTPUT: (&str, &str) = ("lm_head.weight", "output.weight");
/// The final norm's name.
pub const OUTPUT_NORM: (&str, &str) = ("model.norm.weight", "output_norm.weight");

/// The architecture of a Hugging Face `model_type`.
pub fn by_hf(model_type: &str) -> Option<&'static Arch> {
    ARCHS
        .iter()
        .find(|a| a.hf_model_types.contains(&model_type))
}

/// The architecture of a GGUF's `general.architecture` (the first entry
/// whose llama.cpp name it is: `llama` is Llama, not Mistral).
pub fn by_gguf(name: &str) -> Option<&'static Arch> {
    ARCHS.iter().find(|a| a.gguf == name)
}

/// The layer and the part a tensor name is, in either convention
/// (`model.layers.3.mlp.down_proj.weight`, `blk.3.ffn_down.weight`), in
/// any architecture of the table.
pub fn layer_part(name: &str) -> Option<(usize, Part)> {
    let (rest, gguf) = match name.strip_prefix("model.layers.") {
        Some(r) => (r, false),
        None => (name.strip_prefix("blk.")?, true),
    };
    let (layer, part) = rest.split_once('.')?;
    let layer = layer.parse().ok()?;
    ARCHS
        .iter()
        .flat_map(|a| a.parts)
        .find(|(_, h, g)| if gguf { *g == part } else { *h == part })
        .map(|(p, _, _)| (layer, *p))
}

/// The names of every architecture, for messages (`qwen2, llama, …`).
pub fn names() -> String {
    ARCHS.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

impl Arch {
    /// The name of `part` of layer `layer`: llama.cpp's when `gguf`, else
    /// Hugging Face's; `None` when the architecture has no such part.
    pub fn layer_tensor(&self, layer: usize, part: Part, gguf: bool) -> Option<String> {
        let (_, hf, g) = self.parts.iter().find(|(p, _, _)| *p == part)?;
        Some(if gguf {
            format!("blk.{layer}.{g}")
        } else {
            format!("model.layers.{layer}.{hf}")
        })
    }

    /// Whether the architecture has `part`.
    pub fn has(&self, part: Part) -> bool {
        self.parts.iter().any(|(p, _, _)| *p == part)
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
        let (_, _, g) = self.parts.iter().find(|(_, h, _)| *h == part)?;
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
            layer_part("model.layers.11.self_attn.v_proj.weight"),
            Some((11, Part::V))
        );
        assert_eq!(layer_part("blk.0.ffn_down.weight"), Some((0, Part::Down)));
        assert_eq!(layer_part("blk.x.ffn_down.weight"), None);
        assert_eq!(layer_part("output.weight"), None);
        let g = by_hf("gemma3_text").expect("gemma3");
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
