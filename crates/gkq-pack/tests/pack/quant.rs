//! `--quant` and the role types (issue 29): every quantized block equals
//! gguf-py's quantization of its source tensor (the 32-value types) and
//! dequantizes as gguf-py does (every type), on the test models and on real
//! MiniLM; the roles follow llama-quantize; fallbacks are reported; the
//! result does not depend on the thread count; bad input fails cleanly.

use std::fs;
use std::path::Path;
use std::process::Command;

use gkq_format::{DType, Knot, keys};

use super::{fails, json_report, model, packs, source_tensors, to_f32};

/// Runs one batch of gguf-py jobs (`OP TYPE IN OUT` per line).
fn gguf_py_batch(jobs: &[(String, DType, Vec<u8>)], dir: &Path) -> Vec<Vec<u8>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gguf_quants.py");
    let mut lines = String::new();
    for (k, (op, dtype, input)) in jobs.iter().enumerate() {
        let (i, o) = (dir.join(format!("in{k}")), dir.join(format!("out{k}")));
        fs::write(&i, input).expect("input");
        let name = dtype.name().to_ascii_uppercase();
        lines += &format!("{op} {name} {} {}\n", i.display(), o.display());
    }
    let list = dir.join("jobs.txt");
    fs::write(&list, lines).expect("jobs");
    let out = Command::new("python3")
        .arg(&script)
        .arg("batch")
        .arg(&list)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "gguf-py failed (bash scripts/install-test-deps.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (0..jobs.len())
        .map(|k| fs::read(dir.join(format!("out{k}"))).expect("output"))
        .collect()
}

fn le(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Checks a quantized package against its source with gguf-py: each block
/// of a block type equals gguf-py's quantization of the source values (for
/// the 32-value types) and dequantizes to gguf-py's values (every type);
/// other blocks are the source's bytes; `quant.*` lists every quantized
/// block with the figures measured here. Returns the quantized blocks'
/// names and types.
fn check_against_gguf_py(src: &Path, out: &Path, tmp: &Path) -> Vec<(String, DType)> {
    let bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&bytes).expect("valid");
    let header = knot.header().header();
    let mut jobs = Vec::new();
    let mut checked = Vec::new();
    for (name, dt, _shape, data) in source_tensors(src) {
        let Some(i) = header.block_index(&name) else {
            continue;
        };
        let b = &header.blocks[i];
        if matches!(b.encoding, gkq_format::Encoding::Alias { .. }) {
            continue; // the tied lm_head's alias
        }
        let payload = fixtures::knots::block_payload(out, &knot, i);
        let payload = payload.as_slice();
        if !b.dtype.is_quantized() {
            if b.dtype.to_string().to_uppercase() == dt {
                assert_eq!(payload, data.as_slice(), "{name}: not the source's bytes");
            }
            continue;
        }
        let x = to_f32(&data, &dt);
        if matches!(
            b.dtype,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1
        ) {
            jobs.push(("quantize".to_owned(), b.dtype, le(&x)));
            checked.push((name.clone(), b.dtype, payload.to_vec(), x.clone(), true));
        }
        jobs.push(("dequantize".to_owned(), b.dtype, payload.to_vec()));
        checked.push((name, b.dtype, payload.to_vec(), x, false));
    }
    let theirs = gguf_py_batch(&jobs, tmp);
    let figures = header.quant_figures();
    let mut names = Vec::new();
    for ((name, dtype, payload, x, quantize), t) in checked.into_iter().zip(theirs) {
        if quantize {
            assert!(
                payload == t,
                "{name} ({dtype}): blocks differ from gguf-py's"
            );
            continue;
        }
        let mut ours = Vec::new();
        assert!(gkq_format::decode_f32(&payload, dtype, &mut ours));
        assert!(
            le(&ours) == t,
            "{name} ({dtype}): values differ from gguf-py's"
        );
        // the figures, measured here on gguf-py's values
        let y: Vec<f32> = t
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
            .collect();
        let (mut sq, mut max) = (0f64, 0f64);
        for (a, b) in x.iter().zip(&y) {
            let d = f64::from(*a) - f64::from(*b);
            sq += d * d;
            max = max.max(d.abs());
        }
        let rmse = (sq / x.len() as f64).sqrt();
        let f = figures
            .iter()
            .find(|f| f.block == name)
            .unwrap_or_else(|| panic!("{name} is not in quant.blocks"));
        assert!(
            (f.rmse - rmse).abs() <= 1e-6 * rmse + 1e-12,
            "{name}: rmse {} vs {rmse}",
            f.rmse
        );
        assert!(
            (f.max_abs_error - max).abs() <= 1e-12,
            "{name}: max {} vs {max}",
            f.max_abs_error
        );
        names.push((name, dtype));
    }
    assert_eq!(
        figures.len(),
        names.len(),
        "quant.blocks lists every quantized block"
    );
    names
}

#[test]
fn the_32_value_types_equal_gguf_py_on_the_test_models() {
    let tmp = tempfile::tempdir().expect("tmp");
    for (preset, types) in [
        (
            "llama-tiny-f32",
            &[DType::Q8_0, DType::Q4_0, DType::Q4_1][..],
        ),
        ("qwen2-tiny-bf16", &[DType::Q5_0, DType::Q5_1][..]),
        ("llama-tiny-f16-sharded", &[DType::Q4_0][..]),
    ] {
        let src = model(tmp.path(), preset);
        for &t in types {
            let out = tmp.path().join(format!("{preset}-{t}"));
            let r = packs(
                &src,
                &out,
                &[
                    "--quant",
                    t.name(),
                    "--output-tensor-type",
                    t.name(),
                    "--json",
                ],
                preset,
            );
            let blocks = check_against_gguf_py(&src, &out, tmp.path());
            // every 2-D tensor, the roles included; no 1-D one
            let two_d = source_tensors(&src)
                .iter()
                .filter(|s| s.2.len() == 2)
                .count();
            assert_eq!(blocks.len(), two_d, "{preset} {t}");
            assert!(
                blocks.iter().all(|(_, d)| *d == t),
                "{preset} {t}: {blocks:?}"
            );
            let report = json_report(&r);
            let q = report["quantized"].as_array().expect("quantized");
            assert_eq!(q.len(), two_d);
            assert!(
                q.iter()
                    .all(|e| e["rmse"].as_f64().is_some_and(|x| x > 0.0))
            );
        }
    }
}

#[test]
fn real_minilm_q8_0_equals_gguf_py() {
    real_minilm_equals_gguf_py(DType::Q8_0);
}

#[test]
fn real_minilm_q4_0_equals_gguf_py() {
    real_minilm_equals_gguf_py(DType::Q4_0);
}

#[test]
fn real_minilm_q4_k_equals_gguf_py_and_falls_back() {
    real_minilm_equals_gguf_py(DType::Q4_K);
}

#[test]
fn real_minilm_q6_k_equals_gguf_py_and_falls_back() {
    real_minilm_equals_gguf_py(DType::Q6_K);
}

/// all-MiniLM-L6-v2 packed with `--quant t` equals gguf-py's quantization
/// of every block; a 256-value type takes the six [384, 1536] matrices and
/// falls back on rows of 384 values, as llama-quantize does. (One test per
/// type, so that the four packs and gguf-py runs share the cores.)
fn real_minilm_equals_gguf_py(t: DType) {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = fixtures::minilm();
    let out = tmp.path().join(t.name());
    let r = packs(&src, &out, &["--quant", t.name(), "--json"], "minilm");
    let blocks = check_against_gguf_py(&src, &out, tmp.path());
    let report = json_report(&r);
    let fallbacks = report["fallbacks"].as_array().expect("fallbacks");
    if t.block().is_some_and(|b| b.0 == 256) {
        // rows of 1536 values take the K type; rows of 384 fall back
        let k = blocks.iter().filter(|(_, d)| *d == t).count();
        assert_eq!(k, 6, "{t}: the six output.dense [384, 1536] matrices");
        assert!(!fallbacks.is_empty());
        for f in fallbacks {
            assert_eq!(f["asked"], t.name());
            let second = if t == DType::Q4_K { "q5_0" } else { "q8_0" };
            assert_eq!(f["stored"], second, "{f}");
            assert!(
                f["reason"]
                    .as_str()
                    .expect("reason")
                    .contains("not a multiple of 256"),
                "{f}"
            );
        }
    } else {
        assert!(fallbacks.is_empty(), "{t}: {fallbacks:?}");
        assert!(blocks.iter().all(|(_, d)| *d == t));
    }
}

/// The block types of a package's blocks, by name.
fn types_of(out: &Path) -> Vec<(String, DType)> {
    let bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&bytes).expect("valid");
    knot.blocks()
        .iter()
        .map(|b| (b.name.clone(), b.dtype))
        .collect()
}

fn type_of(out: &Path, name: &str) -> DType {
    types_of(out)
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no block {name}"))
        .1
}

/// Issue 58: `--quant` reads names as llama-quantize does (Q4_K is
/// Q4_K_M), and `--pure` is its `--pure` (every tensor in the type, the
/// lm_head too).
#[test]
fn q4_k_is_llama_quantizes_q4_k_m_and_pure_is_its_pure() {
    let tmp = tempfile::tempdir().expect("tmp");
    let k = model(tmp.path(), "llama-tiny-k");
    let v1 = "model.layers.1.self_attn.v_proj.weight";
    let pack = |name: &str, flags: &[&str]| {
        let out = tmp.path().join(name);
        packs(&k, &out, flags, name);
        types_of(&out)
    };
    let m = pack("m", &["--quant", "Q4_K_M"]);
    assert_eq!(pack("k", &["--quant", "Q4_K"]), m);
    assert_eq!(pack("k-lower", &["--quant", "q4_k"]), m);
    let in_m = |n: &str| m.iter().find(|(b, _)| b == n).expect("block").1;
    // layer 1 of 2 is one of llama.cpp's "more bits" layers
    assert_eq!(in_m(v1), DType::Q6_K);
    assert_eq!(in_m("lm_head.weight"), DType::Q6_K);
    let out = tmp.path().join("pure");
    packs(&k, &out, &["--quant", "Q4_K", "--pure"], "pure");
    assert_eq!(type_of(&out, v1), DType::Q4_K);
    assert_eq!(type_of(&out, "lm_head.weight"), DType::Q4_K);
    assert_eq!(type_of(&out, "model.embed_tokens.weight"), DType::Q4_K);
}

#[test]
fn the_roles_follow_llama_quantize() {
    let tmp = tempfile::tempdir().expect("tmp");
    let k = model(tmp.path(), "llama-tiny-k");
    let (embed, lm) = ("model.embed_tokens.weight", "lm_head.weight");
    let case = |name: &str, src: &Path, flags: &[&str]| {
        let out = tmp.path().join(name);
        packs(src, &out, flags, name);
        out
    };
    // --quant alone: the embedding in the type, the lm_head in q6_k
    let out = case("k-q4_0", &k, &["--quant", "q4_0"]);
    assert_eq!(type_of(&out, embed), DType::Q4_0);
    assert_eq!(type_of(&out, lm), DType::Q6_K);
    assert_eq!(type_of(&out, "model.norm.weight"), DType::F32, "1-D stays");
    // ... q8_0 when the type is q8_0
    let out = case("k-q8_0", &k, &["--quant", "q8_0"]);
    assert_eq!(type_of(&out, lm), DType::Q8_0);
    // a quantized untied lm_head is pulled whole and kept resident: no row
    // files unless asked (issue 55), the embedding's as before
    let columnar = |out: &Path, name: &str| {
        let knot = fs::read(out.join("model.knot")).expect("knot");
        let knot = Knot::parse(&knot).expect("valid");
        let i = knot.header().header().block_index(name).expect("block");
        knot.blocks()[i].columnar.len()
    };
    assert_eq!((columnar(&out, lm), columnar(&out, embed)), (0, 1));
    assert!(!out.join("lm_head.q8_0.rows").exists());
    let rows = case("k-q8_0-rows", &k, &["--quant", "q8_0", "--lm-head-rows"]);
    assert_eq!(columnar(&rows, lm), 1);
    assert!(
        rows.join("lm_head.q8_0.rows").exists() && rows.join("lm_head.q8_0.rows.proof").exists()
    );
    // the role types win
    let out = case(
        "k-roles",
        &k,
        &[
            "--quant",
            "q4_k",
            "--token-embedding-type",
            "q8_0",
            "--output-tensor-type",
            "bf16",
        ],
    );
    assert_eq!(type_of(&out, embed), DType::Q8_0);
    assert_eq!(type_of(&out, lm), DType::BF16);
    assert_eq!(columnar(&out, lm), 1, "a float lm_head keeps its rows");
    assert_eq!(
        type_of(&out, "model.layers.0.mlp.down_proj.weight"),
        DType::Q4_K
    );
    // a role type alone quantizes that role only
    let out = case("k-embed-only", &k, &["--token-embedding-type", "q4_0"]);
    assert_eq!(type_of(&out, embed), DType::Q4_0);
    assert_eq!(type_of(&out, lm), DType::F32);
    assert_eq!(
        type_of(&out, "model.layers.0.mlp.down_proj.weight"),
        DType::F32
    );
    // tied: the one tensor is the output (q6_k; rows of 64 fall back to q8_0)
    let tied = model(tmp.path(), "qwen2-tiny-f32");
    let out = tmp.path().join("tied");
    let r = packs(&tied, &out, &["--quant", "q4_0", "--json"], "tied");
    assert_eq!(type_of(&out, embed), DType::Q8_0);
    let report = json_report(&r);
    let f = &report["fallbacks"][0];
    assert_eq!(
        (f["tensor"].as_str(), f["asked"].as_str()),
        (Some(embed), Some("q6_k"))
    );
    // ... and takes either role type
    let out = case(
        "tied-output",
        &tied,
        &["--quant", "q4_0", "--output-tensor-type", "q4_0"],
    );
    assert_eq!(type_of(&out, embed), DType::Q4_0);
    // its row file is its own blocks
    let knot = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&knot).expect("valid");
    let b = &knot.blocks()[knot.header().header().block_index(embed).expect("embed")];
    assert_eq!(b.columnar.len(), 1);
    assert_eq!(b.columnar[0].dtype, DType::Q4_0);
    assert_eq!(b.columnar[0].row_bytes, 64 / 32 * 18);
    assert!(b.columnar[0].is_block_exact() && !b.columnar[0].is_source_exact());
}

#[test]
fn a_float_block_may_have_lossy_quantized_rows() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "llama-tiny-bf16");
    let out = tmp.path().join("out");
    packs(
        &src,
        &out,
        &["--dtype", "bf16", "--dtype", "q8_0"],
        "bf16+q8_0",
    );
    let knot = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&knot).expect("valid");
    let header = knot.header().header();
    let i = header
        .block_index("model.embed_tokens.weight")
        .expect("embed");
    let b = &knot.blocks()[i];
    assert_eq!(b.dtype, DType::BF16);
    let q = b
        .columnar
        .iter()
        .find(|d| d.dtype == DType::Q8_0)
        .expect("q8_0 rows");
    assert!(
        !q.is_block_exact() && !q.is_source_exact(),
        "lossy rows are never exact"
    );
    // the rows are the block's values quantized
    let mut values = Vec::new();
    let payload = fixtures::knots::block_payload(&out, &knot, i);
    gkq_format::decode_f32(&payload, DType::BF16, &mut values);
    let mut expected = Vec::new();
    assert!(gkq_format::quant::quantize(
        &values,
        DType::Q8_0,
        &mut expected
    ));
    assert!(fs::read(out.join(&q.object)).expect("rows") == expected);
    assert!(
        header.meta_list(keys::QUANT_BLOCKS).is_none(),
        "no block is quantized"
    );
}

#[test]
fn quantizing_does_not_depend_on_the_thread_count() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "llama-tiny-k");
    let mut packages = Vec::new();
    for threads in ["1", "3"] {
        let out = tmp.path().join(format!("t{threads}"));
        let r = super::bin()
            .env("RAYON_NUM_THREADS", threads)
            .arg(&src)
            .arg("--out")
            .arg(&out)
            .args([
                "--quant",
                "q4_k",
                "--token-embedding-type",
                "q5_k",
                "--quiet",
            ])
            .output()
            .expect("run");
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        packages.push(super::package_files(&out));
    }
    assert!(
        packages[0] == packages[1],
        "the packages differ between 1 and 3 threads"
    );
}

/// Overwrites element `index` of tensor `name` in the safetensors file of
/// `dir` (f32 tensors) with `value`.
fn poison(dir: &Path, name: &str, index: usize, value: f32) {
    let path = dir.join("model.safetensors");
    let mut bytes = fs::read(&path).expect("read");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8")) as usize;
    let meta: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    let start = meta[name]["data_offsets"][0].as_u64().expect("offsets") as usize;
    let at = 8 + n + start + index * 4;
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
    fs::write(&path, bytes).expect("write");
}

#[test]
fn bad_quantization_input_fails_cleanly() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "llama-tiny-f32");
    let out = tmp.path().join("out");
    // an unknown type: a usage error listing the types
    let r = super::run(&[
        src.to_str().expect("utf8"),
        "--out",
        out.to_str().expect("utf8"),
        "--quant",
        "q3_k",
    ]);
    assert_eq!(r.status.code(), Some(2));
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("q3_k is one of llama-quantize's types that gkq-pack does not write"),
        "{err}"
    );
    assert!(!out.exists());
    // a 32-value type cannot hold rows of 40 values: f16, as llama-quantize
    // falls back, unless the type was given for a role
    let narrow = tmp.path().join("narrow");
    let spec = fixtures::Spec {
        hidden: 40,
        heads: 4,
        kv_heads: 2,
        ..fixtures::Spec::tiny(fixtures::Arch::Llama, fixtures::FDtype::F32)
    };
    fixtures::write_model(&narrow, &spec).expect("fixture");
    let r = packs(
        &narrow,
        &out,
        &["--quant", "q4_0", "--json", "--force"],
        "narrow q4_0",
    );
    let f = &json_report(&r)["fallbacks"][0];
    assert_eq!(f["stored"], "f16", "{f}");
    assert_eq!(
        f["reason"], "40 values per row are not a multiple of 32",
        "{f}"
    );
    std::fs::remove_dir_all(&out).expect("rm");
    fails(
        &narrow,
        &out,
        &["--token-embedding-type", "q4_0"],
        &[
            "40 values per row are not a multiple of 32",
            "which has no fallback",
        ],
    );
    // a K type falls back to f16 there, and says why
    let r = packs(&narrow, &out, &["--quant", "q4_k", "--json"], "narrow q4_k");
    let f = &json_report(&r)["fallbacks"][0];
    assert_eq!(f["stored"], "f16");
    assert!(
        f["reason"].as_str().expect("reason").contains("nor of 32"),
        "{f}"
    );
    // a tied model with two role types
    let tied = model(tmp.path(), "qwen2-tiny-f32");
    let out2 = tmp.path().join("out2");
    fails(
        &tied,
        &out2,
        &[
            "--token-embedding-type",
            "q8_0",
            "--output-tensor-type",
            "q4_0",
        ],
        &["both the token embedding and the output (tied)", "conflict"],
    );
    // a block-type role cannot have float rows
    fails(
        &src,
        &out2,
        &["--quant", "q8_0", "--dtype", "f32"],
        &["is stored in q8_0, whose rows are its own blocks"],
    );
    // NaN in a weight matrix and infinity in the embedding, named; accepted
    // with --allow-nonfinite
    poison(
        &src,
        "model.layers.1.mlp.up_proj.weight",
        64 * 3 + 5,
        f32::NAN,
    );
    fails(
        &src,
        &out2,
        &["--quant", "q4_0"],
        &[
            "tensor \"model.layers.1.mlp.up_proj.weight\", row 3, column 5: the value is NaN",
            "--allow-nonfinite",
        ],
    );
    poison(&src, "model.embed_tokens.weight", 64 * 7 + 1, f32::INFINITY);
    fails(
        &src,
        &out2,
        &["--token-embedding-type", "q8_0"],
        &["tensor \"model.embed_tokens.weight\", row 7, column 1: the value is inf"],
    );
    packs(
        &src,
        &out2,
        &["--quant", "q4_0", "--allow-nonfinite"],
        "nonfinite allowed",
    );
}

/// A quantized GGUF's tensors: (name, dtype, bytes).
fn gguf_tensors(path: &Path) -> Vec<(String, DType, Vec<u8>)> {
    let bytes = fs::read(path).expect("gguf");
    let g = gkq_format::gguf::Gguf::parse(&bytes).expect("parse");
    g.tensors
        .iter()
        .map(|t| {
            let (a, n) = (t.offset as usize, t.len as usize);
            (t.name.clone(), t.dtype, bytes[a..a + n].to_vec())
        })
        .collect()
}

/// Issue 44 item 5: a quantized source's tensors pass through when already
/// in the asked type; another type needs --allow-requantize (named in the
/// refusal), and then each block equals gguf-py's
/// quantize(dequantize(source)).
#[test]
fn a_quantized_gguf_is_requantized_only_when_allowed_and_as_gguf_py() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("tiny-q8_0.gguf");
    fixtures::gguf::write(&fixtures::committed_tiny(), &src, "q8_0", None).expect("gguf-py");
    let source = gguf_tensors(&src);
    assert!(source.iter().any(|(_, d, _)| *d == DType::Q8_0));
    // already q8_0: the bytes pass through, no flag needed
    let same = tmp.path().join("same");
    packs(&src, &same, &["--quant", "q8_0"], "q8_0 on q8_0");
    let knot_bytes = fs::read(same.join("model.knot")).expect("knot");
    let knot = Knot::parse(&knot_bytes).expect("knot");
    for (name, dtype, data) in &source {
        let i = knot.header().header().block_index(name).expect("block");
        assert_eq!(knot.header().header().blocks[i].dtype, *dtype, "{name}");
        let payload = fixtures::knots::block_payload(&same, &knot, i);
        assert_eq!(payload, data.as_slice(), "{name}");
    }
    // another type: refused, naming the tensor, its type and the flag
    let out = tmp.path().join("q4");
    fails(
        &src,
        &out,
        &["--quant", "q4_0"],
        &["already quantized (q8_0)", "--allow-requantize", ".weight"],
    );
    assert!(!out.exists(), "nothing left behind");
    // allowed: dequantized, then quantized, as gguf-py does
    packs(
        &src,
        &out,
        &["--quant", "q4_0", "--allow-requantize"],
        "requantized",
    );
    let types = types_of(&out);
    let knot_bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&knot_bytes).expect("knot");
    let mut jobs = Vec::new();
    let mut expect = Vec::new();
    for (name, dtype, data) in &source {
        let stored = types.iter().find(|(n, _)| n == name).map(|(_, d)| *d);
        if *dtype != DType::Q8_0 || stored != Some(DType::Q4_0) {
            continue;
        }
        jobs.push(("dequantize".to_owned(), DType::Q8_0, data.clone()));
        expect.push(name.clone());
    }
    assert!(!expect.is_empty(), "{types:?}");
    let values = gguf_py_batch(&jobs, tmp.path());
    let jobs: Vec<_> = values
        .into_iter()
        .map(|v| ("quantize".to_owned(), DType::Q4_0, v))
        .collect();
    let want = gguf_py_batch(&jobs, tmp.path());
    for (name, want) in expect.iter().zip(want) {
        let i = knot.header().header().block_index(name).expect("block");
        let payload = fixtures::knots::block_payload(&out, &knot, i);
        assert_eq!(payload, want.as_slice(), "{name}");
    }
}
