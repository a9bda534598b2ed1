//! The `gkq-decode` binary: the JSON report, text prompts through a
//! tokenizer.json, and a pipeline run as two processes (an input stage
//! writing hidden states, an output stage reading them).

use std::path::Path;
use std::process::Output;

use sha2::Digest;

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
    assert!(v["tokens_per_second"].as_f64().expect("tok/s") > 0.0);
    assert!(v["peak_rss_bytes"].as_u64().expect("peak RSS") > 1 << 20);
    assert_eq!(v["resolutions"][0]["role"], "token_embd");
    assert_eq!(v["resolutions"][1]["path"], "resident");

    // --load-first: every weight is in before the prompt starts, so the
    // prefill waits for none, and the tokens are the same
    let first = json(&decode(&[
        &knot,
        "--prompt-ids",
        "5,17,300",
        "--max-new-tokens",
        "4",
        "--load-first",
        "--json",
    ]));
    assert_eq!(first["tokens"], v["tokens"]);
    assert_eq!(first["logits_sha256"], v["logits_sha256"]);
    // (microseconds of bookkeeping at most: each weight's first use asks)
    assert!(first["prefill_wait_ms"].as_f64() < Some(1.0), "{first}");
    assert!(
        first["prefill_tokens_per_second"]
            .as_f64()
            .expect("prefill")
            > 0.0
    );
    let waited = v["prefill_wait_ms"].as_f64().expect("the wait");
    assert!(waited <= v["prefill_ms"].as_f64().expect("prefill"), "{v}");

    // --logits-out: the first step's logits, whose digest the report gives
    let logits = tmp.path().join("logits.f32");
    let l = json(&decode(&[
        &knot,
        "--prompt-ids",
        "5,17,300",
        "--max-new-tokens",
        "1",
        "--logits-out",
        logits.to_str().expect("utf8"),
        "--json",
    ]));
    let bytes = std::fs::read(&logits).expect("logits file");
    assert_eq!(bytes.len(), 1024 * 4, "one f32 per vocabulary entry");
    assert_eq!(
        gkq_format::hex(&sha2::Sha256::digest(&bytes)),
        l["logits_sha256"][0].as_str().expect("digest")
    );
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let argmax = (0..values.len())
        .max_by(|&a, &b| values[a].total_cmp(&values[b]))
        .expect("a logit");
    assert_eq!(argmax as u64, tokens[0]);

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
        "-c",
        "0",
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
        "-c",
        "0",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("16777216 positions"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The pipelined decode from a URL equals the local run, token for token and
/// logits digest for digest: cold, with two processes filling one cache at
/// once, and warm from that cache (issue 20). Every cache entry is whole:
/// each blob hashes to its name, and no temporary file is left.
#[test]
fn two_processes_share_one_cache_and_decode_like_the_local_run() {
    let tmp = tempfile::tempdir().expect("tmp");
    let www = tmp.path().join("www");
    let knot = packed(&www);
    let nginx = fixtures::servers::Nginx::start(
        &www,
        &tmp.path().join("nginx"),
        &fixtures::servers::NginxOptions::default(),
    )
    .expect("nginx");
    let url = format!("{}/pkg/model.knot", nginx.url());
    let args = [
        "--prompt-ids",
        "5,17,300",
        "--max-new-tokens",
        "3",
        "--json",
    ];
    let outcome = |v: serde_json::Value| (v["tokens"].clone(), v["logits_sha256"].clone());
    let local = outcome(json(&decode(&[&[knot.as_str()][..], &args].concat())));
    let cache = tmp.path().join("cache");
    let cache_arg = cache.to_str().expect("utf8");
    let remote: Vec<&str> = [&[url.as_str(), "--cache-dir", cache_arg][..], &args].concat();
    let children: Vec<_> = (0..2)
        .map(|_| {
            fixtures::tool(env!("CARGO_BIN_EXE_gkq-decode"))
                .args(&remote)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for c in children {
        let o = c.wait_with_output().expect("wait");
        assert_eq!(outcome(json(&o)), local, "a cold process sharing the cache");
    }
    let warm = json(&decode(&remote));
    assert_eq!(outcome(warm.clone()), local, "warm from the cache");
    let mut blobs = 0;
    for dir in ["blob", "header", "table"] {
        let Ok(entries) = std::fs::read_dir(cache.join("v1").join(dir)) else {
            continue;
        };
        for e in entries {
            let p = e.expect("entry").path();
            let name = p.file_name().expect("name").to_string_lossy().into_owned();
            assert!(
                !name.contains("tmp"),
                "a temporary file was left: {}",
                p.display()
            );
            if dir == "blob" {
                let digest = sha2::Sha256::digest(std::fs::read(&p).expect("blob"));
                let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                assert_eq!(hex, name, "a torn blob");
                blobs += 1;
            }
        }
    }
    assert!(blobs > 0, "the blocks were cached");
}

/// `--warm` (issue 33): the input node seeds its row cache with the
/// package's warm object in one request before the prompt, and says so.
#[test]
fn a_node_given_warm_seeds_its_rows_in_one_request() {
    let tmp = tempfile::tempdir().expect("tmp");
    let www = tmp.path().join("www");
    let ids = tmp.path().join("ids.txt");
    std::fs::write(&ids, "5 17 300 1 2 3").expect("ids");
    let mut opts = gkq_pack::PackOptions::new(fixtures::committed_tiny(), www.join("m"));
    opts.warm.ids = Some(ids);
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let nginx = fixtures::servers::Nginx::start(
        &www,
        &tmp.path().join("nginx"),
        &fixtures::servers::NginxOptions::default(),
    )
    .expect("nginx");
    let knot = format!("{}/m/model.knot", nginx.url());
    let base = format!("{}/m/", nginx.url());
    let args = [
        &knot,
        "--columnar-embed",
        &base,
        "--warm",
        "--no-cache",
        "--prompt-ids",
        "5,17,300",
        "--max-new-tokens",
        "2",
    ];
    let v = json(&decode(&[&args[..], &["--json"]].concat()));
    let w = &v["warm"];
    assert_eq!(
        (w["seeded"].as_u64(), w["requests"].as_u64()),
        (Some(6), Some(1)),
        "{w}"
    );
    let o = decode(&args);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("warm: 6 of 6 warm rows seeded in 1 requests"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// The first step's logits of `flags` on the tiny model.
fn first_logits(knot: &str, out: &Path, flags: &[&str]) -> Vec<f32> {
    let o = out.to_str().expect("utf8");
    let mut args = vec![knot, "--prompt-ids", "5,17,300", "-n", "1", "--json"];
    args.extend_from_slice(&["--logits-out", o]);
    args.extend_from_slice(flags);
    json(&decode(&args));
    let bytes = std::fs::read(out).expect("logits file");
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn an_f16_kv_cache_as_llama_cpp_keeps_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let knot = packed(tmp.path());
    let out = tmp.path().join("logits.f32");
    let f32s = first_logits(&knot, &out, &[]);
    assert_eq!(first_logits(&knot, &out, &["-ctk", "f32"]), f32s);
    for flags in [
        &["-ctk", "f16", "-ctv", "f16"][..],
        &["--cache-type-k", "f16"],
        &["--cache-type-v=f16"],
    ] {
        let f16s = first_logits(&knot, &out, flags);
        // the prompt's keys or values rounded to f16: other bits, close
        assert_ne!(f16s, f32s, "{flags:?}");
        let worst = f16s
            .iter()
            .zip(&f32s)
            .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
            .fold(0f32, f32::max);
        assert!(worst < 1e-2, "{flags:?}: {worst}");
    }
    let o = decode(&[&knot, "--prompt-ids", "5", "-ctk", "q8_0"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("q8_0: the KV cache keeps f32 or f16"), "{err}");
}
