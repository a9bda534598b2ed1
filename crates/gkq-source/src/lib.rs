//! `gkq-source`: reads a Hugging Face model directory — `config.json`, one
//! `model.safetensors` or shards listed in `model.safetensors.index.json` —
//! or a GGUF file (or its shards), and finds models in the local Hugging
//! Face cache.
//!
//! Shared by `gkq-pack` (which converts the model) and `gkq-verify` (which
//! checks a package against it), so that the release gate does not reuse the
//! packer's code to check the packer. Nothing here writes or prints.

pub mod config;
mod error;
pub mod gguf;
pub mod hub;
pub mod source;
mod tensors;

pub use config::ModelConfig;
pub use error::{Result, SourceError};
pub use source::{SourceFile, SourceModel, SourceTensor, header_tensors};

/// The companion files a package carries when the model directory has them
/// (docs/FORMAT.md 3.1, `package.files`): what a node needs besides the
/// weights to run the model. gkq-pack copies them; gkq-verify `--source`
/// holds the package's to the source's.
pub const COMPANION_FILES: &[&str] = &[
    "added_tokens.json",
    "config.json",
    "generation_config.json",
    "merges.txt",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
];
