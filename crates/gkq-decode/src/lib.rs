//! `gkq-decode`: decoding a knot of the architectures of
//! `gkq_format::arch` (Qwen2, Llama, Mistral, Gemma 3), local or remote,
//! through `gkq-reader`: the token embedding from the reader's
//! [`gkq_reader::Embedding`] (columnar rows, each verified, when resolved;
//! else the dense block), the lm_head from the reader's resident
//! [`gkq_reader::LmHead`], every other block from the knot (a block type
//! kept in its blocks, a float one widened to f32).
//!
//! A [`Stage`] serves the input role, the output role or both, over a range
//! of layers: a pipeline-split fabric chains them ([`generate`] takes the
//! stages in order). The architecture's hyper-parameters come from the
//! package's `config.json`, which the knot pins by digest
//! (`package.files`), so a remote node needs nothing but the knot URL.
//!
//! The forward pass is written on candle-core ops rather than taken from
//! candle-transformers: its models own their embedding and lm_head, while
//! here those two come from the reader, and a stage runs only some layers.

mod config;
mod error;
mod generate;
mod kld;
mod kv;
mod load;
pub mod local;
mod logprobs;
mod model;
mod perplexity;
mod stage;

use serde::Serialize;

pub use config::{Config, DEFAULT_MAX_POSITIONS, supported};
pub use error::{DecodeError, Result};
pub use generate::{DEFAULT_UBATCH, GenOptions, Generation, Sampling, generate, generate_with};
pub use kld::{KlDivergence, kl_divergence};
pub use kv::{KvType, KvTypes};
pub use perplexity::{Perplexity, perplexity};
pub use stage::Stage;

gkq_store::stats! {
    /// Bytes a node fetched, per role (payload bytes, as the reader counts them).
    pub struct RoleBytes {
        /// Opening the knot: the header range, and the row file's HEAD.
        pub knot_header,
        /// Embedding rows and their Merkle proofs (or the dense block on fallback).
        pub embedding_rows,
        /// The lm_head matrix (0 for a stage without the output role).
        pub lm_head,
        /// Every other block: norms and layers, and config.json.
        pub other_blocks,
    }
}

impl RoleBytes {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.knot_header + self.embedding_rows + self.lm_head + self.other_blocks
    }
}

/// How a role was resolved, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RoleResolution {
    /// `token_embd` or `lm_head`.
    pub role: String,
    /// `columnar`, `dense`, `spectral` or `resident`.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// What a stage serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageRoles {
    /// Embedding lookups and the first layers.
    Input,
    /// The last layers, the final norm and lm_head.
    Output,
    /// The whole model.
    All,
}

/// Token ids of `text` with the `tokenizer.json` bytes given, for a model
/// of `vocab` rows, as every tool tokenizes (`gkq_text`: padding and
/// truncation off, special tokens as the tokenizer adds them).
pub fn tokenize(tokenizer_json: &[u8], vocab: u64, text: &str) -> Result<Vec<u32>> {
    let t = gkq_text::Tokenizer::from_bytes(tokenizer_json, vocab)?;
    Ok(t.encode(text)?)
}
