//! What to pack and how: the options of [`crate::pack`], the dtypes
//! checked, and the files that travel with the weights.

use std::path::PathBuf;

use gkq_format::DType;

use crate::error::{PackError, Result};
use crate::spectral;
use crate::types::QuantOptions;

/// The companion files copied into the package when the model has them
/// (the source crate's list).
pub use gkq_source::COMPANION_FILES;

/// The producing tool, recorded in `gkq.tool`.
pub const TOOL: &str = concat!("gkq-pack ", env!("CARGO_PKG_VERSION"));

/// What to pack and how.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// The source: a Hugging Face model directory (or ORG/NAME of the cache), or a GGUF file or directory of shards.
    pub model_dir: PathBuf,
    /// The output directory.
    pub out_dir: PathBuf,
    /// Row file dtypes (float or block types): the first is also the dtype
    /// of a role block whose type `quant` does not set (f32 when empty);
    /// the rows of a role block are always in its own type first.
    pub dtypes: Vec<DType>,
    /// `--quant`, `--token-embedding-type`, `--output-tensor-type`,
    /// `--allow-nonfinite` (see `types`).
    pub quant: QuantOptions,
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
    /// The warm set and its warm objects (FORMAT.md 7d).
    pub warm: WarmOptions,
    /// Row files for a quantized untied lm_head too (`--lm-head-rows`):
    /// by default it has none, since a node pulls it whole as its block
    /// and keeps it resident, and its rows would be the same bytes again.
    pub lm_head_rows: bool,
    /// Store each columnar block once, in its row file of its own dtype,
    /// with the runs object's layout (FORMAT.md 7e, version 5); off
    /// (`--knot-holds-blocks`): the block in the knot too, as versions
    /// 3 and 4 have it, for nodes that read no version 5.
    pub one_copy: bool,
}

impl PackOptions {
    /// Defaults: f32 blocks and rows, no overrides.
    pub fn new(model_dir: impl Into<PathBuf>, out_dir: impl Into<PathBuf>) -> PackOptions {
        PackOptions {
            model_dir: model_dir.into(),
            out_dir: out_dir.into(),
            dtypes: Vec::new(),
            quant: QuantOptions::default(),
            embed_tensor: None,
            lm_head_tensor: None,
            force: false,
            allow_lossy: false,
            model_id: None,
            revision: None,
            spectral: Vec::new(),
            runs: true,
            warm: WarmOptions::default(),
            lm_head_rows: false,
            one_copy: true,
        }
    }
}

/// The `--dtype` list: float or block types, each once (empty: the role
/// blocks' own types only, f32 where nothing sets one).
pub(crate) fn check_dtypes(dtypes: &[DType]) -> Result<Vec<DType>> {
    let mut out: Vec<DType> = Vec::new();
    for &d in dtypes {
        if !d.is_castable_float() && !d.is_quantized() {
            return Err(PackError::Dtype(format!(
                "{d} is not a row dtype: f32, f16, bf16 or a block type ({})",
                DType::quantized_names()
            )));
        }
        if out.contains(&d) {
            return Err(PackError::Dtype(format!("{d} given twice")));
        }
        out.push(d);
    }
    Ok(out)
}

/// `--warm-set`, `--warm-corpus`, `--warm-ids`.
#[derive(Clone, Debug, Default)]
pub struct WarmOptions {
    /// How many ids (`--warm-set K`): required with a corpus, a cap on a
    /// list of ids.
    pub k: Option<usize>,
    /// Workload files tokenized with the package's tokenizer.
    pub corpus: Vec<PathBuf>,
    /// A file of ids, most needed first.
    pub ids: Option<PathBuf>,
}

impl WarmOptions {
    /// Whether any warm option is set.
    pub fn is_set(&self) -> bool {
        self.k.is_some() || !self.corpus.is_empty() || self.ids.is_some()
    }
}
