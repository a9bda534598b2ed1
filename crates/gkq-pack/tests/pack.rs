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
    assert_eq!(
        v["knot"]["sha256"].as_str().expect("hex"),
        gkq_format::hex(&sha(&fs::read(out.join("model.knot")).expect("knot")))
    );
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
        let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(&out)
            .expect("out")
            .map(|e| {
                let p = e.expect("e").path();
                (
                    p.file_name().expect("name").to_string_lossy().into_owned(),
                    fs::read(&p).expect("read"),
                )
            })
            .collect();
        files.sort();
        outs.push(files);
    }
    assert_eq!(outs[0].len(), 5, "knot + 2 roles x 2 dtypes");
    assert!(outs[0] == outs[1], "two packs differ");
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
    fails(&src, &out, &[], &["config.json", "cannot read"]);
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
    // a crashed earlier run left a temp file: --force cleans it and packs
    fs::write(out.join(".model.knot.gkq-tmp"), "partial").expect("write");
    fs::write(out.join("token_embd.f16.rows"), "stale").expect("write");
    packs(&src, &out, &["--force", "--quiet"], "pack --force");
    assert!(!out.join(".model.knot.gkq-tmp").exists());
    assert!(
        !out.join("token_embd.f16.rows").exists(),
        "stale row file removed"
    );
    assert!(out.join("keep.txt").exists());
    check_pack(&src, &out, &[DType::F32], true);
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
    fails(&src, &out, &[], &["No space left on device", "out/"]);
    assert!(!out.exists(), "created output directory removed");
}
