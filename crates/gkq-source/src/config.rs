//! The parts of a Hugging Face `config.json` that packing needs.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Result, SourceError};

use gkq_format::arch::{self, Arch, Roles};

/// What packing reads from `config.json`.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// Where it was read.
    pub path: PathBuf,
    /// `architectures[0]`, or `model_type` when absent.
    pub architecture: String,
    /// `model_type`.
    pub model_type: String,
    /// The architecture, when the table knows it (`gkq_format::arch`).
    pub arch: Option<&'static Arch>,
    /// Where its embedding and lm_head are: the architecture's names, or
    /// llama.cpp's for a GGUF; `None` when neither is known.
    pub roles: Option<Roles>,
    /// Whether it was derived from a GGUF (a llama.cpp language model).
    pub from_gguf: bool,
    /// `vocab_size`.
    pub vocab_size: u64,
    /// `hidden_size` / `n_embd` / `d_model`, when present.
    pub hidden_size: Option<u64>,
    /// `tie_word_embeddings`, or the architecture's default.
    pub tie_word_embeddings: bool,
}

/// Suffixes of `architectures[0]` for models that have an output projection
/// over the vocabulary (an lm_head). A bare encoder such as `BertModel` or a
/// sentence-embedding model has none.
const HEAD_ARCHITECTURES: &[&str] = &[
    "ForCausalLM",
    "LMHeadModel",
    "ForMaskedLM",
    "ForPreTraining",
    "ForConditionalGeneration",
];

impl ModelConfig {
    /// Whether the architecture has an lm_head (tied or not).
    pub fn has_lm_head(&self) -> bool {
        // a GGUF is a llama.cpp language model: its output is output.weight,
        // or the embedding when there is none
        self.from_gguf
            || HEAD_ARCHITECTURES
                .iter()
                .any(|s| self.architecture.ends_with(s))
    }
}

/// The longest `config.json` read: 4 MiB (a model's is a few KiB; parsed,
/// JSON takes many times its bytes).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

impl ModelConfig {
    /// Reads `<dir>/config.json` (a regular file of at most
    /// [`MAX_CONFIG_BYTES`]).
    pub fn read(dir: &Path) -> Result<ModelConfig> {
        let path = dir.join("config.json");
        let err = |reason: String| SourceError::Config {
            path: path.clone(),
            reason,
        };
        let text = gkq_files::read_text(
            &path,
            MAX_CONFIG_BYTES,
            "a config.json",
            gkq_files::Follow::Yes,
        )
        .map_err(|e| match e {
            gkq_files::FileError::Io { error, .. }
                if error.kind() == std::io::ErrorKind::NotFound =>
            {
                err(
                    "missing: a model directory needs its config.json (the architecture, sizes and tied embeddings come from it); copy it from the model's repository next to the safetensors files"
                        .into(),
                )
            }
            e => SourceError::File(e),
        })?;
        let v: Value = serde_json::from_str(&text).map_err(|source| SourceError::ConfigJson {
            path: path.clone(),
            source,
        })?;
        if !v.is_object() {
            return Err(err("not a JSON object".into()));
        }
        let model_type = v["model_type"].as_str().unwrap_or_default().to_owned();
        let architecture = v["architectures"][0]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| model_type.clone());
        if architecture.is_empty() {
            return Err(err("neither architectures nor model_type is set".into()));
        }
        let vocab_size = v["vocab_size"]
            .as_u64()
            .or_else(|| v["n_vocab"].as_u64())
            .ok_or_else(|| err("vocab_size is missing or not a non-negative integer".into()))?;
        let hidden_size = ["hidden_size", "n_embd", "d_model"]
            .iter()
            .find_map(|k| v[*k].as_u64());
        let arch = arch::of_config(&model_type, &architecture);
        if let Some(decoder) = arch.and_then(|a| a.decoder) {
            decoder
                .check_config(&v)
                .map_err(|u| err(format!("{u}: a package of it would decode wrong text")))?;
        }
        let roles = arch.map(|a| a.roles);
        let tie_word_embeddings = match &v["tie_word_embeddings"] {
            Value::Bool(b) => *b,
            Value::Null => roles.is_some_and(|r| r.tied_default),
            other => return Err(err(format!("tie_word_embeddings is {other}, not a bool"))),
        };
        Ok(ModelConfig {
            path,
            architecture,
            model_type,
            arch,
            roles,
            from_gguf: false,
            vocab_size,
            hidden_size,
            tie_word_embeddings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(json: &str) -> Result<ModelConfig> {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("config.json"), json).expect("write");
        ModelConfig::read(dir.path())
    }

    #[test]
    fn families_ties_and_heads() {
        let q = read(r#"{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","vocab_size":8,"hidden_size":4,"tie_word_embeddings":true}"#)
            .expect("qwen2");
        assert_eq!(q.arch.map(|a| a.name), Some("qwen2"));
        assert!(q.tie_word_embeddings && q.has_lm_head());
        assert_eq!((q.vocab_size, q.hidden_size), (8, Some(4)));
        // GPT-2: n_vocab/n_embd spellings, tied by the family's default
        let g = read(
            r#"{"architectures":["GPT2LMHeadModel"],"model_type":"gpt2","n_vocab":8,"n_embd":4}"#,
        )
        .expect("gpt2");
        assert_eq!(g.arch.map(|a| a.name), Some("gpt2"));
        assert!(g.tie_word_embeddings && g.has_lm_head());
        // a bare encoder has no lm_head
        let b = read(r#"{"architectures":["BertModel"],"model_type":"bert","vocab_size":8}"#)
            .expect("bert");
        assert!(!b.has_lm_head());
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        let e = |json: &str| read(json).expect_err(json).to_string();
        assert!(e("{ not json").contains("invalid JSON"));
        // the parser's finding is kept as the cause, and printed after it
        match read("{ not json") {
            Err(err @ SourceError::ConfigJson { .. }) => {
                let cause = std::error::Error::source(&err).expect("a cause");
                assert!(cause.is::<serde_json::Error>());
                let line = gkq_format::error_chain(&err);
                assert!(
                    line.ends_with(&format!("config.json: invalid JSON: {cause}")),
                    "{line}"
                );
            }
            other => panic!("expected ConfigJson, got {other:?}"),
        }
        assert!(e("[1]").contains("not a JSON object"));
        assert!(e(r#"{"vocab_size":8}"#).contains("neither architectures nor model_type"));
        assert!(e(r#"{"model_type":"llama"}"#).contains("vocab_size is missing"));
        assert!(
            e(r#"{"model_type":"llama","vocab_size":8,"tie_word_embeddings":"yes"}"#)
                .contains("not a bool")
        );
        // what the decoder's row does not implement, named by its key
        let llama = r#"{"model_type":"llama","vocab_size":8,"#;
        let relu = e(&format!(r#"{llama}"hidden_act":"relu"}}"#));
        assert!(
            relu.contains(r#"hidden_act is "relu""#) && relu.contains("silu"),
            "{relu}"
        );
        let yarn = e(&format!(
            r#"{llama}"rope_scaling":{{"rope_type":"yarn","factor":4}}}}"#
        ));
        assert!(
            yarn.contains("rope_scaling is {") && yarn.contains("yarn"),
            "{yarn}"
        );
        read(&format!(
            r#"{llama}"hidden_act":"silu","rope_scaling":null}}"#
        ))
        .expect("silu");
        // an architecture only packed is not checked: gkq-decode does not run it
        read(r#"{"model_type":"gpt2","vocab_size":8,"hidden_act":"gelu_new"}"#).expect("gpt2");
        let dir = tempfile::tempdir().expect("tmp");
        let missing = ModelConfig::read(dir.path()).expect_err("none").to_string();
        assert!(missing.contains("needs its config.json"), "{missing}");
    }
}
