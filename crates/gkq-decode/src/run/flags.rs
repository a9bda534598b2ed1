//! The flags users bring from llama.cpp (`llama-cli`, `llama-completion`)
//! that gkq-decode does not take: each gets what gkq-decode does instead,
//! never clap's "to pass '-c' as a value, use '-- -c'".

/// `(flags, what to do instead)`.
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
        ],
        "gkq-decode computes on the CPU (candle's kernels): there are no GPU layers to offload",
    ),
    (
        &["-tb", "--threads-batch"],
        "one pool computes both the prompt and the generation: give -t N",
    ),
    (
        &[
            "--repeat-penalty",
            "--repeat-last-n",
            "--presence-penalty",
            "--frequency-penalty",
            "--min-p",
            "--typical",
            "--mirostat",
            "--dry-multiplier",
        ],
        "sampling is --temp, --top-k, --top-p and --seed (greedy when --temp is 0, the default)",
    ),
    (
        &["-sys", "--system-prompt"],
        "give the system message with --system TEXT, beside --chat TEXT",
    ),
    (
        &[
            "-hf",
            "-hfr",
            "--hf-repo",
            "-hff",
            "--hf-file",
            "-mu",
            "--model-url",
        ],
        "gkq-decode reads a published package by its knot's URL (gkq-decode https://HOST/PKG/model.knot, or -m URL): nothing is downloaded from a model hub",
    ),
    (
        &["-e", "--escape", "--no-escape"],
        "prompts are taken as given: no escapes are processed (put a newline in the shell's quotes, or in the file of -f)",
    ),
    (
        &[
            "--mlock",
            "--no-mmap",
            "-fa",
            "--flash-attn",
            "-dio",
            "--direct-io",
        ],
        "gkq-decode keeps the model's blocks in memory as it verified them: there is nothing to map or lock",
    ),
];

/// llama.cpp's multi-letter single-dash flags that gkq-decode takes, and
/// their long names (clap reads `-ub` as `-u b`).
pub(crate) const LLAMA_CPP_SHORTS: &[(&str, &str)] = &[
    ("-ub", "--ubatch-size"),
    ("-cnv", "--conversation"),
    ("-if", "--interactive-first"),
    ("-no-cnv", "--no-conversation"),
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
        .map(|(_, instead)| {
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
