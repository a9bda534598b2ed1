//! How the decoders gkq-decode runs compute: the behaviour an architecture's
//! row carries (its activation, norms, embedding scale, local attention,
//! the keys a GGUF-born config derives), and the check that refuses a
//! `config.json` asking for what a row does not implement.

/// The feed-forward's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU): Llama, Qwen2, Mistral.
    Silu,
    /// GELU, tanh approximation (GeGLU): Gemma.
    GeluTanh,
}

/// How an RMSNorm's weight is stored in a safetensors checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    /// `w`, multiplied as it is.
    W,
    /// `w` where the norm multiplies by `1 + w` (Gemma); llama.cpp's
    /// converter stores the sum, so a GGUF's is multiplied as it is.
    OnePlusW,
}

/// How the embedding rows are scaled before the first layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbedScale {
    /// Not at all.
    None,
    /// By `sqrt(hidden)` (Gemma).
    SqrtHidden,
}

/// Local (sliding-window) attention: every layer but each `pattern`-th
/// attends to the last `sliding_window` positions, with the rope base
/// `rope_local_base_freq` (defaults here, the config's when it gives them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sliding {
    /// Every this-many-th layer is global (Gemma 3: 6).
    pub pattern: usize,
    /// The local layers' rope base (Gemma 3: 10,000).
    pub local_base: f64,
}

/// A `config.json` key a GGUF-born package's derived config sets from the
/// GGUF's `{arch}.KEY` (or, absent, a default).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DerivedKey {
    /// The GGUF key after `{arch}.`.
    pub gguf: &'static str,
    /// The `config.json` key.
    pub config: &'static str,
    /// When the GGUF lacks it.
    pub default: Derived,
    /// Whether it is written as an integer (else as a float).
    pub integer: bool,
}

const fn derived(
    gguf: &'static str,
    config: &'static str,
    default: Derived,
    integer: bool,
) -> DerivedKey {
    DerivedKey {
        gguf,
        config,
        default,
        integer,
    }
}

/// The value of a [`DerivedKey`] the GGUF does not give.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Derived {
    /// Left out of the config.
    Omit,
    /// This number.
    Value(f64),
    /// The width of a head (`hidden / heads`).
    HeadDim,
}

/// How a decoder architecture computes (gkq-decode's layer code reads it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decoder {
    /// The `config.json` key of the activation, its value when the key is
    /// absent, and each value of it this toolchain implements (another is
    /// refused, naming the key).
    pub activation: (
        &'static str,
        Activation,
        &'static [(&'static str, Activation)],
    ),
    /// The embedding's scale.
    pub embed_scale: EmbedScale,
    /// The norms' form.
    pub norm: Norm,
    /// Whether llama.cpp's converter permuted q and k so that rotary pairs
    /// are adjacent (its Llama layout): a GGUF-born knot's q and k rows are
    /// then rotated in pairs, and an export permutes safetensors' rows.
    pub gguf_rope_pairs: bool,
    /// The `rope_scaling` types implemented (a config with another is
    /// refused, naming the key).
    pub rope_scaling: &'static [&'static str],
    /// Local attention, when the architecture has it.
    pub sliding: Option<Sliding>,
    /// Whether `query_pre_attn_scalar` sets the attention's scale (else
    /// `1 / sqrt(head_dim)`) and `final_logit_softcapping` caps the logits.
    pub gemma_scales: bool,
    /// The keys a GGUF-born package's derived `config.json` sets besides
    /// the common ones, and constant keys written as they are.
    pub derived: &'static [DerivedKey],
    /// Constant `config.json` keys of a GGUF-born package.
    pub derived_constants: &'static [(&'static str, &'static str)],
    /// The chat template to use when the package carries none (the one
    /// its publisher documents).
    pub chat_template: Option<&'static str>,
    /// Whether `gkq-export` writes a safetensors-born knot of it as a GGUF
    /// llama.cpp loads (its names and hyper-parameters mapped).
    pub export: bool,
}

/// A `config.json` value (or a GGUF's) a decoder's row does not implement:
/// decoding with it would give wrong text with exit 0, so it is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// The key (`hidden_act`, `rope_scaling`, `llama.rope.scaling.type`).
    pub key: String,
    /// Its value, as written.
    pub value: String,
    /// The values the row implements.
    pub implemented: String,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is {}, which gkq-decode does not implement for this architecture (it implements {})",
            self.key, self.value, self.implemented
        )
    }
}

/// `rope_scaling` types that mean no scaling.
const NO_ROPE_SCALING: &[&str] = &["default", "none"];

impl Decoder {
    /// The activation a `config.json` asks for (the row's default when its
    /// key is absent), and its `rope_scaling` checked: a value the row
    /// does not implement is refused, naming the key.
    pub fn check_config(&self, config: &serde_json::Value) -> Result<Activation, Unsupported> {
        let (key, default, known) = self.activation;
        let activation = match config.get(key).filter(|v| !v.is_null()) {
            None => default,
            Some(v) => known
                .iter()
                .find(|(name, _)| v.as_str() == Some(name))
                .map(|(_, a)| *a)
                .ok_or_else(|| Unsupported {
                    key: key.to_owned(),
                    value: v.to_string(),
                    implemented: known.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
                })?,
        };
        let scaling = config.get("rope_scaling").filter(|v| !v.is_null());
        if let Some(v) = scaling {
            let kind = v
                .get("rope_type")
                .or_else(|| v.get("type"))
                .and_then(serde_json::Value::as_str);
            self.check_rope_scaling("rope_scaling", kind.unwrap_or(""), &v.to_string())?;
        }
        Ok(activation)
    }

    /// Checks a rope scaling type (`kind`, shown as `shown`) of `key`.
    pub fn check_rope_scaling(
        &self,
        key: &str,
        kind: &str,
        shown: &str,
    ) -> Result<(), Unsupported> {
        if NO_ROPE_SCALING.contains(&kind) || self.rope_scaling.contains(&kind) {
            return Ok(());
        }
        let implemented: Vec<&str> = NO_ROPE_SCALING
            .iter()
            .chain(self.rope_scaling)
            .copied()
            .collect();
        Err(Unsupported {
            key: key.to_owned(),
            value: shown.to_owned(),
            implemented: format!("rope scaling {}", implemented.join(", ")),
        })
    }
}

/// Gemma 3's chat template, as Google publishes it with the instruction
/// tuned models (a GGUF of a base model may carry none).
pub const GEMMA3_CHAT_TEMPLATE: &str = "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n";

/// SiLU, as `hidden_act` names it.
const SILU: (&str, Activation, &[(&str, Activation)]) = (
    "hidden_act",
    Activation::Silu,
    &[("silu", Activation::Silu)],
);

/// Llama's computation (Mistral's too).
pub(super) const LLAMA: Decoder = Decoder {
    activation: SILU,
    embed_scale: EmbedScale::None,
    norm: Norm::W,
    gguf_rope_pairs: true,
    rope_scaling: &[],
    sliding: None,
    gemma_scales: false,
    derived: &[],
    derived_constants: &[],
    chat_template: None,
    export: true,
};

/// Qwen2's computation.
pub(super) const QWEN2: Decoder = Decoder {
    gguf_rope_pairs: false,
    ..LLAMA
};

/// Gemma 3's computation.
pub(super) const GEMMA3: Decoder = Decoder {
    activation: (
        "hidden_activation",
        Activation::GeluTanh,
        &[("gelu_pytorch_tanh", Activation::GeluTanh)],
    ),
    embed_scale: EmbedScale::SqrtHidden,
    norm: Norm::OnePlusW,
    gguf_rope_pairs: false,
    rope_scaling: &[],
    sliding: Some(Sliding {
        pattern: 6,
        local_base: 10_000.0,
    }),
    gemma_scales: true,
    derived: &[
        derived(
            "attention.sliding_window",
            "sliding_window",
            Derived::Value(0.0),
            true,
        ),
        derived(
            "rope.freq_base_swa",
            "rope_local_base_freq",
            Derived::Value(10_000.0),
            false,
        ),
        derived(
            "attention.key_length",
            "query_pre_attn_scalar",
            Derived::HeadDim,
            false,
        ),
        derived(
            "final_logit_softcapping",
            "final_logit_softcapping",
            Derived::Omit,
            false,
        ),
    ],
    derived_constants: &[
        ("sliding_window_pattern", "6"),
        ("hidden_activation", "\"gelu_pytorch_tanh\""),
    ],
    chat_template: Some(GEMMA3_CHAT_TEMPLATE),
    export: false,
};
