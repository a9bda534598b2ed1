//! The flags of `gkq-decode` ([`Args`], clap), validated into
//! [`RunOptions`]: raw flags first, then the options a run takes.

use std::ops::Range;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use gkq_cli::NodeArgs;
use gkq_reader::ReaderConfig;

use super::{Prompt, RunOptions};
use gkq_decode::{DecodeError, KvType, KvTypes, Sampling, StageRoles};

const EXAMPLES: &str = "Examples:
  # a chat turn with the model's own tokenizer and template, text streamed as it comes
  gkq-decode https://HOST/smollm2/v1/model.knot --chat 'What is the capital of France?'
  # raw text, sampled, 64 tokens; one JSON object with the ids and the text
  gkq-decode -m out/qwen2-tiny -p 'hello world' -n 64 --temp 0.7 --top-p 0.9 --seed 1 --json
  # token ids in, ids out; a two-node pipeline in one process (bytes per node)
  gkq-decode https://HOST/m/v1/model.knot --prompt-ids 1,2,3 --split 12

Output: with text in (--prompt, -f, --chat), the generated text goes to
stdout as it comes and the figures to stderr; with ids in, the report goes
to stdout; --json gives one JSON object (prompt_ids, tokens, text, stop and
the figures). A package is a directory: its row files are read next to the
knot. Time to first token counts from the process's start.

Exit status: 0 done; 1 error (bad input, a knot or row that fails its check,
a network failure); 2 usage error (flags, or a request the model cannot hold).";

/// Decode a knot (local path or URL) as llama.cpp would, from its package
/// alone: the tokenizer and chat template the package carries, the token
/// embedding from its verified rows, every other block verified from the knot.
#[derive(Parser, Debug)]
#[command(
    name = "gkq-decode",
    version = gkq_cli::version_line(gkq_store::FEATURES),
    override_usage = "gkq-decode [KNOT | -m KNOT] (--chat TEXT | -p TEXT | -f FILE | --prompt-ids IDS) [OPTIONS]\n       gkq-decode KNOT --roles output --hidden-in FILE [OPTIONS]",
    after_long_help = EXAMPLES,
    after_help = "Run with --help for examples, where the output goes, and the exit codes."
)]
pub(crate) struct Args {
    /// The knot: a path, a package directory, or an http(s):// or s3:// URL (…/model.knot).
    #[arg(required_unless_present = "model")]
    knot: Option<String>,
    /// The knot, as llama.cpp's -m names the model.
    /// With -m, a positional argument is the prompt, as llama-simple takes it.
    #[arg(short = 'm', long = "model", value_name = "KNOT")]
    model: Option<String>,
    /// A chat turn: rendered with the model's chat template, the assistant's turn after it.
    #[arg(long, value_name = "TEXT", group = "input")]
    chat: Option<String>,
    /// The system message of --chat or of a conversation.
    #[arg(long, value_name = "TEXT", visible_alias = "system-prompt")]
    system: Option<String>,
    /// Conversation mode, as llama-cli's: turns read from stdin, one line each, answered with the model's chat template, the KV cache kept between turns (a turn prefills only its own tokens); ends at the end of the input or /exit. --chat TEXT is the first turn; -p TEXT, -f FILE or --system TEXT the system message.
    #[arg(
        long = "conversation",
        short = 'i',
        visible_aliases = ["interactive", "interactive-first"],
        conflicts_with_all = ["prompt_ids", "hidden_in", "split"]
    )]
    conversation: bool,
    /// llama.cpp's -no-cnv: one turn per run, which is the default here.
    #[arg(long = "no-conversation", hide = true, conflicts_with = "conversation")]
    no_conversation: bool,
    /// The prompt as raw text (special-token strings in it are parsed).
    #[arg(long, short = 'p', value_name = "TEXT", group = "input")]
    prompt: Option<String>,
    /// The prompt as raw text, from a file.
    #[arg(long, short = 'f', value_name = "FILE", group = "input")]
    file: Option<PathBuf>,
    /// The prompt as token ids, separated by commas or spaces (ids out; no end token).
    #[arg(long = "prompt-ids", value_name = "IDS", value_parser = parse_ids, group = "input")]
    prompt_ids: Option<Ids>,
    /// A tokenizer.json instead of the package's tokenizer.
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// The chat template of --chat or -cnv instead of the package's: a name (chatml, gemma) or a Jinja file.
    #[arg(
        long = "chat-template",
        value_name = "NAME|FILE",
        alias = "chat-template-file"
    )]
    chat_template: Option<String>,
    /// Tokens to generate; -1: until an end token or the model's positions run out [default: -1 with --chat, else 16].
    #[arg(
        long = "max-new-tokens",
        short = 'n',
        // llama.cpp's names of it
        aliases = ["n-predict", "predict", "n_predict"],
        value_name = "N",
        allow_negative_numbers = true,
        value_parser = parse_max_new
    )]
    max_new_tokens: Option<MaxNew>,
    /// The context: the positions the prompt and the new tokens may use, at most the model's (0: the model's) [default: 4096; with --perplexity, the chunk: 512].
    #[arg(long = "ctx-size", short = 'c', value_name = "N")]
    ctx_size: Option<usize>,
    /// The KV cache's keys: f32, or f16 as llama.cpp keeps them (half the memory) [default: f32].
    #[arg(long = "cache-type-k", value_name = "TYPE", value_parser = parse_kv)]
    cache_type_k: Option<KvType>,
    /// The KV cache's values: f32, or f16 as llama.cpp keeps them [default: f32].
    #[arg(long = "cache-type-v", value_name = "TYPE", value_parser = parse_kv)]
    cache_type_v: Option<KvType>,
    /// The perplexity of the text of -f or -p, as llama-perplexity computes it: chunks of -c tokens (512 by default here, as there), the second half of each scored.
    #[arg(long, conflicts_with_all = ["chat", "prompt_ids", "conversation", "split", "hidden_in"])]
    perplexity: bool,
    /// llama-perplexity's log-probability file: written by --perplexity (of the base model), read by --kl-divergence (either tool's).
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    kl_divergence_base: Option<PathBuf>,
    /// This model against the base of --kl-divergence-base, over the file's tokens: both perplexities, the KL divergence, the same top token, as llama-perplexity gives them.
    #[arg(long = "kl-divergence", requires = "kl_divergence_base", conflicts_with_all = ["chat", "prompt_ids", "conversation", "split", "hidden_in"])]
    kl_divergence: bool,
    /// Stop when the generated text ends with TEXT (repeatable; llama.cpp's reverse prompt).
    #[arg(long = "reverse-prompt", short = 'r', value_name = "TEXT")]
    reverse_prompt: Vec<String>,
    /// Generate past the model's end-of-generation tokens.
    #[arg(long = "ignore-eos")]
    ignore_eos: bool,
    /// Temperature (0 or less: greedy).
    #[arg(
        long,
        alias = "temperature",
        value_name = "T",
        default_value_t = 0.0,
        allow_negative_numbers = true,
        value_parser = parse_temp,
        help_heading = "Sampling"
    )]
    temp: f64,
    /// Draw from the K most likely tokens only.
    #[arg(long = "top-k", value_name = "K", help_heading = "Sampling")]
    top_k: Option<usize>,
    /// Draw from the most likely tokens whose probabilities add up to P.
    #[arg(long = "top-p", value_name = "P", value_parser = parse_top_p, help_heading = "Sampling")]
    top_p: Option<f64>,
    /// The seed of the draw; -1: a random one, printed so the run can be repeated.
    #[arg(
        long,
        short = 's',
        value_name = "N",
        default_value_t = 0,
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(i64).range(-1..),
        help_heading = "Sampling"
    )]
    seed: i64,
    /// Prompt tokens per forward pass of the prefill (llama.cpp's -ub): a long prompt goes through the layers this many at a time, its activations bounded by it.
    #[arg(long = "ubatch-size", value_name = "N", default_value_t = gkq_decode::DEFAULT_UBATCH, value_parser = parse_batch)]
    ubatch: usize,
    /// Load and verify every weight before the prompt starts, as llama.cpp loads a model before it. By default the prompt goes through each layer as soon as that layer is verified, beside the rest of the load: the first token comes sooner, most of all over a network, and the prefill's own figures share the CPU with the load.
    #[arg(long = "load-first")]
    load_first: bool,
    /// llama.cpp's logical batch: the prefill runs at most this many tokens at a time too.
    #[arg(long = "batch-size", short = 'b', value_name = "N", value_parser = parse_batch)]
    batch: Option<usize>,
    /// Compute threads [default, and -1: the machine's cores].
    #[arg(
        long,
        short = 't',
        value_name = "N",
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(i64).range(-1..)
    )]
    threads: Option<i64>,
    /// The roles of this stage: the whole model, or one stage of a pipeline (input: embedding and the first layers, writes --hidden-out; output: the last layers and lm_head, reads --hidden-in and prints the next token).
    #[arg(long, value_enum, default_value = "all", help_heading = "Pipeline")]
    roles: RolesArg,
    /// The layers this stage runs, A..B (default: all).
    #[arg(long, value_name = "A..B", value_parser = parse_range, help_heading = "Pipeline")]
    layers: Option<Range<usize>>,
    /// Run as a two-node pipeline in this process: an input node (embedding and layers 0..L) and an output node (layers L.. and lm_head), each with its own reader; the report gives each node's bytes.
    #[arg(long, value_name = "L", conflicts_with_all = ["layers", "hidden_in", "hidden_out"], help_heading = "Pipeline")]
    split: Option<usize>,
    /// Input stage: where to write the hidden states (f32 little-endian, [tokens, hidden]).
    #[arg(long = "hidden-out", value_name = "FILE", help_heading = "Pipeline")]
    hidden_out: Option<PathBuf>,
    /// Output stage: the hidden states an input stage wrote.
    #[arg(
        long = "hidden-in",
        value_name = "FILE",
        group = "input",
        help_heading = "Pipeline"
    )]
    hidden_in: Option<PathBuf>,
    /// One JSON object on stdout instead of text.
    #[arg(long, short = 'j')]
    json: bool,
    /// Write the first step's logits (f32 little-endian, one per vocabulary entry) to FILE.
    #[arg(long = "logits-out", value_name = "FILE")]
    logits_out: Option<PathBuf>,
    /// The SHA-256 of each step's logits too, one line a step (in --json, always).
    #[arg(long, short = 'v', alias = "log-verbose")]
    verbose: bool,
    #[command(flatten)]
    node: NodeArgs,
    /// llama.cpp's flags that change nothing here, taken so that its
    /// command lines run: --jinja (templates are always rendered with a
    /// Jinja engine), --display-prompt (the default).
    #[arg(
        long = "jinja",
        alias = "display-prompt",
        hide = true,
        action = clap::ArgAction::Count
    )]
    llama_cpp_noop: u8,
    /// llama.cpp's --color [on|off|auto] (-co): taken, no colours are written.
    #[arg(long = "color", hide = true, num_args = 0..=1, value_name = "WHEN", value_parser = ["on", "off", "auto"])]
    color: Option<Option<String>>,
    /// Do not echo a raw prompt (-p, -f) before its continuation, as llama.cpp's flag.
    #[arg(long = "no-display-prompt")]
    no_display_prompt: bool,
    /// No log lines on stderr (llama.cpp's --log-disable).
    #[arg(long = "log-disable")]
    log_disable: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum RolesArg {
    All,
    Input,
    Output,
}

/// `-n`: a count, or any negative number for "until an end token".
#[derive(Clone, Copy, Debug)]
enum MaxNew {
    Count(usize),
    Unbounded,
}

fn parse_max_new(s: &str) -> Result<MaxNew, String> {
    if s.trim().starts_with('-') {
        return s
            .trim()
            .parse::<i64>()
            .map(|_| MaxNew::Unbounded)
            .map_err(|_| format!("{s:?} is not a number of tokens (-1: until an end token)"));
    }
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of tokens (-1: until an end token)"))?;
    Ok(MaxNew::Count(usize::try_from(n).unwrap_or(usize::MAX)))
}

/// `--cache-type-k`, `--cache-type-v`: f32 or f16.
fn parse_kv(s: &str) -> std::result::Result<KvType, String> {
    KvType::parse(s).ok_or_else(|| {
        format!(
            "{s}: the KV cache keeps f32 or f16 (llama.cpp's quantized caches are not kept here)"
        )
    })
}

/// `--ubatch-size`, `--batch-size`: a count of tokens from 1.
fn parse_batch(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{s:?} is not a number of tokens from 1")),
    }
}

/// `--temp`: a finite number (NaN would always pick the least likely token).
fn parse_temp(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(t) if t.is_finite() => Ok(t),
        _ => Err(format!(
            "{s:?} is not a temperature (a finite number; 0 or less is greedy)"
        )),
    }
}

/// `--top-p`: a probability, 0 to 1.
fn parse_top_p(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("{s:?} is not a probability from 0 to 1")),
    }
}

/// Token ids of a flag (a newtype: clap would take a `Vec` for many values).
#[derive(Clone, Debug)]
struct Ids(Vec<u32>);

fn parse_ids(s: &str) -> Result<Ids, String> {
    gkq_text::parse_ids(s)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|i| u32::try_from(i).map_err(|_| format!("{i} is not a token id")))
        .collect::<Result<Vec<u32>, String>>()
        .and_then(|v| {
            if v.is_empty() {
                Err("no token ids".into())
            } else {
                Ok(Ids(v))
            }
        })
}

fn parse_range(s: &str) -> Result<Range<usize>, String> {
    let bad = || format!("{s:?} is not A..B");
    let (a, b) = s.split_once("..").ok_or_else(bad)?;
    Ok(a.trim().parse().map_err(|_| bad())?..b.trim().parse().map_err(|_| bad())?)
}

/// The prompt the flags give.
fn prompt(a: &Args) -> Result<Prompt, DecodeError> {
    let usage = |m: String| DecodeError::Usage(m);
    if let Some(p) = &a.prompt
        && let Some(file) = p
            .strip_prefix('@')
            .filter(|f| std::path::Path::new(f).is_file())
    {
        return Err(usage(format!(
            "--prompt {p}: to read the prompt from the file {file}, give -f {file}"
        )));
    }
    // a perplexity text may be a test set (wikitext-2's is 1.3 MB)
    let limit = if a.perplexity {
        PERPLEXITY_TEXT_BYTES
    } else {
        gkq_text::MAX_SESSION_BYTES
    };
    let read = |p: &PathBuf| {
        gkq_files::read_text(p, limit, "a prompt", gkq_files::Follow::Yes)
            .map_err(|e| usage(format!("-f {e}")))
    };
    if a.conversation {
        let system = match (&a.system, &a.prompt, &a.file) {
            (Some(s), ..) => Some(s.clone()),
            (_, Some(p), _) => Some(p.clone()),
            (_, _, Some(f)) => Some(read(f)?),
            _ => None,
        };
        let first = a.chat.clone();
        return Ok(Prompt::Conversation { system, first });
    }
    Ok(
        match (&a.chat, &a.prompt, &a.file, &a.prompt_ids, &a.hidden_in) {
            (Some(c), ..) => Prompt::Chat {
                system: a.system.clone(),
                user: c.clone(),
            },
            (_, Some(p), ..) => Prompt::Text(p.clone()),
            (_, _, Some(f), ..) => Prompt::Text(read(f)?),
            (_, _, _, Some(ids), _) => Prompt::Ids(ids.0.clone()),
            (.., Some(h)) => Prompt::HiddenIn(h.clone()),
            // the base file holds the tokens
            _ if a.kl_divergence => Prompt::Ids(Vec::new()),
            _ => {
                return Err(usage(
                    "give the prompt: --chat TEXT, --prompt TEXT, -f FILE or --prompt-ids 1,2,3"
                        .into(),
                ));
            }
        },
    )
}

/// The context when `-c` is not given: a bound (the bench's llama-cli
/// loads the model's, 32,768 positions for Gemma 3; README).
const DEFAULT_CONTEXT: usize = 4096;

/// The largest text `--perplexity -f` reads.
const PERPLEXITY_TEXT_BYTES: u64 = 64 << 20;

/// The chunk of `--perplexity` when `-c` is not given: llama-perplexity's.
const PERPLEXITY_CONTEXT: usize = 512;

/// `--seed`: as given, or for -1 (llama.cpp's "random") one drawn from
/// the clock, printed so that the run can be repeated.
fn seed(asked: i64) -> u64 {
    if let Ok(s) = u64::try_from(asked) {
        return s;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let s = (now ^ u64::from(std::process::id())) % 1_000_000_000;
    eprintln!("gkq-decode: note: --seed -1: the seed is {s} (give --seed {s} to repeat this run)");
    s
}

/// `-m KNOT TEXT`: llama-simple's positional prompt, when no other
/// prompt is given; `--system` only with `--chat`, whose system message it
/// is (with raw text it was dropped without a word).
fn llama_simple(mut a: Args) -> Result<Args, DecodeError> {
    let chat = a.chat.is_some() || a.conversation;
    if a.chat_template.is_some() && !chat {
        return Err(DecodeError::Usage(
            "--chat-template renders --chat TEXT or a conversation (-cnv); -p, -f and --prompt-ids are raw".into(),
        ));
    }
    if a.system.is_some() && !chat {
        return Err(DecodeError::Usage(
            "--system is the system message of --chat TEXT; with -p, -f or --prompt-ids the prompt is raw, so write the system turn into it, or use --chat".into(),
        ));
    }
    if let (Some(_), Some(text)) = (&a.model, &a.knot) {
        let given = a.chat.is_some()
            || a.conversation
            || a.prompt.is_some()
            || a.file.is_some()
            || a.prompt_ids.is_some()
            || a.hidden_in.is_some();
        if given {
            return Err(DecodeError::Usage(format!(
                "the knot is given twice: -m {} and {text:?}; give it once",
                a.model.as_deref().unwrap_or_default()
            )));
        }
        a.prompt = a.knot.take();
    }
    Ok(a)
}

fn options(
    a: Args,
    started: std::time::Instant,
    threads: usize,
) -> Result<RunOptions, DecodeError> {
    let a = llama_simple(a)?;
    if a.kl_divergence_base.is_some() && !a.perplexity && !a.kl_divergence {
        return Err(DecodeError::Usage(
            "--kl-divergence-base FILE is written by --perplexity and read by --kl-divergence: give one of them".into(),
        ));
    }
    let max_new = match a.max_new_tokens {
        Some(MaxNew::Unbounded) => None,
        Some(MaxNew::Count(n)) => Some(n),
        None if a.chat.is_some() => None,
        None => Some(16),
    };
    Ok(RunOptions {
        prompt: prompt(&a)?,
        knot: a.knot.or(a.model).unwrap_or_default(),
        tokenizer: a.tokenizer,
        reverse_prompts: a.reverse_prompt,
        chat_template: a
            .chat_template
            .as_deref()
            .map(super::prompt::chat_template)
            .transpose()?,
        max_new,
        ignore_eos: a.ignore_eos,
        ubatch: a.batch.map_or(a.ubatch, |b| b.min(a.ubatch)),
        load_first: a.load_first,
        kv: KvTypes {
            k: a.cache_type_k.unwrap_or_default(),
            v: a.cache_type_v.unwrap_or_default(),
        },
        context: match a.ctx_size {
            None => Some(DEFAULT_CONTEXT),
            Some(0) => None,
            Some(c) => Some(c),
        },
        perplexity: a
            .perplexity
            .then(|| a.ctx_size.unwrap_or(PERPLEXITY_CONTEXT)),
        kl_divergence: a.kl_divergence,
        kl_base: a.kl_divergence_base,
        sampling: Sampling {
            temperature: a.temp,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: seed(a.seed),
        },
        roles: match a.roles {
            RolesArg::All => StageRoles::All,
            RolesArg::Input => StageRoles::Input,
            RolesArg::Output => StageRoles::Output,
        },
        layers: a.layers,
        split: a.split,
        hidden_out: a.hidden_out,
        json: a.json,
        logits_out: a.logits_out,
        verbose: a.verbose,
        display_prompt: !a.no_display_prompt,
        threads,
        reader: ReaderConfig::try_from(a.node).map_err(DecodeError::Usage)?,
        started,
    })
}

impl Args {
    /// Whether log lines are wanted (not `--log-disable`).
    pub(crate) fn logging(&self) -> bool {
        !self.log_disable
    }

    /// The threads asked for (`-t`).
    pub(crate) fn threads(&self) -> Option<usize> {
        self.threads
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0)
    }

    /// The options of a run, validated; `started` is when the process
    /// started, `threads` the compute threads set.
    pub(crate) fn options(
        self,
        started: std::time::Instant,
        threads: usize,
    ) -> Result<RunOptions, DecodeError> {
        options(self, started, threads)
    }
}
