//! `gkq-pack`: flags in, report out. The work is in the library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use gkq_format::DType;
use gkq_pack::{PackOptions, PackReport};

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

Output: the report (files, digests, the knot id) goes to stderr, with a progress bar on a terminal; --json prints one object on stdout instead; --quiet prints nothing.

Exit status: 0 packed; 1 error (nothing is left behind: an existing OUT_DIR keeps its old package); 2 usage error.";

/// Pack a Hugging Face model directory into a GKQ v2 knot and columnar row files.
#[derive(Parser, Debug)]
#[command(
    name = "gkq-pack",
    version = gkq_cli::version_line(FEATURES),
    override_usage = "gkq-pack <MODEL_DIR> --out <OUT_DIR> [OPTIONS]\n       gkq-pack <MODEL_DIR> --analyze",
    after_help = AFTER_HELP
)]
struct Args {
    /// Model directory (config.json plus model.safetensors, or shards with
    /// model.safetensors.index.json), or ORG/NAME of a model in the local
    /// Hugging Face cache (HF_HUB_CACHE, HF_HOME; nothing is downloaded).
    model_dir: PathBuf,
    /// Output directory (must not exist unless --force).
    #[arg(
        short,
        long,
        value_name = "OUT_DIR",
        required_unless_present = "analyze"
    )]
    out: Option<PathBuf>,
    /// Write nothing: print, for every 2-D float tensor, the singular value
    /// spectrum (rank for 99 %, 99.9 %, 99.99 % of the energy), the relative
    /// Frobenius error at ranks 32, 64, 128, 256, and the bytes a spectral
    /// block would take there (quant 0 with 16-bit factors, quant 1 u8)
    /// against the dense bytes. Computed in f64 with faer, on one thread.
    #[arg(long, conflicts_with = "out", help_heading = "Low-rank blocks")]
    analyze: bool,
    /// Row file dtype, repeatable; the first is also the dtype of the
    /// embedding's and lm_head's dense blocks unless a type below sets it.
    /// Accepted: f32, f16, bf16 (and fp32, float32, fp16, float16, half,
    /// bfloat16), or a block type (q8_0, q4_0, ...; rows of a float block in
    /// a block type are lossy: a node takes them only when asked). Default:
    /// f32, or with a block-type role only that type's rows.
    #[arg(short, long = "dtype", value_name = "DTYPE", value_parser = DType::parse_row)]
    dtypes: Vec<DType>,
    /// Store every 2-D float weight matrix in TYPE, one of ggml's block
    /// types (FORMAT.md 3.5): q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k,
    /// q6_k; or one of llama-quantize's file types (case-insensitive):
    /// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K,
    /// with its per-layer rules (Q4_K_M: attn_v and ffn_down of some layers
    /// in q6_k). 1-D tensors (norms, biases) stay as they are. It also
    /// sets the two roles as llama-quantize does: the token embedding in
    /// TYPE, the lm_head in q6_k (q8_0 when TYPE is q8_0); a tied
    /// embedding is the lm_head, so q6_k. Rows that are not whole blocks
    /// fall back as llama-quantize's do: q4_k / q5_k / q6_k to q5_0 / q5_1
    /// / q8_0, then f16 (the report names each).
    #[arg(long, value_name = "TYPE", value_parser = gkq_pack::parse_quant, help_heading = "Quantization")]
    quant: Option<(DType, gkq_pack::Mix)>,
    /// The token embedding's type: a block type or f32, f16, bf16.
    #[arg(long, value_name = "TYPE", value_parser = DType::parse_row, help_heading = "Quantization")]
    token_embedding_type: Option<DType>,
    /// The lm_head's type: a block type or f32, f16, bf16. In a tied model
    /// it is the embedding's, and differing types are refused.
    #[arg(long, value_name = "TYPE", value_parser = DType::parse_row, help_heading = "Quantization")]
    output_tensor_type: Option<DType>,
    /// Quantize tensors that hold NaN or infinities (refused by default,
    /// naming the tensor, row and column).
    #[arg(long, help_heading = "Quantization")]
    allow_nonfinite: bool,
    /// Replace the contents of an existing output directory.
    #[arg(short, long)]
    force: bool,
    /// Accept narrowing casts that turn finite values into infinities.
    #[arg(long)]
    allow_lossy: bool,
    /// Name of the token-embedding tensor (default: from config.json).
    #[arg(long, value_name = "NAME", help_heading = "Source")]
    embed_tensor: Option<String>,
    /// Name of the lm_head tensor (default: from config.json).
    #[arg(long, value_name = "NAME", help_heading = "Source")]
    lm_head_tensor: Option<String>,
    /// Model id recorded as source.model_id (default: read from a Hugging
    /// Face cache path, models--ORG--NAME/snapshots/REV; else none).
    #[arg(long, value_name = "ORG/NAME", help_heading = "Source")]
    model_id: Option<String>,
    /// Revision recorded as source.revision (default: from a Hugging Face
    /// cache path; else none).
    #[arg(long, value_name = "REV", help_heading = "Source")]
    revision: Option<String>,
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
    spectral: Vec<String>,
    /// Write no runs objects (`<row file>.runs`: each row with its Merkle
    /// path, so a node fetches a run of rows and its proof in one range;
    /// they add about 1.1 × each row file). Nodes then fetch rows and
    /// proofs from two objects, two requests per run.
    #[arg(long)]
    no_runs: bool,
    /// Write a warm object next to each row file of the token embedding
    /// (`<row file>.warm`: the K rows most sessions need, with everything
    /// that verifies them, so a cold node seeds its cache with one range
    /// request). K ids: the most needed ones of --warm-corpus, or at most
    /// K of --warm-ids.
    #[arg(long, value_name = "K", help_heading = "Warm set")]
    warm_set: Option<usize>,
    /// Text files to rank ids by: each .txt file one session, each line of
    /// a .jsonl file one session ({"text": …} or {"messages": […]}),
    /// tokenized with the model's tokenizer.json as a node would. An id
    /// ranks by the number of sessions that use it.
    #[arg(long, value_name = "FILE", num_args = 1.., help_heading = "Warm set")]
    warm_corpus: Vec<PathBuf>,
    /// A file of token ids, most needed first (decimals separated by
    /// commas or white space, a JSON array, or `gkq-report --json`'s
    /// output, whose warm_ids it takes).
    #[arg(
        long,
        value_name = "FILE",
        help_heading = "Warm set",
        conflicts_with = "warm_corpus"
    )]
    warm_ids: Option<PathBuf>,
    /// Print one JSON object on stdout.
    #[arg(long, help_heading = "Output")]
    json: bool,
    /// No human output and no progress bar.
    #[arg(short, long, help_heading = "Output")]
    quiet: bool,
}

/// A row file's lines: the rows, the proof object, the runs object.
fn human_row_file(c: &gkq_pack::ColumnarReport) {
    let exact = match (c.source_exact, c.block_exact) {
        (true, true) => "exact (source and block)",
        (true, false) => "exact (source)",
        (false, true) => "exact (block)",
        (false, false) => "not exact",
    };
    eprintln!(
        "  {}  {} rows x {} bytes ({} {})  sha256 {}  max abs error vs source {:e}, {exact}",
        c.path.display(),
        c.rows,
        c.row_bytes,
        c.role,
        c.dtype,
        c.sha256,
        c.max_abs_error_vs_source
    );
    eprintln!(
        "  {}  {} bytes  merkle root {}  proof height {} ({} B per row fetched)",
        c.proof.path.display(),
        c.proof.bytes,
        c.merkle_root,
        c.proof_height,
        32 * u32::from(c.proof_height)
    );
    if let Some(runs) = &c.runs {
        eprintln!(
            "  {}  {} bytes  each row with its record ({} B strides: one range per run of rows)",
            runs.path.display(),
            runs.bytes,
            c.row_bytes + 32 * u64::from(c.proof_height)
        );
    }
    if let Some(warm) = &c.warm {
        eprintln!(
            "  {}  {} bytes  the chunk table and the warm rows with their records (one range warms a node)",
            warm.path.display(),
            warm.bytes,
        );
    }
}

fn human(r: &PackReport) {
    eprintln!(
        "packed {} tensors ({} source bytes) in {:.2}s, {}",
        r.tensors,
        r.source_bytes,
        r.seconds,
        match (&r.lm_head, r.tied) {
            (None, _) => "no lm_head (the architecture has no output projection)".to_owned(),
            (Some(_), true) => "lm_head tied to the embedding".to_owned(),
            (Some(name), false) => format!("lm_head {name} untied"),
        }
    );
    if let Some(id) = &r.model_id {
        eprintln!(
            "  source {id}{}",
            r.revision
                .as_ref()
                .map_or_else(String::new, |rev| format!(" @ {rev}"))
        );
    }
    eprintln!("  {}  {} bytes", r.knot.path.display(), r.knot.bytes);
    eprintln!("  knot id {} (pin it with --knot-id)", r.knot_id);
    if let Some(w) = &r.warm {
        let from = match w.from.as_str() {
            "corpus" => format!("the ids most of the corpus's {} sessions use", w.sessions),
            _ => "--warm-ids".to_owned(),
        };
        eprintln!("  warm set of {} rows: {from}", w.rows);
    }
    for c in &r.columnar {
        human_row_file(c);
    }
    for c in &r.companions {
        eprintln!(
            "  {}  {} bytes  sha256 {}",
            c.path.display(),
            c.bytes,
            c.sha256
        );
    }
    for q in &r.quantized {
        eprintln!(
            "  {} {}  {} bytes  rmse {:.3e}  max abs error {:.3e} (vs source)",
            q.dtype, q.tensor, q.bytes, q.rmse, q.max_abs_error
        );
    }
    for f in &r.fallbacks {
        eprintln!(
            "  fell back: {} in {}, not {}: {}",
            f.tensor, f.stored, f.asked, f.reason
        );
    }
    for s in &r.spectral {
        eprintln!(
            "  spectral {}  {}x{} rank {}  {} factors{}  {} bytes ({:.1} % of dense)  rel. Frobenius error {:.3e}  energy kept {:.6}",
            s.tensor,
            s.shape[0],
            s.shape[1],
            s.rank,
            s.factor_dtype,
            if s.quant == 1 { " (quant 1)" } else { "" },
            s.bytes,
            100.0 * s.bytes as f64 / s.dense_bytes as f64,
            s.rel_frobenius_error,
            s.energy_kept
        );
    }
    for c in &r.casts {
        eprintln!(
            "  cast {} {} -> {}: max abs error {:e}",
            c.tensor, c.from, c.to, c.max_abs_error
        );
    }
}

/// The --analyze table: one line per tensor.
fn human_analysis(r: &gkq_pack::AnalyzeReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "# {}", r.method);
    let _ = writeln!(
        s,
        "tensor\tshape\tdtype\trank@99%\trank@99.9%\trank@99.99%\terr@32\terr@64\terr@128\terr@256\tdense B\tq0-16bit B @32/64/128/256\tq1 B @32/64/128/256"
    );
    for t in &r.tensors {
        let e: Vec<String> = t
            .at_rank
            .iter()
            .map(|a| format!("{:.2e}", a.rel_frobenius_error))
            .collect();
        let q0: Vec<String> = t
            .at_rank
            .iter()
            .map(|a| a.bytes_quant0_16bit.to_string())
            .collect();
        let q1: Vec<String> = t
            .at_rank
            .iter()
            .map(|a| a.bytes_quant1.to_string())
            .collect();
        let _ = writeln!(
            s,
            "{}{}\t{}x{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            t.tensor,
            t.role.as_ref().map_or(String::new(), |r| format!(" ({r})")),
            t.shape[0],
            t.shape[1],
            t.dtype,
            t.rank_for_energy[0],
            t.rank_for_energy[1],
            t.rank_for_energy[2],
            e.join("\t"),
            t.dense_bytes,
            q0.join("/"),
            q1.join("/"),
        );
    }
    s
}

fn run(args: Args) -> anyhow::Result<()> {
    if args.analyze {
        let report = gkq_pack::analyze(&args.model_dir, &gkq_pack::NoProgress)?;
        let text = if args.json {
            serde_json::to_string_pretty(&report)? + "\n"
        } else {
            human_analysis(&report)
        };
        let mut out = std::io::stdout().lock();
        return match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            // a closed pipe (`| head`) is not an error
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => Ok(other.context("writing the analysis to stdout")?),
        };
    }
    let opts = PackOptions {
        model_dir: args.model_dir,
        out_dir: args.out.context("--out is required")?,
        dtypes: args.dtypes,
        quant: gkq_pack::QuantOptions {
            weights: args.quant.map(|(d, _)| d),
            mix: args.quant.map_or(gkq_pack::Mix::None, |(_, m)| m),
            token_embedding: args.token_embedding_type,
            output: args.output_tensor_type,
            allow_nonfinite: args.allow_nonfinite,
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
        warm: gkq_pack::WarmOptions {
            k: args.warm_set,
            corpus: args.warm_corpus,
            ids: args.warm_ids,
        },
    };
    let bar = gkq_cli::Bar::new("", !args.quiet && !args.json);
    let report = gkq_pack::pack(&opts, &bar)?;
    bar.finish();
    if args.json {
        let mut out = std::io::stdout().lock();
        let written = writeln!(out, "{}", serde_json::to_string_pretty(&report)?);
        match written.and_then(|()| out.flush()) {
            // a closed pipe (`| head`) is not an error: the package is written
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other.context("writing the report to stdout")?,
        }
    } else if !args.quiet {
        human(&report);
    }
    Ok(())
}

fn main() -> ExitCode {
    gkq_cli::exit("gkq-pack", run(gkq_cli::parse::<Args>("gkq-pack")))
}
