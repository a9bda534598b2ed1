//! GGUF in (issue 30): GGUFs written by gguf-py from the test models (f32,
//! f16, q8_0, q4_0; tied and untied; one file and shards) pack into knots
//! whose blocks are the tensors gguf-py reads back, byte for byte, with the
//! roles' row files in their own types, the metadata in `metadata.gguf`
//! and a derived `config.json`; hostile or unpackable GGUFs fail cleanly.

use std::fs;
use std::path::{Path, PathBuf};

use gkq_format::{DType, Encoding, Knot, keys};
use sha2::{Digest, Sha256};

use super::{fails, json_report, model, packs};

/// The knot dtype of a gguf-py type name.
fn dtype(name: &str) -> DType {
    match name {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "Q8_0" => DType::Q8_0,
        "Q4_0" => DType::Q4_0,
        other => panic!("unexpected type {other}"),
    }
}

/// A GGUF of `preset` in `kind`, one file or shards of `split` tensors;
/// returns what to pack (the file, or the directory of the shards) and the files.
fn gguf(tmp: &Path, preset: &str, kind: &str, split: Option<usize>) -> (PathBuf, Vec<PathBuf>) {
    let src = model(tmp, preset);
    let dir = tmp.join(format!("gguf-{preset}-{kind}-{}", split.unwrap_or(0)));
    fs::create_dir_all(&dir).expect("dir");
    let files = fixtures::gguf::write(&src, &dir.join("model.gguf"), kind, split).expect("gguf-py");
    let arg = if split.is_some() {
        dir
    } else {
        files[0].clone()
    };
    (arg, files)
}

fn hex(b: &[u8]) -> String {
    gkq_format::hex(&Sha256::digest(b))
}

/// Checks a package against what gguf-py reads from `files`.
fn check(out: &Path, files: &[PathBuf], tied: bool) {
    let theirs = fixtures::gguf::dump(files).expect("gguf-py");
    let bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&bytes).expect("valid");
    let header = knot.header().header();
    let tensors = theirs["tensors"].as_array().expect("tensors");
    for t in tensors {
        let name = t["name"].as_str().expect("name");
        let i = header
            .block_index(name)
            .unwrap_or_else(|| panic!("{name} is not in the knot"));
        let b = &header.blocks[i];
        assert_eq!(b.dtype, dtype(t["type"].as_str().expect("type")), "{name}");
        let shape: Vec<u64> = t["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim"))
            .collect();
        assert_eq!(b.shape, shape, "{name}");
        assert_eq!(
            hex(&fixtures::knots::block_payload(out, &knot, i)),
            t["sha256"],
            "{name}: not the GGUF's bytes"
        );
    }
    // the roles: llama.cpp's names, row files in their own type
    assert_eq!(
        header.meta_str(keys::ROLE_TOKEN_EMBD),
        Some("token_embd.weight")
    );
    assert_eq!(header.meta_str(keys::ROLE_LM_HEAD), Some("output.weight"));
    let e = header.block("token_embd.weight").expect("embedding");
    assert!(e.is_columnar_eligible());
    assert_eq!(e.columnar.len(), 1);
    assert_eq!(
        e.columnar[0].dtype, e.dtype,
        "rows in the tensor's own type"
    );
    let rows = fs::read(out.join(&e.columnar[0].object)).expect("rows");
    let embed = tensors
        .iter()
        .find(|t| t["name"] == "token_embd.weight")
        .expect("embedding tensor");
    assert_eq!(hex(&rows), embed["sha256"]);
    let lm = &header.blocks[header.block_index("output.weight").expect("lm_head")];
    assert_eq!(
        matches!(lm.encoding, Encoding::Alias { .. }),
        tied,
        "the alias exactly when tied"
    );
    assert_eq!(header.blocks.len(), tensors.len() + usize::from(tied));
    // the metadata, as gguf-py reads it, in metadata.gguf
    let meta = fixtures::gguf::dump(&[out.join("metadata.gguf")]).expect("metadata.gguf");
    assert_eq!(meta["metadata"], theirs["metadata"]);
    assert_eq!(meta["version"], theirs["version"]);
    let cfg: serde_json::Value =
        serde_json::from_slice(&fs::read(out.join("config.json")).expect("config")).expect("json");
    assert_eq!(cfg["tie_word_embeddings"], tied);
    assert_eq!(cfg["vocab_size"], 512);
    // the source files' digests are the files'
    let digests = header.meta_list(keys::SOURCE_SHA256).expect("digests");
    for (f, d) in files.iter().zip(digests) {
        assert_eq!(&hex(&fs::read(f).expect("gguf")), d, "{}", f.display());
    }
}

#[test]
fn gguf_files_pack_to_their_tensors_bytes() {
    let tmp = tempfile::tempdir().expect("tmp");
    for (preset, kind, split, tied) in [
        ("llama-tiny-f32", "f32", None, false),
        ("llama-tiny-f32", "q4_0", None, false),
        ("qwen2-tiny-f32", "q8_0", None, true),
        ("llama-tiny-f16", "f16", Some(7), false),
        ("qwen2-tiny-bf16", "q4_0", Some(9), true),
    ] {
        let (arg, files) = gguf(tmp.path(), preset, kind, split);
        let out = tmp.path().join(format!("out-{preset}-{kind}"));
        let r = packs(&arg, &out, &["--json"], preset);
        check(&out, &files, tied);
        let report = json_report(&r);
        assert!(
            report["quantized"].as_array().expect("list").is_empty(),
            "nothing re-quantized"
        );
    }
}

#[test]
fn bad_gguf_inputs_fail_cleanly() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (file, _) = gguf(tmp.path(), "llama-tiny-f32", "q8_0", None);
    let good = fs::read(&file).expect("gguf");
    let out = tmp.path().join("out");
    let bad = tmp.path().join("bad");
    fs::create_dir_all(&bad).expect("dir");
    let case = |name: &str, bytes: &[u8], must: &[&str]| {
        let p = bad.join(name);
        fs::write(&p, bytes).expect("write");
        let mut want = vec![p.to_str().expect("utf8")];
        want.extend(must);
        fails(&p, &out, &[], &want);
        fs::remove_file(&p).expect("rm");
    };
    let mut magic = good.clone();
    magic[0] = b'X';
    case("magic.gguf", &magic, &["bad magic"]);
    let mut version = good.clone();
    version[4] = 9;
    case("version.gguf", &version, &["unsupported GGUF version 9"]);
    case(
        "short.gguf",
        &good[..100],
        &["the tensor count is 21: that many cannot fit in the 84 bytes left"],
    );
    case(
        "tiny.gguf",
        &good[..6],
        &["truncated: the version needs 4 bytes, 2 are left"],
    );
    case(
        "cut.gguf",
        &good[..good.len() - 100],
        &["past the end of the"],
    );
    let mut count = good.clone();
    count[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    case(
        "count.gguf",
        &count,
        &["the tensor count is 18446744073709551615"],
    );
    // an unknown type code: the tensor named
    let g = gkq_format::gguf::Gguf::parse(&good).expect("parse");
    let first = &g.tensors[0];
    let infos = g.kv_bytes.1 as usize;
    let name_len = first.name.len();
    let type_at = infos + 8 + name_len + 4 + 8 * first.shape.len();
    let mut code = good.clone();
    code[type_at..type_at + 4].copy_from_slice(&11u32.to_le_bytes());
    case(
        "type.gguf",
        &code,
        &[&format!(
            "GGUF tensor {:?}: Q3_K is not a type a knot holds",
            first.name
        )],
    );
    // two GGUFs in a directory: name one
    let two = tmp.path().join("two");
    fs::create_dir_all(&two).expect("dir");
    fs::write(two.join("a.gguf"), &good).expect("a");
    fs::write(two.join("b.gguf"), &good).expect("b");
    fails(
        &two,
        &out,
        &[],
        &["2 GGUF files (a.gguf, b.gguf): name the one to pack"],
    );
    // a missing shard
    let (dir, files) = gguf(tmp.path(), "llama-tiny-f32", "f32", Some(7));
    fs::remove_file(&files[1]).expect("rm shard");
    fails(
        &dir,
        &out,
        &[],
        &["shard model-00002-of-00003.gguf of model-00001-of-00003.gguf is missing"],
    );
}

#[test]
fn an_architecture_gkq_decode_does_not_run_still_packs() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (file, _) = gguf(tmp.path(), "llama-tiny-f32", "q8_0", None);
    let bytes = fs::read(&file).expect("gguf");
    let phi = fixtures::gguf::with_architecture(&bytes, "phi2").expect("phi2");
    let phi_path = tmp.path().join("phi.gguf");
    fs::write(&phi_path, phi).expect("write");
    let out = tmp.path().join("out");
    packs(&phi_path, &out, &[], "phi2");
    assert!(out.join("metadata.gguf").is_file());
    assert!(
        !out.join("config.json").exists(),
        "no config.json for an architecture gkq-decode does not run"
    );
}

/// Issue 42, item 4: a 64 MiB metadata array costs about its bytes, not
/// ~35 bytes of memory per byte (2.2 GB before): gkq-pack packs it under
/// half a GiB of peak RSS, and its metadata comes back whole.
#[test]
fn a_large_metadata_array_costs_its_bytes() {
    use gkq_format::gguf::{GgufArray, GgufValue};
    let tmp = tempfile::tempdir().expect("tmp");
    let (file, _) = gguf(tmp.path(), "llama-tiny-f32", "q8_0", None);
    let big = fixtures::gguf::with_kv(&fs::read(&file).expect("gguf"), |kv| {
        kv.push((
            "x.big".into(),
            GgufValue::Array(GgufArray::U8(vec![7; 64 << 20])),
        ));
        let strings: gkq_format::gguf::GgufStrings = (0..1 << 20)
            .map(|_| "ab")
            .collect::<Vec<_>>()
            .into_iter()
            .collect();
        kv.push((
            "x.strings".into(),
            GgufValue::Array(GgufArray::Str(strings)),
        ));
    })
    .expect("with an array");
    let path = tmp.path().join("big.gguf");
    fs::write(&path, &big).expect("write");
    let out = tmp.path().join("out");
    let r = packs(&path, &out, &["--json"], "a GGUF with a 64 MiB array");
    let rss = json_report(&r)["peak_rss_bytes"]
        .as_u64()
        .expect("peak RSS");
    assert!(rss < 512 << 20, "peak RSS {rss} for a {} B GGUF", big.len());
    let meta = fs::read(out.join("metadata.gguf")).expect("metadata");
    let g = gkq_format::gguf::Gguf::parse(&meta).expect("metadata parses");
    let arr = g.get("x.big").and_then(GgufValue::as_array).expect("x.big");
    assert_eq!((arr.len(), arr.u64_at(12345)), (64 << 20, Some(7)));
}

/// Issue 42, item 8: shards whose split.* keys contradict the file set
/// are refused as llama.cpp refuses them, naming the shard and the key.
#[test]
fn contradicting_shards_are_refused_by_shard_and_key() {
    use gkq_format::gguf::GgufValue;
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("out");
    let (dir, files) = gguf(tmp.path(), "llama-tiny-f32", "f32", Some(7));
    let edit = |i: usize, key: &str, v: Option<GgufValue>| {
        let good = fs::read(&files[i]).expect("shard");
        let bad = fixtures::gguf::with_kv(&good, |kv| {
            kv.retain(|(k, _)| k != key);
            if let Some(v) = v {
                kv.push((key.to_owned(), v));
            }
        })
        .expect("edit");
        fs::write(&files[i], bad).expect("write");
        good
    };
    let shard = |i: usize| {
        files[i]
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned()
    };
    for (i, key, v, must) in [
        (
            1,
            "split.no",
            Some(GgufValue::U16(2)),
            "split.no is 2, but this is shard 2 of 3",
        ),
        (
            0,
            "split.count",
            Some(GgufValue::U16(4)),
            "split.count is 4, but there are 3 shards",
        ),
        (
            2,
            "split.count",
            Some(GgufValue::U16(2)),
            "split.count is 2, but there are 3 shards",
        ),
        (
            0,
            "split.tensors.count",
            Some(GgufValue::I32(5)),
            "split.tensors.count is 5, but the shards hold",
        ),
        (1, "split.no", None, "split.no is missing"),
    ] {
        let good = edit(i, key, v);
        fails(&dir, &out, &[], &[&shard(i), must]);
        fs::write(&files[i], good).expect("restore");
    }
    // one shard alone under another name: one of three
    let alone = tmp.path().join("alone.gguf");
    fs::copy(&files[0], &alone).expect("copy");
    fails(
        &alone,
        &out,
        &[],
        &[
            "alone.gguf",
            "split.count is 3: this file is one of 3 shards",
        ],
    );
}

/// Issue 42, item 9: an embedding with a zero dimension is refused naming
/// the file, the tensor and its shape (not "--dtype: … no rows to prove").
#[test]
fn a_zero_row_embedding_is_refused_by_name() {
    use gkq_format::gguf::{GgufTensorOut, encode_kv, padding, write_gguf};
    let tmp = tempfile::tempdir().expect("tmp");
    let (file, _) = gguf(tmp.path(), "llama-tiny-f32", "f32", None);
    let g = gkq_format::gguf::Gguf::parse(&fs::read(&file).expect("gguf")).expect("parse");
    let bytes = fs::read(&file).expect("gguf");
    let shapes: Vec<Vec<u64>> = g
        .tensors
        .iter()
        .map(|t| match t.name.as_str() {
            "token_embd.weight" => vec![0, t.shape[1]],
            _ => t.shape.clone(),
        })
        .collect();
    let outs: Vec<GgufTensorOut<'_>> = g
        .tensors
        .iter()
        .zip(&shapes)
        .map(|(t, shape)| GgufTensorOut {
            name: &t.name,
            shape,
            dtype: t.dtype,
            len: if shape[0] == 0 { 0 } else { t.len },
        })
        .collect();
    let kv = encode_kv(&g.kv);
    let mut out =
        write_gguf(g.version, (g.kv.len() as u64, &kv), &outs, g.alignment).expect("header");
    for (t, o) in g.tensors.iter().zip(&outs) {
        let start = t.offset as usize;
        out.extend(&bytes[start..start + o.len as usize]);
        out.extend(vec![0u8; padding(o.len, g.alignment)]);
    }
    let path = tmp.path().join("zero.gguf");
    fs::write(&path, out).expect("write");
    let e = fails(
        &path,
        &tmp.path().join("out"),
        &[],
        &["zero.gguf", "\"token_embd.weight\"", "a zero dimension"],
    );
    assert!(!e.contains("--dtype"), "{e}");
}

/// A rope scaling or an activation the architecture's row does not
/// implement (issue 56) is refused, naming the key, from safetensors and
/// from a GGUF, and nothing is written: a node would decode wrong text.
#[test]
fn a_rope_scaling_or_activation_gkq_decode_lacks_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("out");
    let set = |src: &Path, key: &str, value: serde_json::Value| {
        let path = src.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_slice(&fs::read(&path).expect("config")).expect("json");
        cfg[key] = value;
        fs::write(&path, serde_json::to_vec(&cfg).expect("json")).expect("write");
    };
    let src = model(tmp.path(), "llama-tiny-f32");
    set(&src, "hidden_act", serde_json::json!("relu"));
    fails(
        &src,
        &out,
        &[],
        &["config.json", r#"hidden_act is "relu""#, "silu"],
    );
    set(&src, "hidden_act", serde_json::json!("silu"));
    let yarn = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
    set(&src, "rope_scaling", yarn);
    fails(&src, &out, &[], &["rope_scaling is {", "yarn"]);
    // the GGUFs llama.cpp's converter writes of such configs
    let gguf_of = |name: &str| {
        let file = tmp.path().join(format!("{name}.gguf"));
        fixtures::gguf::write(&src, &file, "f32", None).expect("gguf-py");
        file
    };
    let file = gguf_of("yarn");
    fails(&file, &out, &[], &["llama.rope.scaling.type", "\"yarn\""]);
    let llama3 = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
    set(&src, "rope_scaling", llama3);
    let file = gguf_of("llama3");
    fails(&file, &out, &[], &["rope_freqs.weight", "Llama 3"]);
    // no scaling, by either spelling, packs
    set(&src, "rope_scaling", serde_json::json!({"type": "default"}));
    packs(&src, &out, &["--quiet"], "rope_type default");
}
