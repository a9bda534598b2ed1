//! What to pack and how: the options of [`crate::pack`], the dtypes
//! checked, and the files that travel with the weights.

use std::path::PathBuf;

use gkq_format::DType;

use crate::error::{PackError, Result};
use crate::spectral;

/// The companion files copied into the package when the model has them
/// (docs/FORMAT.md 3.1, `package.files`): what a node needs besides the
/// weights to run the model.
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

/// The producing tool, recorded in `gkq.tool`.
pub const TOOL: &str = concat!("gkq-pack ", env!("CARGO_PKG_VERSION"));

/// What to pack and how.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// The Hugging Face model directory.
    pub model_dir: PathBuf,
    /// The output directory.
    pub out_dir: PathBuf,
    /// Row file dtypes; the first is also the dtype of the role blocks.
    pub dtypes: Vec<DType>,
    /// Override of the embedding tensor name.
    pub embed_tensor: Option<String>,
    /// Override of the lm_head tensor name.
    pub lm_head_tensor: Option<String>,
    /// Replace the contents of an existing output directory.
    pub force: bool,
    /// Accept narrowing casts that overflow to infinity.
    pub allow_lossy: bool,
    /// `source.model_id` (default: from a Hugging Face cache path, else none).
    pub model_id: Option<String>,
    /// `source.revision` (default: from a Hugging Face cache path, else none).
    pub revision: Option<String>,
    /// `--spectral PATTERN=SPEC`: tensors stored as rank-K spectral blocks.
    pub spectral: Vec<spectral::SpectralSpec>,
    /// Write a runs object next to each row file with path records
    /// (FORMAT.md 7b; `--no-runs` turns it off).
    pub runs: bool,
}

impl PackOptions {
    /// Defaults: f32 rows, no overrides.
    pub fn new(model_dir: impl Into<PathBuf>, out_dir: impl Into<PathBuf>) -> PackOptions {
        PackOptions {
            model_dir: model_dir.into(),
            out_dir: out_dir.into(),
            dtypes: vec![DType::F32],
            embed_tensor: None,
            lm_head_tensor: None,
            force: false,
            allow_lossy: false,
            model_id: None,
            revision: None,
            spectral: Vec::new(),
            runs: true,
        }
    }
}

pub(crate) fn check_dtypes(dtypes: &[DType]) -> Result<Vec<DType>> {
    let mut out: Vec<DType> = Vec::new();
    for &d in dtypes {
        if !d.is_castable_float() {
            return Err(PackError::Dtype(format!(
                "{d} is not one of f32, f16, bf16"
            )));
        }
        if out.contains(&d) {
            return Err(PackError::Dtype(format!("{d} given twice")));
        }
        out.push(d);
    }
    if out.is_empty() {
        out.push(DType::F32);
    }
    Ok(out)
}
