//! The `gkq-decode` binary: the JSON report, text prompts through a
//! tokenizer.json, and a pipeline run as two processes (an input stage
//! writing hidden states, an output stage reading them).

use std::path::Path;
use std::process::Output;

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

fn packed(dir: &Path) -> String {
    let out = dir.join("pkg");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(fixtures::committed_tiny(), &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    out.join("model.knot").to_str().expect("utf8").to_owned()
}

#[test]
fn json_report_text_prompt_and_two_process_pipeline() {
    let tmp = tempfile::tempdir().expect("tmp");
    let knot = packed(tmp.path());
    let v = json(&decode(&[
        &knot,
        "--prompt-ids",
        "5,17,300",
        "--max-new-tokens",
        "4",
        "--json",
    ]));
    let tokens: Vec<u64> = v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("id"))
        .collect();
    assert_eq!(tokens.len(), 4);
    assert_eq!(v["logits_sha256"].as_array().expect("digests").len(), 4);
    for k in ["knot_header", "embedding_rows", "lm_head", "other_blocks"] {
        assert!(v["bytes"][k].is_u64(), "{k}");
    }
    assert!(v["time_to_first_token_ms"].as_f64().expect("ttft") > 0.0);
    assert_eq!(v["resolutions"][0]["role"], "token_embd");
    assert_eq!(v["resolutions"][1]["path"], "resident");

    // a word-level tokenizer.json: "hello world" is ids 5, 17
    let tok = tmp.path().join("tokenizer.json");
    std::fs::write(
        &tok,
        r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":5,"world":17,"cat":300},"unk_token":"[UNK]"}}"#,
    )
    .expect("write");
    let t = json(&decode(&[
        &knot,
        "--prompt",
        "hello world cat",
        "--tokenizer",
        tok.to_str().expect("utf8"),
        "--max-new-tokens",
        "4",
        "--json",
    ]));
    assert_eq!(t["tokens"], v["tokens"], "the same prompt as ids 5,17,300");

    // layer 0 in one process, layer 1 and lm_head in another
    let hidden = tmp.path().join("hidden.f32");
    let h = hidden.to_str().expect("utf8");
    let a = json(&decode(&[
        &knot,
        "--roles",
        "input",
        "--layers",
        "0..1",
        "--prompt-ids",
        "5,17,300",
        "--hidden-out",
        h,
        "--json",
    ]));
    assert_eq!(a["bytes"]["lm_head"], 0);
    assert_eq!(
        std::fs::metadata(&hidden).expect("hidden").len(),
        3 * 64 * 4
    );
    let b = json(&decode(&[
        &knot,
        "--roles",
        "output",
        "--layers",
        "1..2",
        "--hidden-in",
        h,
        "--json",
    ]));
    assert_eq!(b["tokens"][0], v["tokens"][0], "the pipeline's next token");
    assert_eq!(b["bytes"]["embedding_rows"], 0);

    // the same pipeline in one process, each node with its own reader
    let sp = json(&decode(&[
        &knot,
        "--split",
        "1",
        "--prompt-ids",
        "5,17,300",
        "--max-new-tokens",
        "4",
        "--json",
    ]));
    assert_eq!(sp["tokens"], v["tokens"]);
    assert_eq!(sp["logits_sha256"], v["logits_sha256"]);
    assert_eq!(
        sp["stage_bytes"][0]["lm_head"], 0,
        "the input node never pulls lm_head"
    );
    assert_eq!(
        sp["stage_bytes"][1]["embedding_rows"], 0,
        "the output node never reads rows"
    );

    // errors name what is wrong and exit 1
    let e = decode(&[&knot, "--prompt-ids", "5000", "--max-new-tokens", "1"]);
    assert_eq!(e.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&e.stderr).contains("token id 5,000 is out of range"));
    let e = decode(&[&knot, "--layers", "0..9", "--prompt-ids", "1"]);
    assert_eq!(e.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&e.stderr).contains("outside the model's 0..2"));
}

/// The committed tiny model with `edit` applied to its config.json, packed
/// (the knot pins the edited file): a publisher shipping nonsense.
fn packed_with_config(dir: &Path, edit: impl Fn(&mut serde_json::Value)) -> String {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    for e in std::fs::read_dir(fixtures::committed_tiny()).expect("committed") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, src.join(p.file_name().expect("name"))).expect("copy");
    }
    let cfg = src.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg).expect("config")).expect("json");
    edit(&mut v);
    std::fs::write(&cfg, serde_json::to_vec_pretty(&v).expect("json")).expect("write");
    let out = dir.join("pkg");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(&src, &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    out.join("model.knot").to_str().expect("utf8").to_owned()
}

/// Sizes from config.json are checked against the knot's blocks with
/// checked arithmetic before anything is allocated (issue 22, item 3):
/// one clear error and exit 1, locally and from a URL, never an abort.
#[test]
fn nonsense_config_sizes_are_one_clear_error() {
    let tmp = tempfile::tempdir().expect("tmp");
    // 4 heads × (16 + 2^62) wraps to the real width 64
    let wrapping_head_dim = 16u64 + (1u64 << 62);
    let cases: [(&str, serde_json::Value, &str); 3] = [
        (
            "num_hidden_layers",
            serde_json::json!(1_000_000_000_000u64),
            "num_hidden_layers is 1000000000000, but the knot holds 2 layers",
        ),
        (
            "num_hidden_layers",
            serde_json::json!(u64::MAX),
            "num_hidden_layers is 18446744073709551615",
        ),
        (
            "head_dim",
            serde_json::json!(wrapping_head_dim),
            "overflows",
        ),
    ];
    let www = tmp.path().join("www");
    std::fs::create_dir_all(&www).expect("www");
    let nginx = fixtures::servers::Nginx::start(
        &www,
        &tmp.path().join("nginx"),
        &fixtures::servers::NginxOptions::default(),
    )
    .expect("nginx");
    for (i, (key, value, needle)) in cases.into_iter().enumerate() {
        let dir = www.join(i.to_string());
        let knot = packed_with_config(&dir, |v| v[key] = value.clone());
        let url = format!("{}/{i}/pkg/model.knot", nginx.url());
        for target in [knot.as_str(), url.as_str()] {
            let o = decode(&[target, "--prompt-ids", "5", "--max-new-tokens", "1"]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{key}={value} {target}: {err}");
            assert!(
                err.contains("config.json") && err.contains(needle),
                "{key}={value}: {err}"
            );
            assert!(!err.contains("panicked"), "{err}");
        }
    }
}

/// `--max-new-tokens` beyond the model's positions is a usage error (exit
/// 2), not a capacity overflow (issue 22, item 4), even when the config
/// claims u64::MAX positions.
#[test]
fn max_new_tokens_is_bounded_by_the_positions() {
    let tmp = tempfile::tempdir().expect("tmp");
    let knot = packed(tmp.path());
    let o = decode(&[
        &knot,
        "--prompt-ids",
        "5",
        "--max-new-tokens",
        "18446744073709551615",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("32768 positions (max_position_embeddings)"),
        "{err}"
    );
    let knot = packed_with_config(&tmp.path().join("huge"), |v| {
        v["max_position_embeddings"] = serde_json::json!(u64::MAX);
    });
    let o = decode(&[
        &knot,
        "--prompt-ids",
        "5",
        "--max-new-tokens",
        "18446744073709551615",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("16777216 positions"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
