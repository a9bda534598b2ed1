//! What `gkq-decode` does once its flags are parsed ([`RunOptions`]): open
//! the stages, make the prompt (ids, raw text, or a chat rendered with the
//! model's template, tokenized with the package's own tokenizer), decode,
//! and write what a user reads: with text in, the text out as it comes
//! (stdout) and the figures after it (stderr); with ids in, the report
//! (stdout); with `--json`, one JSON object. Nothing is printed here but to
//! the writers given.

mod args;
mod conversation;
pub(crate) mod flags;
mod prompt;
mod report;
mod score;

use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Instant;

use gkq_reader::ReaderConfig;

pub(crate) use args::Args;
pub(crate) use flags::{llama_cpp_flag, long_forms};
pub(crate) use prompt::Prompt;

use gkq_decode::{DecodeError, Result, local};
use gkq_decode::{GenOptions, Generation, Sampling, Stage, StageRoles, generate_with};
use gkq_text::Tokenizer;

/// Everything a run needs (the binary's flags, validated).
#[derive(Debug)]
pub(crate) struct RunOptions {
    /// The knot: a path, a package directory, or a URL.
    pub(crate) knot: String,
    /// The prompt.
    pub(crate) prompt: Prompt,
    /// A tokenizer.json instead of the package's tokenizer.
    pub(crate) tokenizer: Option<PathBuf>,
    /// The chat template instead of the package's (`--chat-template`).
    pub(crate) chat_template: Option<String>,
    /// Texts the generation stops at (`-r`).
    pub(crate) reverse_prompts: Vec<String>,
    /// Tokens to generate at most (`None`: until an end token or the
    /// model's positions run out).
    pub(crate) max_new: Option<usize>,
    /// Generate past end-of-generation tokens.
    pub(crate) ignore_eos: bool,
    /// Prompt tokens per forward pass of the prefill.
    pub(crate) ubatch: usize,
    /// Every weight loaded and verified before the prompt (`--load-first`).
    pub(crate) load_first: bool,
    /// How tokens are picked.
    pub(crate) sampling: Sampling,
    /// The roles of this stage.
    pub(crate) roles: StageRoles,
    /// The layers of this stage.
    pub(crate) layers: Option<Range<usize>>,
    /// A two-node pipeline in this process, split at this layer.
    pub(crate) split: Option<usize>,
    /// Input stage: where the hidden states go.
    pub(crate) hidden_out: Option<PathBuf>,
    /// One JSON object instead of text.
    pub(crate) json: bool,
    /// Where the first step's logits go.
    pub(crate) logits_out: Option<PathBuf>,
    /// The per-step logits' digests in the text report.
    pub(crate) verbose: bool,
    /// A raw prompt echoed before its continuation (not
    /// `--no-display-prompt`), as llama.cpp's tools echo it.
    pub(crate) display_prompt: bool,
    /// The context (`-c`); `None`: the model's.
    pub(crate) context: Option<usize>,
    /// How the KV cache keeps keys and values (`-ctk`, `-ctv`).
    pub(crate) kv: gkq_decode::KvTypes,
    /// `--perplexity`: the tokens a chunk (`-c`, 512 by default; 0: the
    /// model's positions).
    pub(crate) perplexity: Option<usize>,
    /// `--kl-divergence`: compare with the base file.
    pub(crate) kl_divergence: bool,
    /// `--kl-divergence-base`: the file `--perplexity` writes or
    /// `--kl-divergence` reads.
    pub(crate) kl_base: Option<PathBuf>,
    /// The compute threads (reported; set by the binary before candle starts).
    pub(crate) threads: usize,
    /// The reader's configuration.
    pub(crate) reader: ReaderConfig,
    /// When the process started (the time to first token counts from it).
    pub(crate) started: Instant,
}

/// The writers a run reports to, and the reader of a conversation's turns.
pub(crate) struct Out<'a> {
    /// The user's turns (`-cnv`).
    pub(crate) stdin: &'a mut (dyn std::io::BufRead + Send),
    /// What a user reads: the text, the report or the JSON.
    pub(crate) stdout: &'a mut (dyn Write + Send),
    /// The figures after streamed text.
    pub(crate) stderr: &'a mut (dyn Write + Send),
}

fn write_err(e: std::io::Error) -> DecodeError {
    DecodeError::Io {
        path: PathBuf::from("<stdout>"),
        error: e,
    }
}

/// Runs `o` (see the module docs).
pub(crate) fn run(o: &RunOptions, out: &mut Out<'_>) -> Result<()> {
    // the decode runs on a thread of its compute pool: a parallel matmul
    // then shares its rows with the other threads, waiting on none, where
    // called from outside it would wake them all and sleep until they end
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(o.threads.max(1))
        .thread_name(|i| format!("gkq-compute-{i}"))
        .build()
        .map_err(|e| DecodeError::Stages(format!("the compute threads: {e}")))?;
    let packed = packed(o, out)?;
    let knot = packed
        .as_ref()
        .map_or_else(|| o.knot.clone(), |p| p.dir.display().to_string());
    pool.install(|| run_in_pool(o, &knot, out))
}

/// A GGUF or a Hugging Face directory given for the knot: packed (into
/// the cache, see `gkq_decode::local`), with one line saying so and how to
/// publish it.
fn packed(o: &RunOptions, out: &mut Out<'_>) -> Result<Option<local::Packed>> {
    let Some(source) = local::source_of(&o.knot) else {
        return Ok(None);
    };
    let bar = gkq_cli::Bar::new("packing ", o.reader.progress.is_some());
    let p = local::pack(&source, o.reader.cache.dir.as_deref(), &bar)?;
    bar.finish();
    let how = match p.took {
        Some(t) => format!(
            "packed it into {} in {:.1} s",
            p.dir.display(),
            t.as_secs_f64()
        ),
        None => format!("running its package in {} (packed before)", p.dir.display()),
    };
    writeln!(
        out.stderr,
        "gkq-decode: note: {src} is a model, not a GKQ package: {how}; to publish it: gkq-pack {src} --out DIR, gkq-verify DIR, then serve DIR and give its URL",
        src = source.display()
    )
    .map_err(write_err)?;
    Ok(Some(p))
}

fn run_in_pool(o: &RunOptions, knot: &str, out: &mut Out<'_>) -> Result<()> {
    if let Some(l) = o.split {
        if o.roles != StageRoles::All {
            return Err(DecodeError::Usage(
                "--split makes both stages: use it with --roles all".into(),
            ));
        }
        return split(o, knot, l, out);
    }
    let mut stage =
        Stage::open(knot, o.reader.clone(), o.roles, o.layers.clone())?.with_cache_types(o.kv);
    match o.roles {
        StageRoles::All => decode(o, std::slice::from_mut(&mut stage), out),
        StageRoles::Input => report::input_stage(o, stage, out),
        StageRoles::Output => report::output_stage(o, stage, out),
    }
}

/// A two-node pipeline in this process.
fn split(o: &RunOptions, knot: &str, l: usize, out: &mut Out<'_>) -> Result<()> {
    let beyond = |layers: usize| {
        DecodeError::Usage(format!(
            "--split {l}: the model has {layers} layers; split at 1 to {}",
            layers.saturating_sub(1)
        ))
    };
    let input = match Stage::open(knot, o.reader.clone(), StageRoles::Input, Some(0..l)) {
        Err(DecodeError::Layers { layers, .. }) => return Err(beyond(layers)),
        other => other?.with_cache_types(o.kv),
    };
    let layers = input.config().layers;
    if l == 0 || l >= layers {
        return Err(beyond(layers));
    }
    let output = Stage::open(knot, o.reader.clone(), StageRoles::Output, Some(l..layers))?
        .with_cache_types(o.kv);
    decode(o, &mut [input, output], out)
}

/// Decodes through `chain`: text streamed as it comes when the prompt is
/// text, then the report; a conversation turn after turn.
fn decode(o: &RunOptions, chain: &mut [Stage], out: &mut Out<'_>) -> Result<()> {
    if let Prompt::Conversation { system, first } = &o.prompt {
        return conversation::converse(o, chain, (system.as_deref(), first.as_deref()), out);
    }
    if o.kl_divergence {
        return score::kl_divergence(o, &mut chain[0], out);
    }
    if let Some(n_ctx) = o.perplexity {
        return score::perplexity(o, &mut chain[0], n_ctx, out);
    }
    let made = prompt::make(o, &chain[0])?;
    if let (Prompt::Text(p), Some(_), false, true) =
        (&o.prompt, &made.tokenizer, o.json, o.display_prompt)
    {
        out.stdout.write_all(p.as_bytes()).map_err(write_err)?;
    }
    let g = stream(o, chain, made.tokenizer.as_ref(), &made.ids, out)?;
    report::generation(
        o,
        (made.tokenizer.as_ref(), made.rendered.as_deref()),
        g,
        out,
    )
}

/// The decode of `ids` through `chain`, its text written to stdout as it
/// comes (with a tokenizer, without `--json`), a newline after it.
fn stream(
    o: &RunOptions,
    chain: &mut [Stage],
    tokenizer: Option<&Tokenizer>,
    ids: &[u32],
    out: &mut Out<'_>,
) -> Result<Generation> {
    let opts = GenOptions {
        max_new: o.max_new,
        sampling: o.sampling,
        stop: match (tokenizer, o.ignore_eos) {
            (Some(t), false) => t.eog().into_iter().collect(),
            _ => Default::default(),
        },
        ubatch: o.ubatch,
        context: o.context,
    };
    let stream = tokenizer.is_some() && !o.json;
    let mut text = gkq_text::TextStream::default();
    let mut so_far = String::new();
    let mut on_token = |id: u32| -> Result<bool> {
        let Some(t) = tokenizer else {
            return Ok(false);
        };
        let piece = text.push(t.piece(id));
        if stream {
            out.stdout.write_all(piece.as_bytes()).map_err(write_err)?;
            out.stdout.flush().map_err(write_err)?;
        }
        so_far.push_str(&piece);
        Ok(o.reverse_prompts
            .iter()
            .any(|r| !r.is_empty() && so_far.ends_with(r.as_str())))
    };
    if o.load_first {
        for s in chain.iter_mut() {
            s.wait_loaded()?;
        }
    }
    let g = generate_with(chain, ids, &opts, &mut on_token)?;
    if stream {
        let rest = text.finish();
        writeln!(out.stdout, "{rest}").map_err(write_err)?;
    }
    Ok(g)
}

/// The compute threads: `n`, else `CANDLE_NUM_THREADS` or
/// `RAYON_NUM_THREADS` when set, else the machine's cores; never more than
/// the machine's cores (more threads than cores only wait on each other,
/// and `-t 100000` would start 100,000); set for candle's pools (which
/// read them once, when they start), whose idle workers park soon.
/// Returns the threads used and, when more were asked for than the
/// machine has, how many were asked for.
///
/// # Safety
///
/// Sets environment variables: call it before any other thread starts (at
/// the top of `main`), as `std::env::set_var` requires.
#[allow(unsafe_code)]
pub(crate) unsafe fn set_threads(n: Option<usize>) -> (usize, Option<usize>) {
    let from_env = |k: &str| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
    };
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let asked = n
        .filter(|&n| n > 0)
        .or_else(|| from_env("CANDLE_NUM_THREADS"))
        .or_else(|| from_env("RAYON_NUM_THREADS"))
        .unwrap_or(cores);
    let n = asked.min(cores);
    // SAFETY: the caller's contract: no other thread is running yet
    unsafe {
        std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        // candle's K-quant kernels run in its own pool, whose workers spin
        // 25,000 times after each matmul before they park: on 2 cores a
        // spinning worker took a fifth of the CPU from the decode's own
        // threads. 2,000 (tens of microseconds): 64 tokens of
        // Qwen2.5-Coder-0.5B Q4_K_M in 0.87x the time, the 1.5B (whose
        // layers are nearly all candle's) unchanged; parking at once (0)
        // measured 1.07x on the 1.5B (docs/BENCHMARKS.md). A value the
        // user set stays.
        if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
            std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", "2000");
        }
    }
    (n, (asked > n).then_some(asked))
}

/// glibc's allocator set for a prefill: buffers of up to 64 MB from its
/// heap rather than each mapped anew and unmapped when freed (a prefill
/// allocates and frees buffers of megabytes for every product of every
/// layer, and fresh pages cost a fault and a zeroing each); up to 32 MB
/// kept free at the heap's top; one arena, so that the threads' buffers
/// do not each grow a heap of their own. Measured (`--load-first`, 2
/// threads, against glibc's defaults): Qwen2.5-Coder-0.5B's 111-token
/// prompt 253 -> 291-303 tok/s, Gemma 3's 557-token one 675-678 -> 791-836,
/// with peak RSS the same or lower (SmolLM2 131-134 -> 128 MB; without the
/// one arena the thresholds cost it 10 MB). llama.cpp allocates its
/// compute buffers once. A process whose environment already tunes the
/// allocator (`GLIBC_TUNABLES`, `MALLOC_*`) keeps its own settings.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MALLOC_KEEP: [(i32, i32); 3] = [
    (libc::M_MMAP_THRESHOLD, 64 << 20),
    (libc::M_TRIM_THRESHOLD, 32 << 20),
    (libc::M_ARENA_MAX, 1),
];

/// Sets `MALLOC_KEEP` (glibc only).
///
/// # Safety
///
/// Call it before any other thread starts (at the top of `main`), as
/// `std::env::set_var` requires of [`set_threads`].
#[allow(unsafe_code)]
pub(crate) unsafe fn keep_freed_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if !std::env::vars_os().any(|(k, _)| {
        let k = k.to_string_lossy();
        k == "GLIBC_TUNABLES" || k.starts_with("MALLOC_")
    }) {
        for (param, value) in MALLOC_KEEP {
            // SAFETY: mallopt only changes the allocator's parameters; no
            // other thread allocates yet (the caller's contract)
            unsafe { libc::mallopt(param, value) };
        }
    }
}
