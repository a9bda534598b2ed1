//! Bad input fails cleanly and says what to do: configs, safetensors,
//! shards, roles, model ids, arguments, aliases and the help.

use super::*;

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
        &["\"int8\" is not a row dtype: f32, f16, bf16"],
    );
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
        text.contains("Examples:")
            && text.contains("gkq-pack <MODEL_DIR|MODEL.gguf> --out <OUT_DIR>"),
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

/// A mistyped `.gguf` path is a missing GGUF file, with the GGUF files
/// beside it (issue 47 item 9), not a missing model directory; with
/// `--json`, the failure is one JSON object naming the file.
#[test]
fn a_mistyped_gguf_path_lists_the_gguf_files_beside_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    fs::write(tmp.path().join("SmolLM2-135M.Q4_1.gguf"), b"GGUF").expect("write");
    let out = tmp.path().join("out");
    let typo = tmp.path().join("SmolLM2-135M.Q4_l.gguf");
    let err = fails(
        &typo,
        &out,
        &[],
        &[
            "no such GGUF file",
            "the .gguf files in",
            "SmolLM2-135M.Q4_1.gguf",
        ],
    );
    assert!(!err.contains("no such directory"), "{err}");
    let r = run(&[
        typo.to_str().expect("utf-8"),
        "--out",
        out.to_str().expect("utf-8"),
        "--json",
    ]);
    assert_eq!(r.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&r.stderr).expect("one JSON object");
    assert_eq!(v["tool"], "gkq-pack");
    assert_eq!(v["error"]["kind"], "NoGgufFile", "{v}");
    assert_eq!(v["error"]["file"], typo.to_str().expect("utf-8"), "{v}");
}

/// Issue 57, J10 and J14: every file of the model directory is opened as a
/// bounded regular file: a config.json past its 4 MiB limit, or a FIFO, a
/// safetensors index that is a device, a hub cache's refs/main that is a
/// FIFO, and a companion that is a FIFO or a link to a device are each
/// refused by name, at once (none hangs, none is parsed whole, none is
/// left out with exit 0).
#[test]
fn every_input_file_is_a_bounded_regular_file() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("out");
    let within = |args: &[&str]| fixtures::output_within(bin().args(args), 30);
    let refused = |src: &Path, needles: &[&str]| {
        let o = within(&[
            src.to_str().expect("utf8"),
            "--out",
            out.to_str().expect("utf8"),
        ]);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "{needles:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{n:?} missing from {err}");
        }
        assert!(!out.join("model.knot").exists());
    };
    // a 5 MiB config.json: refused before it is parsed
    let src = model(tmp.path(), "qwen2-tiny-f32");
    let cfg = fs::read_to_string(src.join("config.json")).expect("config");
    let big = cfg.replacen('{', &format!("{{\"pad\": \"{}\",", "x".repeat(5 << 20)), 1);
    fs::write(src.join("config.json"), big).expect("write");
    refused(
        &src,
        &[
            "config.json",
            "over the limit of 4194304 bytes for a config.json",
        ],
    );
    fs::remove_file(src.join("config.json")).expect("rm");
    fixtures::fifo(&src.join("config.json"));
    refused(&src, &["config.json", "a FIFO, not a regular file"]);
    // companions: a FIFO, a link to a device
    let src = model(&tmp.path().join("c"), "qwen2-tiny-f32");
    fixtures::fifo(&src.join("tokenizer.json"));
    refused(&src, &["tokenizer.json", "a FIFO, not a regular file"]);
    fs::remove_file(src.join("tokenizer.json")).expect("rm");
    std::os::unix::fs::symlink("/dev/zero", src.join("tokenizer_config.json")).expect("link");
    refused(
        &src,
        &["tokenizer_config.json", "a device, not a regular file"],
    );
    // a shard index that is a link to a device
    let src = model(&tmp.path().join("s"), "qwen2-tiny-f32-sharded");
    fs::remove_file(src.join("model.safetensors.index.json")).expect("rm");
    std::os::unix::fs::symlink("/dev/zero", src.join("model.safetensors.index.json"))
        .expect("link");
    refused(&src, &["model.safetensors.index.json", "a device"]);
    // the hub cache's refs/main as a FIFO
    let hub = tmp.path().join("hub");
    let repo = hub.join("models--acme--fifo");
    fs::create_dir_all(repo.join("refs")).expect("refs");
    fixtures::fifo(&repo.join("refs/main"));
    let o = fixtures::output_within(
        bin()
            .args(["acme/fifo", "--out", out.to_str().expect("utf8")])
            .env("HF_HUB_CACHE", &hub),
        30,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("refs/main") && err.contains("a FIFO"), "{err}");
}

/// Issue 56: the type names `--help` lists are the tables' (the block
/// types of gkq-format, llama-quantize's file types of the presets), so a
/// type added to a table and not to the help fails here.
#[test]
fn help_lists_the_types_of_the_tables() {
    let r = run(&["--help"]);
    let help = String::from_utf8_lossy(&r.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let between = |from: &str, to: &str| -> Vec<String> {
        let at = help
            .find(from)
            .unwrap_or_else(|| panic!("{from:?} in --help:\n{help}"))
            + from.len();
        let rest = &help[at..];
        rest[..rest.find(to).expect("end")]
            .split(',')
            .map(|n| n.trim().to_owned())
            .collect()
    };
    let blocks = between("block types (FORMAT.md 3.5): ", ";");
    assert_eq!(blocks.join(", "), gkq_format::DType::quantized_names());
    let presets = between("file types (case-insensitive): ", ", with");
    assert!(
        help.contains("Q4_K is Q4_K_M") && help.contains("--pure"),
        "{help}"
    );
    assert_eq!(presets, gkq_pack::preset_names());
}
