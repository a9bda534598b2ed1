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
