//! Packed rows against their source: every preset row by row, the casts
//! and what they lose, aliases, determinism and the runs objects.

use super::*;

#[test]
fn packs_every_preset_row_by_row() {
    let tmp = tempfile::tempdir().expect("tmp");
    for preset in fixtures::test_presets() {
        let src = model(tmp.path(), preset);
        let out = tmp.path().join(format!("{preset}.out"));
        let r = packs(
            &src,
            &out,
            &[
                "--dtype", "f32", "--dtype", "bf16", "--dtype", "f16", "--quiet",
            ],
            preset,
        );
        assert!(
            r.stdout.is_empty() && r.stderr.is_empty(),
            "--quiet prints nothing"
        );
        let tied = preset.starts_with("qwen2");
        check_pack(&src, &out, &[DType::F32, DType::BF16, DType::F16], tied);
    }
}

#[test]
fn narrow_first_dtype_and_json_report() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "llama-tiny-f32");
    let out = tmp.path().join("out");
    let r = packs(&src, &out, &["--dtype", "bf16", "--json"], "pack");
    check_pack(&src, &out, &[DType::BF16], false);
    let v: serde_json::Value =
        serde_json::from_slice(&r.stdout).expect("one JSON object on stdout");
    assert_eq!(v["tied"], false);
    assert_eq!(
        v["columnar"].as_array().expect("array").len(),
        2,
        "token_embd and lm_head rows"
    );
    // the knot is named by its id, the digest of its header
    let knot = fs::read(out.join("model.knot")).expect("knot");
    let parsed = Knot::parse(&knot).expect("valid");
    assert_eq!(
        v["knot_id"].as_str().expect("hex"),
        gkq_format::hex(&parsed.header().preamble().header_sha256)
    );
    assert_eq!(v["knot"]["bytes"].as_u64(), Some(knot.len() as u64));
    for c in v["columnar"].as_array().expect("array") {
        let bytes = fs::read(c["path"].as_str().expect("path")).expect("file");
        assert_eq!(c["bytes"].as_u64(), Some(bytes.len() as u64));
        assert_eq!(
            c["sha256"].as_str().expect("hex"),
            gkq_format::hex(&sha(&bytes))
        );
    }
    let casts = v["casts"].as_array().expect("casts");
    assert_eq!(casts.len(), 2);
    assert!(casts.iter().all(|c| c["from"] == "f32"
        && c["to"] == "bf16"
        && c["max_abs_error"].as_f64().expect("f64") > 0.0));
    for key in ["tensors", "source_bytes", "seconds"] {
        assert!(v[key].is_number(), "{key}");
    }
}

#[test]
fn identical_lm_head_becomes_alias() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut spec = fixtures::Spec::tiny(fixtures::Arch::Llama, fixtures::FDtype::BF16);
    spec.lm_head_copies_embed = true;
    let src = tmp.path().join("m");
    fixtures::write_model(&src, &spec).expect("write");
    let out = tmp.path().join("out");
    packs(&src, &out, &["--quiet"], "pack");
    check_pack(&src, &out, &[DType::F32], true);
    assert!(
        !out.join("lm_head.f32.rows").exists(),
        "one row file serves both"
    );
}

#[test]
fn packing_twice_is_byte_identical() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "llama-tiny-bf16-sharded");
    let mut outs = Vec::new();
    for n in 0..2 {
        let out = tmp.path().join(format!("out{n}"));
        packs(
            &src,
            &out,
            &["--dtype", "f32", "--dtype", "bf16", "--quiet"],
            "pack",
        );
        outs.push(package_files(&out));
    }
    assert_eq!(
        outs[0].len(),
        10,
        "knot + 2 roles x 2 dtypes x (rows + proof) + config.json"
    );
    assert!(outs[0] == outs[1], "two packs differ");
}

#[test]
fn f16_overflow_names_tensor_row_and_column() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut spec = fixtures::Spec::tiny(fixtures::Arch::Qwen2, fixtures::FDtype::F32);
    spec.poke = Some((7, 3, 70000.0));
    let src = tmp.path().join("m");
    fixtures::write_model(&src, &spec).expect("write");
    let out = tmp.path().join("out");
    fails(
        &src,
        &out,
        &["--dtype", "f16"],
        &[
            "model.embed_tokens.weight",
            "row 7",
            "column 3",
            "70000",
            "--allow-lossy",
        ],
    );
    fails(
        &src,
        &out,
        &["--dtype", "f32", "--dtype", "f16"],
        &["row 7", "column 3"],
    );
    let r = packs(
        &src,
        &out,
        &["--dtype", "f16", "--allow-lossy", "--json"],
        "pack",
    );
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).expect("json");
    assert_eq!(v["casts"][0]["overflowed"], true);
}

/// Values in (65504, 65520) round to the finite 65504 (FORMAT.md section 6):
/// not an overflow, but a loss the report shows.
#[test]
fn f16_values_below_65520_round_to_max_and_are_reported() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut spec = fixtures::Spec::tiny(fixtures::Arch::Qwen2, fixtures::FDtype::F32);
    spec.poke = Some((7, 3, 65519.0));
    let src = tmp.path().join("m");
    fixtures::write_model(&src, &spec).expect("write");
    let out = tmp.path().join("out");
    let r = packs(
        &src,
        &out,
        &["--dtype", "f16", "--json"],
        "pack 65519 as f16",
    );
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).expect("json");
    assert_eq!(v["casts"][0]["overflowed"], false);
    assert_eq!(v["casts"][0]["max_abs_error"], 15.0);
    assert_eq!(v["columnar"][0]["max_abs_error_vs_source"], 15.0);
    spec.poke = Some((7, 3, 65520.0));
    let src2 = tmp.path().join("m2");
    fixtures::write_model(&src2, &spec).expect("write");
    let err = fails(
        &src2,
        &tmp.path().join("out2"),
        &["--dtype", "f16"],
        &[
            "row 7",
            "column 3",
            "65520",
            "rounds to infinity",
            "--allow-lossy",
        ],
    );
    assert!(!err.contains("does not fit"), "{err}");
}

/// With `--dtype f16 --dtype f32` the f32 row file is widened from the f16
/// block: exact against the block, lossy against the source. The report
/// gives the loss against the source for every row file.
#[test]
fn report_gives_every_row_files_error_against_the_source() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-f32");
    let r = packs(
        &src,
        &tmp.path().join("out"),
        &[
            "--dtype", "f16", "--dtype", "f32", "--dtype", "bf16", "--json",
        ],
        "pack",
    );
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).expect("json");
    let cols = v["columnar"].as_array().expect("columnar");
    let err_of = |d: &str| {
        cols.iter()
            .find(|c| c["dtype"] == d)
            .and_then(|c| c["max_abs_error_vs_source"].as_f64())
            .expect("error recorded")
    };
    let (e16, e32, ebf) = (err_of("f16"), err_of("f32"), err_of("bf16"));
    assert!(e16 > 0.0, "f16 of an f32 source is lossy");
    assert_eq!(
        e32, e16,
        "f32 rows widened from the f16 block carry its loss"
    );
    assert!(
        ebf >= e16,
        "bf16 rounded from f16 loses at least as much: {ebf} vs {e16}"
    );
    // the cast list still shows f16 -> f32 as exact against the block
    let widen = v["casts"]
        .as_array()
        .expect("casts")
        .iter()
        .find(|c| c["to"] == "f32")
        .expect("f16 -> f32");
    assert_eq!(widen["max_abs_error"], 0.0);
    let human = run(&[
        src.to_str().expect("utf8"),
        "--out",
        tmp.path().join("out-h").to_str().expect("utf8"),
        "--dtype",
        "f16",
        "--dtype",
        "f32",
    ]);
    let text = String::from_utf8_lossy(&human.stderr);
    assert!(text.contains("max abs error vs source"), "{text}");
}

/// A bare encoder (BertModel, as sentence-transformers models ship) has no
/// lm_head: none is invented.
#[test]
fn encoder_without_output_projection_has_no_lm_head() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "bert-tiny-f32");
    let cfg_path = src.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&fs::read(&cfg_path).expect("config")).expect("json");
    cfg["architectures"] = serde_json::json!(["BertModel"]);
    fs::write(&cfg_path, serde_json::to_vec(&cfg).expect("json")).expect("write");
    let out = tmp.path().join("out");
    let r = packs(&src, &out, &["--json"], "pack BertModel");
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).expect("json");
    assert_eq!(v["lm_head"], serde_json::Value::Null);
    assert_eq!(v["tied"], false);
    let knot_bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&knot_bytes).expect("valid");
    let h = knot.header().header();
    assert_eq!(h.meta_str(keys::ROLE_LM_HEAD), None);
    assert_eq!(h.meta_bool(keys::TIE_WORD_EMBEDDINGS), None);
    assert!(h.block("cls.predictions.decoder.weight").is_none());
    assert!(
        h.blocks
            .iter()
            .all(|b| !matches!(b.encoding, Encoding::Alias { .. }))
    );
    let human = run(&[
        src.to_str().expect("utf8"),
        "--out",
        tmp.path().join("out-h").to_str().expect("utf8"),
    ]);
    let text = String::from_utf8_lossy(&human.stderr);
    assert!(text.contains("no lm_head"), "{text}");
    assert!(!text.contains("tied"), "{text}");
}

/// Issue 23: a runs object (FORMAT.md 7b) for the row file a node fetches
/// (the narrowest certainly exact: bf16 rows of a bf16 source), when it
/// has path records; none with `--no-runs`.
#[test]
fn runs_objects_for_the_row_file_a_node_fetches() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut spec = fixtures::preset("qwen2-tiny-bf16").expect("preset");
    spec.hidden = 1024; // 2 KiB bf16 rows: proof height 7
    spec.heads = 8;
    spec.kv_heads = 8;
    spec.layers = 1;
    let src = tmp.path().join("model");
    fixtures::write_model(&src, &spec).expect("fixture");
    let out = tmp.path().join("out");
    packs(
        &src,
        &out,
        &["--quiet", "--dtype", "f32", "--dtype", "bf16"],
        "runs",
    );
    assert!(out.join("token_embd.bf16.rows.runs").is_file());
    assert!(
        !out.join("token_embd.f32.rows.runs").exists(),
        "the wider file gets none"
    );
    let knot = fs::read(out.join("model.knot")).expect("knot");
    let k = Knot::parse(&knot).expect("parse");
    assert_eq!(
        k.header()
            .header()
            .meta_list(gkq_format::keys::COLUMNAR_RUNS),
        Some(&["token_embd.bf16.rows".to_owned()][..])
    );
    let runs = fs::read(out.join("token_embd.bf16.rows.runs")).expect("runs");
    assert_eq!(
        runs.len(),
        512 * (2048 + 32 * 7),
        "512 rows, each with a 7-hash path"
    );
    packs(
        &src,
        &out,
        &[
            "--quiet",
            "--force",
            "--dtype",
            "f32",
            "--dtype",
            "bf16",
            "--no-runs",
        ],
        "no runs",
    );
    assert!(
        !out.join("token_embd.bf16.rows.runs").exists(),
        "--no-runs, and --force removed the old one"
    );
    let knot = fs::read(out.join("model.knot")).expect("knot");
    let k = Knot::parse(&knot).expect("parse");
    assert!(
        k.header()
            .header()
            .meta_list(gkq_format::keys::COLUMNAR_RUNS)
            .is_none()
    );
}
