//! The warm set (issue 33, FORMAT.md 7d): `--warm-set K --warm-corpus` on
//! the real all-MiniLM-L6-v2 and its WordPiece tokenizer with sentences
//! written for the tests, `--warm-ids` (a list, or gkq-report's JSON), a
//! warm object next to every row file of the embedding that the release
//! gate checks byte for byte; every bad input refused by name, with
//! nothing written.

use super::*;

fn texts() -> Vec<String> {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/texts");
    ["qa_short.txt", "chat.jsonl", "code.txt", "prose.txt"]
        .iter()
        .map(|n| d.join(n).display().to_string())
        .collect()
}

fn warm_rows(out: &Path) -> (Vec<u64>, Vec<String>) {
    let bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&bytes).expect("valid");
    let h = knot.header().header();
    (
        h.warm_rows(),
        h.meta_list(keys::COLUMNAR_WARM).expect("listed").to_vec(),
    )
}

#[test]
fn a_corpus_ranks_the_warm_set_with_the_models_tokenizer() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("out");
    let mut args = vec![
        fixtures::minilm().display().to_string(),
        "--out".into(),
        out.display().to_string(),
        "--dtype".into(),
        "f32".into(),
        "--dtype".into(),
        "f16".into(),
        "--warm-set".into(),
        "40".into(),
        "--warm-corpus".into(),
    ];
    args.extend(texts());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run(&args);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(
        err.contains("warm set of 40 rows: the ids most of the corpus's 6 sessions use"),
        "{err}"
    );
    let (rows, objects) = warm_rows(&out);
    assert_eq!(objects, ["token_embd.f16.rows", "token_embd.f32.rows"]);
    assert_eq!(rows.len(), 40);
    assert!(rows.windows(2).all(|w| w[0] < w[1]), "ascending");
    // [CLS] (101) and [SEP] (102) open and close every session
    assert!(rows.contains(&101) && rows.contains(&102), "{rows:?}");
    // each warm object: the proof object's table, then the rows and records
    let knot = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&knot).expect("valid");
    for d in knot.blocks().iter().flat_map(|b| &b.columnar) {
        let rows_file = fs::read(out.join(&d.object)).expect("rows");
        let proof = fs::read(out.join(format!("{}.proof", d.object))).expect("proof");
        let mut want = Vec::new();
        let read = |part, at: u64, buf: &mut [u8]| {
            let src = match part {
                gkq_format::warm::WarmPart::Rows => &rows_file,
                gkq_format::warm::WarmPart::Proof => &proof,
            };
            buf.copy_from_slice(&src[at as usize..at as usize + buf.len()]);
            Ok(())
        };
        gkq_format::warm::write_warm(d, &rows, read, &mut want).expect("expected");
        let got = fs::read(out.join(format!("{}.warm", d.object))).expect("warm object");
        assert!(got == want, "{}: the warm object differs", d.object);
    }
}

#[test]
fn a_list_of_ids_or_a_reports_json_sets_the_warm_rows() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-f32");
    let ids = tmp.path().join("ids.txt");
    // most needed first, a duplicate, a comment: the first K distinct, ascending
    fs::write(&ids, "# ranked\n500, 3 3\n17 42\n").expect("ids");
    let out = tmp.path().join("a");
    let r = run(&[
        src.to_str().expect("utf8"),
        "--out",
        out.to_str().expect("utf8"),
        "--warm-ids",
        ids.to_str().expect("utf8"),
        "--warm-set",
        "3",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(warm_rows(&out).0, [3, 17, 500]);
    let json = tmp.path().join("report.json");
    fs::write(&json, r#"{"knot_id": "x", "warm_ids": [9, 1, 4]}"#).expect("json");
    let out = tmp.path().join("b");
    let r = run(&[
        src.to_str().expect("utf8"),
        "--out",
        out.to_str().expect("utf8"),
        "--warm-ids",
        json.to_str().expect("utf8"),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(warm_rows(&out).0, [1, 4, 9]);
}

#[test]
fn bad_warm_inputs_are_refused_by_name_and_nothing_is_written() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-f32");
    let out = tmp.path().join("out");
    let file = |name: &str, bytes: &[u8]| {
        let p = tmp.path().join(name);
        fs::write(&p, bytes).expect("write");
        p.display().to_string()
    };
    let far = file("far.txt", b"1 2 999999");
    let none = file("none.txt", b"# nothing\n");
    let junk = file("junk.txt", b"1, two");
    let text = file("text.txt", b"hello world");
    let tiny_vocab = "512";
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--warm-set", "0"],
            vec!["--warm-set 0", "between 1 and"],
        ),
        (
            vec!["--warm-set", "513", "--warm-ids", &far],
            vec!["--warm-set 513", tiny_vocab],
        ),
        (vec!["--warm-set", "5"], vec!["--warm-corpus", "--warm-ids"]),
        (
            vec!["--warm-corpus", &text],
            vec!["--warm-corpus needs --warm-set"],
        ),
        (
            vec!["--warm-ids", &far],
            vec!["far.txt", "999999", tiny_vocab],
        ),
        (vec!["--warm-ids", &none], vec!["none.txt", "no ids"]),
        (vec!["--warm-ids", &junk], vec!["junk.txt", "\"two\""]),
        (
            vec!["--warm-set", "5", "--warm-corpus", &text],
            vec!["no tokenizer.json", "--warm-ids"],
        ),
    ];
    for (extra, says) in cases {
        fails(&src, &out, &extra, &says);
        assert!(!out.exists(), "{extra:?} left {}", out.display());
    }
    // a corpus that is not text, or is empty: named, with the model's own tokenizer
    let latin1 = file("latin1.txt", b"caf\xe9");
    let empty = file("empty.txt", b" \n");
    for (corpus, says) in [
        (&latin1, "latin1.txt: not UTF-8"),
        (&empty, "empty.txt: an empty workload"),
    ] {
        fails(
            &fixtures::minilm(),
            &out,
            &["--warm-set", "5", "--warm-corpus", corpus],
            &[says],
        );
    }
}
