//! The flags users bring from llama.cpp (`llama-cli`, `llama-completion`)
//! that gkq-decode does not take: each gets what gkq-decode does instead,
//! never clap's "to pass '-c' as a value, use '-- -c'".

/// `(flags, what to do instead)`: every flag of `llama-cli --help` (the
/// bench's build; `tests/data/llama-cli-help.txt`) that gkq-decode does
/// not take, and llama-completion's that users bring.
pub(crate) const LLAMA_CPP_FLAGS: &[(&[&str], &str)] = &[
    (
        &[
            "-ngl",
            "--n-gpu-layers",
            "--gpu-layers",
            "-sm",
            "--split-mode",
            "-mg",
            "--main-gpu",
            "-ts",
            "--tensor-split",
            "-dev",
            "--device",
            "--list-devices",
            "-fit",
            "--fit",
            "-fitt",
            "--fit-target",
            "-fitc",
            "--fit-ctx",
            "-ot",
            "--override-tensor",
            "-cmoe",
            "--cpu-moe",
            "-ncmoe",
            "--n-cpu-moe",
            "-ncffn",
            "--n-cpu-ffn",
            "--op-offload",
            "--no-op-offload",
            "-kvo",
            "--kv-offload",
            "-nkvo",
            "--no-kv-offload",
            "--no-host",
            "--rpc",
        ],
        "gkq-decode computes on the CPU (candle's kernels and its own): there is no device to offload layers, tensors or the KV cache to",
    ),
    (
        &["-tb", "--threads-batch"],
        "one pool computes both the prompt and the generation: give -t N",
    ),
    (
        &[
            "-C",
            "--cpu-mask",
            "-Cr",
            "--cpu-range",
            "--cpu-strict",
            "--prio",
            "--poll",
            "-Cb",
            "--cpu-mask-batch",
            "-Crb",
            "--cpu-range-batch",
            "--cpu-strict-batch",
            "--prio-batch",
            "--poll-batch",
            "--numa",
        ],
        "the -t compute threads are the operating system's to place: pin or prioritise the process with taskset, numactl or nice",
    ),
    (
        &[
            "--repeat-penalty",
            "--repeat-last-n",
            "--presence-penalty",
            "--frequency-penalty",
            "--min-p",
            "--typical",
            "--typical-p",
            "--mirostat",
            "--mirostat-lr",
            "--mirostat-ent",
            "--dry-multiplier",
            "--dry-base",
            "--dry-allowed-length",
            "--dry-penalty-last-n",
            "--dry-sequence-breaker",
            "--samplers",
            "--sampler-seq",
            "--sampling-seq",
            "--top-nsigma",
            "--top-n-sigma",
            "--xtc-probability",
            "--xtc-threshold",
            "--adaptive-target",
            "--adaptive-decay",
            "--dynatemp-range",
            "--dynatemp-exp",
            "-bs",
            "--backend-sampling",
        ],
        "sampling is --temp, --top-k, --top-p and --seed (greedy when --temp is 0, the default)",
    ),
    (
        &[
            "-l",
            "--logit-bias",
            "--grammar",
            "--grammar-file",
            "-j",
            "--json-schema",
            "-jf",
            "--json-schema-file",
        ],
        "constrained generation (grammars, JSON schemas, logit biases) is not implemented: the model's own distribution is sampled (--temp, --top-k, --top-p)",
    ),
    (
        &["-sysf", "--system-prompt-file"],
        "give the system message as text: --system \"$(cat FILE)\"",
    ),
    (
        &[
            "-hf",
            "-hfr",
            "--hf-repo",
            "-hff",
            "--hf-file",
            "-hft",
            "--hf-token",
            "-mu",
            "--model-url",
            "-dr",
            "--docker-repo",
            "--offline",
            "--gpt-oss-20b-default",
            "--gpt-oss-120b-default",
            "--vision-gemma-4b-default",
            "--vision-gemma-12b-default",
        ],
        "gkq-decode reads a published package by its knot's URL (gkq-decode https://HOST/PKG/model.knot, or -m URL; -m model.gguf runs a local GGUF): nothing is downloaded from a model hub",
    ),
    (
        &["-cl", "--cache-list"],
        "the cache (--cache-dir, default ~/.cache/gkq) holds verified blocks and rows by digest, not models by name: there is nothing to list",
    ),
    (
        &["-e", "--escape", "--no-escape"],
        "prompts are taken as given: no escapes are processed (put a newline in the shell's quotes, or in the file of -f)",
    ),
    (
        &[
            "--mlock",
            "--no-mmap",
            "-dio",
            "--direct-io",
            "-lm",
            "--load-mode",
            "-lzm",
            "--lazy-mode",
        ],
        "gkq-decode keeps the model's blocks in memory as it verified them (pulled, or read from its cache): there is nothing to map, lock or load lazily",
    ),
    (
        &["--repack", "-nr", "--no-repack"],
        "Q4_0, Q4_K and Q6_K rows are always packed sixteen at a time at load (from the verified bytes, in their own memory; AVX2 or AVX-512 VNNI), the other types run as the package stores them: there is nothing to turn on or off",
    ),
    (
        &["-fa", "--flash-attn"],
        "attention runs on candle's CPU ops: there is no flash-attention kernel to turn on or off",
    ),
    (
        &[
            "--rope-scaling",
            "--rope-scale",
            "--rope-freq-base",
            "--rope-freq-scale",
            "--yarn-orig-ctx",
            "--yarn-ext-factor",
            "--yarn-attn-factor",
            "--yarn-beta-slow",
            "--yarn-beta-fast",
        ],
        "the rotary embedding comes from the package's config.json, which the knot pins by digest: it is not overridden at run time",
    ),
    (
        &[
            "--keep",
            "--swa-full",
            "-dt",
            "--defrag-thold",
            "--context-shift",
            "--no-context-shift",
            "-ctxcp",
            "--ctx-checkpoints",
            "--swa-checkpoints",
            "-cram",
            "--cache-ram",
        ],
        "the KV cache holds the keys and values of one sequence (f32, or f16 with -ctk/-ctv), as long as -c allows: a run stops at the context's end (no shift, no checkpoints)",
    ),
    (
        &["-np", "--parallel"],
        "one sequence a process: run one gkq-decode per sequence (they can share the cache directory)",
    ),
    (
        &[
            "--lora",
            "--lora-scaled",
            "--control-vector",
            "--control-vector-scaled",
            "--control-vector-layer-range",
        ],
        "no adapters or control vectors: a node runs the package exactly as published and verified",
    ),
    (
        &["--override-kv"],
        "the model's metadata is pinned by the knot: it is not overridden at run time",
    ),
    (
        &["--check-tensors"],
        "every block is checked against the knot's SHA-256 as it arrives, always; gkq-verify checks a whole package",
    ),
    (
        &[
            "-hfd",
            "-hfrd",
            "--hf-repo-draft",
            "-td",
            "--threads-draft",
            "-tbd",
            "--threads-batch-draft",
            "-Cd",
            "--cpu-mask-draft",
            "-Crd",
            "--cpu-range-draft",
            "--cpu-strict-draft",
            "--prio-draft",
            "--poll-draft",
            "-Cbd",
            "--cpu-mask-batch-draft",
            "--cpu-strict-batch-draft",
            "--prio-batch-draft",
            "--poll-batch-draft",
            "-otd",
            "--override-tensor-draft",
            "-cmoed",
            "--cpu-moe-draft",
            "-ncmoed",
            "--n-cpu-moe-draft",
            "--draft-p-split",
            "--draft-p-min",
            "-devd",
            "--device-draft",
            "-ngld",
            "--gpu-layers-draft",
            "--n-gpu-layers-draft",
            "-md",
            "--model-draft",
            "--draft",
            "--draft-n",
            "--draft-max",
            "--draft-min",
            "--draft-n-min",
            "-ctkd",
            "--cache-type-k-draft",
            "-ctvd",
            "--cache-type-v-draft",
        ],
        SPECULATIVE,
    ),
    (
        &[
            "-lv",
            "--verbosity",
            "--log-verbosity",
            "--log-file",
            "--log-jsonl",
            "--no-log-jsonl",
            "--log-colors",
            "--log-prefix",
            "--no-log-prefix",
            "--log-timestamps",
            "--no-log-timestamps",
        ],
        "log lines go to stderr, filtered by GKQ_LOG (error, warn, info, debug): --log-disable silences them, -v adds the per-step digests, and a redirect of stderr keeps them",
    ),
    (
        &[
            "-mm",
            "--mmproj",
            "-mmu",
            "--mmproj-url",
            "--mmproj-auto",
            "--no-mmproj",
            "--no-mmproj-auto",
            "--mmproj-offload",
            "--no-mmproj-offload",
            "-mmdev",
            "--mmproj-device",
            "--image",
            "--audio",
            "--video",
            "--image-min-tokens",
            "--image-max-tokens",
            "--video-fps",
            "--video-timestamp-interval",
            "--video-ffmpeg-dir",
        ],
        "text in, text out: the architectures gkq-decode runs take no images, audio or video",
    ),
    (
        &["--chat-template-kwargs"],
        "the chat template gets messages, add_generation_prompt, bos_token and eos_token, as Hugging Face's apply_chat_template gives them: no other variables",
    ),
    (
        &[
            "--reasoning-format",
            "-rea",
            "--reasoning",
            "--reasoning-effort",
            "--reasoning-budget",
            "--reasoning-budget-message",
            "--reasoning-preserve",
            "--no-reasoning-preserve",
            "--skip-chat-parsing",
            "--no-skip-chat-parsing",
        ],
        "the answer is printed as the model writes it: no reasoning or tool-call parsing, no thinking budget",
    ),
    (
        &["--no-jinja"],
        "chat templates are always rendered by a Jinja engine (minijinja, as Hugging Face renders them)",
    ),
    (
        &["-o", "--output", "--output-file"],
        "the text goes to stdout: redirect it (> FILE); --json writes one object instead",
    ),
    (
        &["--verbose-prompt", "--log-prompts-dir"],
        "--json gives the prompt's ids and the rendered chat (prompt_ids, prompt)",
    ),
    (
        &["-sp", "--special"],
        "control tokens (end of turn, …) are not printed as text; --json gives every token's id",
    ),
    (
        &["--perf", "--no-perf", "--show-timings", "--no-show-timings"],
        "the timings are always one block on stderr after the text (--json: fields of the object)",
    ),
    (
        &["--server-base"],
        "gkq-decode runs the model in its own process: there is no server to connect to",
    ),
    (
        &["-st", "--single-turn"],
        "gkq-decode answers one turn and exits unless asked for a conversation (-cnv): leave -st out",
    ),
    (
        &["-mli", "--multiline-input"],
        "in a conversation (-cnv) each line is a turn; for a long prompt give -f FILE",
    ),
    (
        &["--simple-io"],
        "the console is plain text already (stdout the answer, stderr the rest)",
    ),
    (
        &["--warmup", "--no-warmup"],
        "there is no warm-up run: the time to first token is that of the real prompt",
    ),
    (
        &["--completion-bash"],
        "no shell completion script is generated: gkq-decode --help lists the flags",
    ),
    (
        &["-bf", "--binary-file"],
        "give the prompt as text (-f FILE) or as token ids (--prompt-ids IDS)",
    ),
];

/// Speculative decoding's flags (`--spec-…` and the draft model's).
const SPECULATIVE: &str = "there is no speculative decoding: one model decodes, token by token";

/// Prefixes of llama.cpp's flag families, each with what to do instead.
const LLAMA_CPP_PREFIXES: &[(&str, &str)] =
    &[("--spec-", SPECULATIVE), ("--no-spec-", SPECULATIVE)];

/// llama.cpp's flags that gkq-decode takes under another name, with that
/// name: its multi-letter single-dash flags (clap reads `-ub` as `-u b`)
/// and `--usage`.
pub(crate) const LLAMA_CPP_SHORTS: &[(&str, &str)] = &[
    ("-ub", "--ubatch-size"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-cnv", "--conversation"),
    ("-if", "--interactive-first"),
    ("-no-cnv", "--no-conversation"),
    ("-co", "--color"),
    ("-sys", "--system"),
    ("--usage", "--help"),
];

/// `args` with llama.cpp's multi-letter single-dash flags that gkq-decode
/// takes written as their long names (`-ub 64` as `--ubatch-size 64`), up
/// to a `--`.
pub(crate) fn long_forms(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut done = false;
    args.into_iter()
        .map(|a| {
            done |= a == "--";
            let (flag, value) = a
                .split_once('=')
                .map_or((a.as_str(), None), |(f, v)| (f, Some(v)));
            match LLAMA_CPP_SHORTS.iter().find(|(s, _)| !done && *s == flag) {
                Some((_, long)) => {
                    value.map_or_else(|| (*long).to_owned(), |v| format!("{long}={v}"))
                }
                None => a,
            }
        })
        .collect()
}

/// The message for `arg` when it is one of llama.cpp's flags that
/// gkq-decode does not take (`--n-gpu-layers=99` too).
pub(crate) fn llama_cpp_flag(arg: &str) -> Option<String> {
    let flag = arg.split_once('=').map_or(arg, |(f, _)| f);
    LLAMA_CPP_FLAGS
        .iter()
        .find(|(names, _)| names.contains(&flag))
        .map(|(_, instead)| *instead)
        .or_else(|| {
            LLAMA_CPP_PREFIXES
                .iter()
                .find(|(p, _)| flag.starts_with(p))
                .map(|(_, instead)| *instead)
        })
        .map(|instead| {
            format!("{flag} is a llama.cpp flag that gkq-decode does not take: {instead}")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_flag_names_its_equivalent() {
        for (names, instead) in LLAMA_CPP_FLAGS {
            for n in *names {
                let m = llama_cpp_flag(n).expect("listed");
                assert!(m.starts_with(n) && m.contains(instead), "{m}");
            }
        }
        assert!(llama_cpp_flag("--n-gpu-layers=99").is_some());
        assert_eq!(llama_cpp_flag("-n"), None);
    }
}
