//! The flags users bring from llama.cpp (issue 47 item 3): `-m`, `-f`,
//! `-t`, `--temp` with `--top-k`, `--top-p` and `--seed`, and `-n -1`
//! work; `-c 2048` and each other llama.cpp flag gkq-decode does not take
//! get what it does instead (never clap's `-- -c` tip); `-p @file` says
//! to give `-f`; with `--json`, a usage error is one JSON object.

use std::path::Path;
use std::process::Output;

/// llama-perplexity's flags.
#[path = "flags/perplexity.rs"]
mod perplexity;

fn decode(args: &[&str]) -> Output {
    fixtures::tool(env!("CARGO_BIN_EXE_gkq-decode"))
        .args(args)
        .output()
        .expect("run gkq-decode")
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("json")
}

/// The committed tiny model with a context of 128 positions, packed, and
/// a word-level tokenizer.json ("hello world cat" is ids 5, 17, 300) for
/// --tokenizer.
fn packed(dir: &Path) -> (String, String) {
    packed_with(dir, |_| {})
}

/// `packed`, with the pack's options edited.
fn packed_with(dir: &Path, edit: impl FnOnce(&mut gkq_pack::PackOptions)) -> (String, String) {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    for e in std::fs::read_dir(fixtures::committed_tiny()).expect("committed") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, src.join(p.file_name().expect("name"))).expect("copy");
    }
    let cfg = src.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg).expect("config")).expect("json");
    v["max_position_embeddings"] = 128.into();
    std::fs::write(&cfg, serde_json::to_vec_pretty(&v).expect("json")).expect("write");
    let out = dir.join("pkg");
    let mut o = gkq_pack::PackOptions::new(&src, &out);
    edit(&mut o);
    gkq_pack::pack(&o, &gkq_pack::NoProgress).expect("pack");
    let tok = dir.join("tokenizer.json");
    std::fs::write(
        &tok,
        r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":5,"world":17,"cat":300},"unk_token":"[UNK]"}}"#,
    )
    .expect("write");
    (
        out.join("model.knot").display().to_string(),
        tok.display().to_string(),
    )
}

/// Exit 2 and stderr holds every needle, never clap's `-- -x` tip.
fn usage(o: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    println!("{err}");
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(!err.contains("as a value, use"), "{err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} missing from: {err}");
    }
}

#[test]
fn the_llama_cpp_flags_that_work() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (knot, tok) = packed(tmp.path());
    let base = json(&decode(&[
        &knot,
        "--prompt-ids",
        "5,17,300",
        "-n",
        "6",
        "--json",
    ]));
    // -m, -t 2, -f FILE: the same greedy tokens
    let prompt = tmp.path().join("prompt.txt");
    std::fs::write(&prompt, "hello world cat").expect("write");
    let p = prompt.to_str().expect("utf-8");
    let v = json(&decode(&[
        "-m",
        &knot,
        "-t",
        "2",
        "-f",
        p,
        "--tokenizer",
        &tok,
        "-n",
        "6",
        "--json",
    ]));
    assert_eq!(v["prompt_ids"], serde_json::json!([5, 17, 300]), "{v}");
    let simple = json(&decode(&[
        "-m",
        &knot,
        "--tokenizer",
        &tok,
        "-n",
        "6",
        "--json",
        "hello world cat",
    ]));
    assert_eq!(simple["prompt_ids"], v["prompt_ids"], "{simple}");
    assert_eq!(simple["tokens"], base["tokens"], "{simple}");
    assert_eq!(v["tokens"], base["tokens"], "{v}");
    assert_eq!(v["threads"], 2, "{v}");
    // -ub and -b (issue 57: the prompt in micro-batches): the same tokens
    for flags in [
        &["-ub", "2"][..],
        &["-b", "1"],
        &["--ubatch-size=1", "-b", "8"],
    ] {
        let mut args = vec![
            knot.as_str(),
            "--prompt-ids",
            "5,17,300",
            "-n",
            "6",
            "--json",
        ];
        args.extend_from_slice(flags);
        assert_eq!(json(&decode(&args))["tokens"], base["tokens"], "{flags:?}");
    }
    // --temp 0 is greedy; --temp with --seed is repeatable, and samples
    let g = json(&decode(&[
        &knot,
        "--prompt-ids",
        "5,17,300",
        "-n",
        "6",
        "--temp",
        "0",
        "--json",
    ]));
    assert_eq!(g["tokens"], base["tokens"]);
    let sampled = |seed: &str| {
        decode(&[
            &knot,
            "--prompt-ids",
            "5,17,300",
            "-n",
            "24",
            "--temp",
            "5",
            "--top-k",
            "200",
            "--top-p",
            "0.99",
            "--seed",
            seed,
            "--json",
        ])
    };
    let sample = |seed: &str| json(&sampled(seed))["tokens"].clone();
    assert_eq!(sample("7"), sample("7"), "one seed, one sequence");
    // --seed -1: a random seed, printed so the run can be repeated
    let o = sampled("-1");
    let err = String::from_utf8_lossy(&o.stderr);
    let drawn = err
        .split("the seed is ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no seed in {err}"));
    assert_eq!(json(&o)["tokens"], sample(drawn), "{err}");
    // llama.cpp's names of -n, and its -t -1 (the default)
    for flags in [
        &["--n-predict", "6"][..],
        &["--predict", "6"],
        &["--n_predict=6"],
        &["-n", "6", "-t", "-1"],
        // flags that change nothing here, taken so llama.cpp command lines run
        &[
            "-n",
            "6",
            "--jinja",
            "--color",
            "--no-display-prompt",
            "--log-disable",
        ],
    ] {
        let mut args = vec![knot.as_str(), "--prompt-ids", "5,17,300", "--json"];
        args.extend_from_slice(flags);
        assert_eq!(json(&decode(&args))["tokens"], base["tokens"], "{flags:?}");
    }
    assert_ne!(sample("7"), sample("8"), "another seed, another sequence");
    // -n -1: until an end token or the context's end (the tiny model has
    // no end token and 128 positions: 125 new tokens after 3)
    let all = json(&decode(&[
        &knot,
        "--prompt-ids",
        "5,17,300",
        "-n",
        "-1",
        "--json",
    ]));
    let n = all["tokens"].as_array().expect("tokens").len();
    assert_eq!(n, 125, "{}", all["stop"]);
    assert_eq!(all["stop"], "context");
    // -c bounds the context (issue 58): 3 + 61 = 64 positions, a note in
    // the text report, and -n beyond it refused naming -c
    let c = json(&decode(&[
        &knot,
        "--prompt-ids",
        "5,17,300",
        "-n",
        "-1",
        "-c",
        "64",
        "--json",
    ]));
    assert_eq!(c["tokens"].as_array().map(Vec::len), Some(61), "{c}");
    let o = decode(&[
        &knot,
        "--prompt-ids",
        "5,17,300",
        "-n",
        "-1",
        "--ctx-size=64",
    ]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("no position left in the context (-c N"),
        "{text}"
    );
    usage(
        &decode(&[&knot, "--prompt-ids", "5,17,300", "-n", "100", "-c", "64"]),
        &["must fit the context's 64 positions (-c; the model has 128)"],
    );
}

#[test]
fn the_llama_cpp_flags_it_does_not_take_say_what_to_do() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (knot, tok) = packed(tmp.path());
    for (flag, needle) in [
        ("-ngl", "on the CPU"),
        ("-tb", "give -t N"),
        ("--repeat-penalty", "--temp, --top-k, --top-p and --seed"),
        // -fa got --mlock's reason once (issue 58)
        ("-fa", "no flash-attention kernel"),
        ("-sysf", "--system \"$(cat FILE)\""),
        ("-hf", "nothing is downloaded"),
        ("--mlock", "nothing to map, lock or load lazily"),
        // said nothing was repacked after Q4_0, Q4_K and Q6_K were (issue 53)
        ("--no-repack", "packed sixteen at a time at load"),
    ] {
        usage(
            &decode(&[&knot, "--prompt-ids", "1", flag, "1"]),
            &[&format!("{flag} is a llama.cpp flag"), needle],
        );
    }
    // -cnv (and -i, llama.cpp's interactive, which once asked for prompt
    // ids) renders the chat template: a package without one is told so
    for flag in ["-cnv", "-i", "--interactive", "-if"] {
        usage(
            &decode(&[&knot, flag, "--tokenizer", &tok]),
            &["a conversation (-cnv) renders its turns with the model's chat template"],
        );
    }
    // --system without --chat (issue 58: it was dropped without a word)
    usage(
        &decode(&[&knot, "--prompt-ids", "1", "--system", "be terse"]),
        &["--system is the system message of --chat TEXT"],
    );
    // llama-simple's positional prompt after -m, unless a prompt is given
    usage(
        &decode(&["-m", &knot, "--prompt-ids", "1", "hello"]),
        &["the knot is given twice"],
    );
    // -p @file: the file is not read as a prompt
    let prompt = tmp.path().join("prompt.txt");
    std::fs::write(&prompt, "hello").expect("write");
    let at = format!("@{}", prompt.display());
    usage(
        &decode(&[&knot, "-p", &at]),
        &[
            "to read the prompt from the file",
            &format!("-f {}", prompt.display()),
        ],
    );
    // --json: one object on stderr, kind usage
    let o = decode(&[&knot, "--prompt-ids", "1", "-ngl", "99", "--json"]);
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&o.stderr).expect("one JSON object");
    assert_eq!(v["error"]["kind"], "usage", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .contains("-ngl is a llama.cpp flag")
    );
}

/// Issue 58: a quiet console. The per-step digests only with --verbose
/// (--json keeps them), and -n 0 gives no rates it did not measure.
#[test]
fn the_console_is_quiet_and_n_0_gives_no_rates() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (knot, _) = packed(tmp.path());
    let text = |extra: &[&str]| {
        let mut args = vec![knot.as_str(), "--prompt-ids", "5,17,300"];
        args.extend_from_slice(extra);
        let o = decode(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let quiet = text(&["-n", "3"]);
    assert!(!quiet.contains("logits sha256"), "{quiet}");
    assert!(quiet.contains("time to first token"), "{quiet}");
    let verbose = text(&["-n", "3", "--verbose"]);
    assert_eq!(verbose.matches("logits sha256").count(), 3, "{verbose}");
    let none = text(&["-n", "0"]);
    assert!(none.contains("no token asked for (-n 0)"), "{none}");
    assert!(!none.contains("tokens/s"), "{none}");
    let v = json(&decode(&[
        &knot,
        "--prompt-ids",
        "5,17,300",
        "-n",
        "3",
        "--json",
    ]));
    assert_eq!(v["logits_sha256"].as_array().map(Vec::len), Some(3), "{v}");
    // text in, text out: one short block on stderr after the text, as
    // llama_perf_context_print's; how the roles were served with --verbose
    let (_, tok) = packed(&tmp.path().join("t"));
    let run = |extra: &[&str]| {
        let mut args = vec![
            knot.as_str(),
            "--tokenizer",
            &tok,
            "-p",
            "hello world cat",
            "-n",
            "4",
        ];
        args.extend_from_slice(extra);
        let o = decode(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        (out, String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (out, block) = run(&[]);
    // the raw prompt echoed before its continuation, as llama.cpp's tools
    // do, unless --no-display-prompt
    assert!(out.starts_with("hello world cat"), "{out:?}");
    let (quiet, _) = run(&["--no-display-prompt"]);
    assert_eq!(out.strip_prefix("hello world cat"), Some(quiet.as_str()));
    for line in [
        "load: ",
        "bytes pulled",
        "prompt: 3 tokens in ",
        "generation: 4 tokens at ",
        "time to first token: ",
    ] {
        assert!(block.contains(line), "{line}: {block}");
    }
    assert!(
        !block.contains("token_embd:") && !block.contains("logits sha256"),
        "{block}"
    );
    let (_, verbose) = run(&["-v"]);
    assert!(
        verbose.contains("token_embd:") && verbose.contains("step 3 logits sha256"),
        "{verbose}"
    );
}

/// Issue 58: a progress bar while the model is pulled, on a terminal only
/// (`script` gives the run one), never with --no-progress or on a pipe.
#[test]
fn a_pull_shows_a_bar_on_a_terminal_only() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (knot, _) = packed(tmp.path());
    let on_tty = |extra: &str| {
        let args = [
            knot.as_str(),
            "--prompt-ids",
            "5,17,300",
            "-n",
            "2",
            "--no-cache",
            extra,
        ];
        fixtures::on_terminal(env!("CARGO_BIN_EXE_gkq-decode"), &args)
    };
    let shown = on_tty("");
    assert!(
        shown.contains("pulling ") && shown.contains("KiB"),
        "{shown}"
    );
    assert!(!on_tty("--no-progress").contains("pulling "));
    let piped = decode(&[&knot, "--prompt-ids", "5,17,300", "-n", "2", "--no-cache"]);
    assert!(!String::from_utf8_lossy(&piped.stderr).contains("pulling "));
}

/// Issue 58 (the README said so, and it was not true): a --columnar-embed
/// that is not used is a warning, as in gkq-rows.
#[test]
fn an_unused_columnar_embed_is_a_warning() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (knot, _) = packed(tmp.path());
    let pkg = format!("{}/", tmp.path().join("pkg").display());
    let nowhere = format!("{}/", tmp.path().join("nowhere").display());
    let run = |embed: &str| {
        let o = decode(&[
            &knot,
            "--columnar-embed",
            embed,
            "--prompt-ids",
            "1",
            "-n",
            "1",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = run(&nowhere);
    assert!(
        err.contains(&format!("warning: --columnar-embed {nowhere} is not used")),
        "{err}"
    );
    assert!(!run(&pkg).contains("warning"));
}

/// Issue 58: a package file the tokenizer needs that cannot be read is
/// named as that (the network, or damage), not as a tokenizer to replace.
#[test]
fn an_unreadable_tokenizer_file_is_named_as_such() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (_, tok) = packed(tmp.path());
    let src = tmp.path().join("src");
    std::fs::copy(&tok, src.join("tokenizer.json")).expect("copy");
    let out = tmp.path().join("pkg2");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(&src, &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    std::fs::remove_file(out.join("tokenizer.json")).expect("rm");
    let o = decode(&[out.to_str().expect("utf-8"), "-p", "hello world", "-n", "1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("reading the package's tokenizer.json"),
        "{err}"
    );
    assert!(
        !err.contains("the tokenizer:") && !err.contains("--tokenizer FILE"),
        "{err}"
    );
}

/// Issue 58: --chat-template NAME|FILE, as llama.cpp takes it.
#[test]
fn a_chat_template_by_name_or_file() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (knot, tok) = packed(tmp.path());
    let prompt = |template: &str| {
        let v = json(&decode(&[
            &knot,
            "--tokenizer",
            &tok,
            "--chat",
            "hello",
            "--chat-template",
            template,
            "-n",
            "1",
            "--json",
        ]));
        v["prompt"].as_str().expect("rendered").to_owned()
    };
    assert_eq!(
        prompt("chatml"),
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    );
    let file = tmp.path().join("t.jinja");
    std::fs::write(
        &file,
        "{% for m in messages %}[{{ m['content'] }}]{% endfor %}",
    )
    .expect("write");
    assert_eq!(prompt(file.to_str().expect("utf-8")), "[hello]");
    usage(
        &decode(&[&knot, "--chat", "hi", "--chat-template", "nosuch"]),
        &["--chat-template nosuch: neither a template this tool names (chatml, gemma) nor a file"],
    );
}

/// The options of a `--help` text of llama.cpp: each option line's names
/// and a value of its placeholder (`None` for a switch).
fn llama_options(help: &str) -> Vec<(Vec<String>, Option<String>)> {
    let mut out = Vec::new();
    for line in help
        .lines()
        .filter(|l| l.starts_with('-') && !l.starts_with("---"))
    {
        let mut head = line.to_owned();
        while head.contains(",  ") {
            head = head.replace(",  ", ", ");
        }
        let head = head.split("  ").next().unwrap_or_default().trim();
        let items: Vec<&str> = head.split(", ").collect();
        let names = items
            .iter()
            .map(|i| i.split(' ').next().unwrap_or_default().to_owned())
            .collect();
        let placeholder = items.last().and_then(|i| i.split_once(' ')).map(|(_, v)| v);
        let value = placeholder.map(|v| {
            let first = |set: &str, seps: &[char]| set.split(seps).next().unwrap_or("1").to_owned();
            match v.chars().next() {
                Some('[') => first(v.trim_matches(['[', ']']), &['|']),
                Some('{') => first(v.trim_matches(['{', '}']), &[',']),
                Some('<') if v.contains('|') => first(v.trim_matches(['<', '>']), &['|']),
                _ => "1".to_owned(),
            }
        });
        out.push((names, value));
    }
    out
}

/// Issue 58: every flag of `llama-cli --help` (the bench's build, kept in
/// tests/data/llama-cli-help.txt) gets gkq-decode's behaviour or what to
/// do instead, fitting the flag: never clap's "use '-- …'" tip, an
/// unexpected-argument error or an unrelated "similar argument".
#[test]
fn every_llama_cli_flag_is_answered() {
    let help = include_str!("data/llama-cli-help.txt");
    let knot = "/nonexistent/gkq/model.knot";
    let (mut answered, mut taken) = (0, 0);
    for (names, value) in llama_options(help) {
        for name in &names {
            let mut args = vec![knot, name.as_str()];
            args.extend(value.as_deref());
            let o = decode(&args);
            let err = String::from_utf8_lossy(&o.stderr);
            for clap in ["unexpected argument", "similar argument", "use '--"] {
                assert!(!err.contains(clap), "{name}: {err}");
            }
            if err.contains("is a llama.cpp flag that gkq-decode does not take") {
                assert!(err.contains(&format!("usage: {name} is")), "{name}: {err}");
                assert_eq!(o.status.code(), Some(2), "{name}: {err}");
                answered += 1;
            } else {
                assert!(matches!(o.status.code(), Some(0..=2)), "{name}: {err}");
                taken += 1;
            }
        }
    }
    assert!(
        answered > 250 && taken > 30,
        "{answered} answered, {taken} taken"
    );
}
