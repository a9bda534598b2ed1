//! gkq-pack's flags (clap) and the options they ask for: the binary
//! parses them and calls [`gkq_pack::pack`] or [`gkq_pack::analyze`].

use std::path::PathBuf;

use clap::Parser;
use gkq_format::DType;

use gkq_pack::{PackOptions, Result};

/// The features of this build, for `--version`.
const FEATURES: &[&str] = if cfg!(feature = "spectral") {
    &["spectral"]
} else {
    &[]
};

const AFTER_HELP: &str = "\
Examples:
  gkq-pack ./Qwen2.5-0.5B -o out/qwen                      f32 row files (the default)
  gkq-pack ./Qwen2.5-0.5B -o out/qwen --dtype f32 --dtype bf16
                                                           f32 blocks, f32 and bf16 row files
  gkq-pack ./Qwen2.5-0.5B -o out/q4 --quant q4_0 --output-tensor-type q4_0
                                                           4-bit weights, embedding and lm_head (ggml Q4_0)
  gkq-pack Qwen/Qwen2.5-0.5B -o out/qwen --force           from the local Hugging Face cache, replacing out/qwen
  gkq-pack ./model -o out/m --spectral 'model.layers.*.self_attn.k_proj.weight=rank:64'
  gkq-pack ./model --analyze                               which tensors are low-rank (writes nothing)
  gkq-pack SmolLM2-135M-Instruct.Q4_1.gguf -o out/smol      a GGUF as it is (its tokenizer and template travel in metadata.gguf)
  gkq-pack model-Q8_0.gguf -o out/q4 --quant Q4_K_M --allow-requantize
                                                           llama-quantize's Q4_K_M mix from an already quantized GGUF

Output: the report (files, digests, the knot id) goes to stderr, with a progress bar on a terminal; --json prints one object on stdout instead; --quiet prints nothing.

Exit status: 0 packed; 1 error (nothing is left behind: an existing OUT_DIR keeps its old package); 2 usage error.";

/// Pack a Hugging Face model directory or a GGUF (a .gguf file, or a directory of its shards) into a GKQ v2 knot and columnar row files.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "gkq-pack",
    version = gkq_cli::version_line(FEATURES),
    override_usage = "gkq-pack <MODEL_DIR|MODEL.gguf> --out <OUT_DIR> [OPTIONS]\n       gkq-pack <MODEL_DIR> --analyze",
    after_help = AFTER_HELP
)]
pub(crate) struct Args {
    /// Model directory (config.json plus model.safetensors, or shards with
    /// model.safetensors.index.json), ORG/NAME of a model in the local
    /// Hugging Face cache (HF_HUB_CACHE, HF_HOME; nothing is downloaded), or
    /// a GGUF: a .gguf file, or a directory of its shards (every tensor kept
    /// in its own type and bytes).
    #[arg(value_name = "MODEL_DIR|MODEL.gguf")]
    pub(crate) model_dir: PathBuf,
    /// Output directory (must not exist unless --force).
    #[arg(
        short,
        long,
        value_name = "OUT_DIR",
        required_unless_present = "analyze"
    )]
    pub(crate) out: Option<PathBuf>,
    /// Write nothing: print, for every 2-D float tensor, the singular value
    /// spectrum (rank for 99 %, 99.9 %, 99.99 % of the energy), the relative
    /// Frobenius error at ranks 32, 64, 128, 256, and the bytes a spectral
    /// block would take there (quant 0 with 16-bit factors, quant 1 u8)
    /// against the dense bytes. Computed in f64 with faer, on one thread.
    #[arg(long, conflicts_with = "out", help_heading = "Low-rank blocks")]
    pub(crate) analyze: bool,
    /// Row file dtype, repeatable; the first is also the dtype of the
    /// embedding's and lm_head's dense blocks unless a type below sets it.
    /// Accepted: f32, f16, bf16 (and fp32, float32, fp16, float16, half,
    /// bfloat16), or a block type (q8_0, q4_0, ...; rows of a float block in
    /// a block type are lossy: a node takes them only when asked). Default:
    /// f32, or with a block-type role only that type's rows.
    #[arg(short, long = "dtype", value_name = "DTYPE", value_parser = DType::parse_row)]
    pub(crate) dtypes: Vec<DType>,
    /// Store every 2-D float weight matrix in TYPE, one of ggml's block
    /// types (FORMAT.md 3.5): q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k,
    /// q6_k; named as llama-quantize's file types (case-insensitive):
    /// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K_S, Q4_K_M, Q4_K, Q5_K_S, Q5_K_M,
    /// Q5_K, Q6_K, with their per-layer rules (Q4_K is Q4_K_M: attn_v and
    /// ffn_down of some layers in q6_k; Q5_K is Q5_K_M; --pure for none). 1-D tensors (norms, biases) stay as they are. It also
    /// sets the two roles as llama-quantize does: the token embedding in
    /// TYPE, the lm_head in q6_k (q8_0 when TYPE is q8_0); a tied
    /// embedding is the lm_head, so q6_k. Rows that are not whole blocks
    /// fall back as llama-quantize's do: q4_k / q5_k / q6_k to q5_0 / q5_1
    /// / q8_0, then f16 (the report names each).
    #[arg(long, value_name = "TYPE", value_parser = gkq_pack::parse_quant, help_heading = "Quantization")]
    pub(crate) quant: Option<(DType, gkq_pack::Mix)>,
    /// Every tensor --quant touches in its type, the lm_head too: no file
    /// type's per-layer rules, no q6_k lm_head (llama-quantize's --pure).
    #[arg(long, requires = "quant", help_heading = "Quantization")]
    pub(crate) pure: bool,
    /// The token embedding's type: a block type or f32, f16, bf16.
    #[arg(long, value_name = "TYPE", value_parser = DType::parse_row, help_heading = "Quantization")]
    pub(crate) token_embedding_type: Option<DType>,
    /// The lm_head's type: a block type or f32, f16, bf16. In a tied model
    /// it is the embedding's, and differing types are refused.
    #[arg(long, value_name = "TYPE", value_parser = DType::parse_row, help_heading = "Quantization")]
    pub(crate) output_tensor_type: Option<DType>,
    /// Quantize tensors that hold NaN or infinities (refused by default,
    /// naming the tensor, row and column).
    #[arg(long, help_heading = "Quantization")]
    pub(crate) allow_nonfinite: bool,
    /// Store a tensor that is already quantized (a GGUF's) in another type:
    /// dequantize it, then quantize it, as llama-quantize's
    /// --allow-requantize (the errors add up). A tensor already in the type
    /// asked for passes through unchanged without it.
    #[arg(long, help_heading = "Quantization")]
    pub(crate) allow_requantize: bool,
    /// Replace the contents of an existing output directory.
    #[arg(short, long)]
    pub(crate) force: bool,
    /// Accept narrowing casts that turn finite values into infinities.
    #[arg(long)]
    pub(crate) allow_lossy: bool,
    /// Name of the token-embedding tensor (default: from config.json).
    #[arg(long, value_name = "NAME", help_heading = "Source")]
    pub(crate) embed_tensor: Option<String>,
    /// Name of the lm_head tensor (default: from config.json).
    #[arg(long, value_name = "NAME", help_heading = "Source")]
    pub(crate) lm_head_tensor: Option<String>,
    /// Model id recorded as source.model_id (default: read from a Hugging
    /// Face cache path, models--ORG--NAME/snapshots/REV; else none).
    #[arg(long, value_name = "ORG/NAME", help_heading = "Source")]
    pub(crate) model_id: Option<String>,
    /// Revision recorded as source.revision (default: from a Hugging Face
    /// cache path; else none).
    #[arg(long, value_name = "REV", help_heading = "Source")]
    pub(crate) revision: Option<String>,
    /// Store the tensors whose names match PATTERN (a glob: `*`, `?`,
    /// `[...]`) as rank-K spectral blocks (FORMAT.md section 5), repeatable.
    /// SPEC is `rank:K` or `energy:X` (the smallest K keeping at least X of
    /// the energy Σσ²), then optionally `,quant:u8` (u8 per-row affine
    /// factors) or `,factors:f32|f16|bf16` (default: the tensor's dtype).
    /// The embedding and lm_head are refused; a pattern matching nothing is
    /// an error. Example: 'model.layers.*.self_attn.k_proj.weight=rank:64'.
    #[arg(
        long = "spectral",
        value_name = "PATTERN=SPEC",
        conflicts_with = "analyze",
        help_heading = "Low-rank blocks"
    )]
    pub(crate) spectral: Vec<String>,
    /// Put no Merkle paths beside the rows a node reads: neither inline in
    /// the row file (the default for a block's own row file) nor in a
    /// runs object (`<row file>.runs`). Nodes then fetch rows and proofs
    /// from two objects, two requests per run, but a node that pulls a
    /// tied model's whole embedding as its lm_head no longer downloads
    /// the paths before its first token.
    #[arg(long)]
    pub(crate) no_runs: bool,
    /// Write row files for a quantized untied lm_head too. By default it has none: a node pulls it whole as its block and keeps it resident, and its rows would be the same bytes a second time (plus proofs and runs). An f32/bf16 lm_head keeps its rows either way.
    #[arg(long = "lm-head-rows")]
    pub(crate) lm_head_rows: bool,
    /// Keep each row-file block's bytes in the knot too, and its row file
    /// plain beside a runs object (the version 3/4 layout, for nodes that
    /// read no version 5 knot). By default a block with a row file of its
    /// own type is stored once, in that file, each row followed by its
    /// Merkle path (FORMAT.md 7e): about half the package.
    #[arg(long = "knot-holds-blocks")]
    pub(crate) knot_holds_blocks: bool,
    /// Write a warm object next to each row file of the token embedding
    /// (`<row file>.warm`: the K rows most sessions need, with everything
    /// that verifies them, so a cold node seeds its cache with one range
    /// request). K ids: the most needed ones of --warm-corpus, or at most
    /// K of --warm-ids.
    #[arg(long, value_name = "K", help_heading = "Warm set")]
    pub(crate) warm_set: Option<usize>,
    /// Text files to rank ids by: each .txt file one session, each line of
    /// a .jsonl file one session ({"text": …} or {"messages": […]}),
    /// tokenized with the model's tokenizer.json as a node would. An id
    /// ranks by the number of sessions that use it.
    #[arg(long, value_name = "FILE", num_args = 1.., help_heading = "Warm set")]
    pub(crate) warm_corpus: Vec<PathBuf>,
    /// A file of token ids, most needed first (decimals separated by
    /// commas or white space, a JSON array, or `gkq-report --json`'s
    /// output, whose warm_ids it takes).
    #[arg(
        long,
        value_name = "FILE",
        help_heading = "Warm set",
        conflicts_with = "warm_corpus"
    )]
    pub(crate) warm_ids: Option<PathBuf>,
    /// Print one JSON object on stdout.
    #[arg(long, help_heading = "Output")]
    pub(crate) json: bool,
    /// No human output and no progress bar.
    #[arg(short, long, help_heading = "Output")]
    pub(crate) quiet: bool,
}

impl Args {
    /// The options these flags ask for, writing to `out_dir` (`--out`).
    pub(crate) fn options(&self, out_dir: PathBuf) -> Result<PackOptions> {
        let args = self.clone();
        Ok(PackOptions {
            model_dir: args.model_dir,
            out_dir,
            dtypes: args.dtypes,
            quant: gkq_pack::QuantOptions {
                weights: args.quant.map(|(d, _)| d),
                mix: match args.quant {
                    _ if args.pure => gkq_pack::Mix::Pure,
                    Some((_, m)) => m,
                    None => gkq_pack::Mix::None,
                },
                token_embedding: args.token_embedding_type,
                output: args.output_tensor_type,
                allow_nonfinite: args.allow_nonfinite,
                allow_requantize: args.allow_requantize,
            },
            embed_tensor: args.embed_tensor,
            lm_head_tensor: args.lm_head_tensor,
            force: args.force,
            allow_lossy: args.allow_lossy,
            model_id: args.model_id,
            revision: args.revision,
            spectral: args
                .spectral
                .iter()
                .map(|s| s.parse())
                .collect::<Result<_, _>>()?,
            runs: !args.no_runs,
            lm_head_rows: args.lm_head_rows,
            one_copy: !args.knot_holds_blocks,
            warm: gkq_pack::WarmOptions {
                k: args.warm_set,
                corpus: args.warm_corpus,
                ids: args.warm_ids,
            },
        })
    }
}
