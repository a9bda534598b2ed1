//! `gkq-export --gguf` (issue 30): a knot packed from a GGUF gives back the
//! GGUF (byte for byte when it was written canonically, as gguf-py does,
//! and as gguf-py reads it when it came in shards); a remote knot is a
//! verified download into GGUF, its blocks from the disk cache the second
//! time; a knot packed from safetensors gets llama.cpp's layout, the same
//! tensors gguf-py's conversion of the source writes; bad cases leave
//! nothing behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use fixtures::servers::{Nginx, NginxOptions};

fn export(args: &[&str]) -> Output {
    fixtures::tool(env!("CARGO_BIN_EXE_gkq-export"))
        .args(args)
        .output()
        .expect("run gkq-export")
}

fn ok(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("json")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8")
}

/// `preset` written as a GGUF of `kind` (shards of `split` tensors) under
/// `dir/gguf`, then packed into `dir/www/m`: `(the GGUF files, the package)`.
fn packed_gguf(
    dir: &Path,
    preset: &str,
    kind: &str,
    split: Option<usize>,
) -> (Vec<PathBuf>, PathBuf) {
    let src = dir.join("model");
    fixtures::write_model(&src, &fixtures::preset(preset).expect("preset")).expect("fixture");
    let g = dir.join("gguf");
    fs::create_dir_all(&g).expect("dir");
    let files = fixtures::gguf::write(&src, &g.join("model.gguf"), kind, split).expect("gguf-py");
    let out = dir.join("www/m");
    let arg = if split.is_some() { g } else { files[0].clone() };
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(&arg, &out),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    (files, out)
}

#[test]
fn a_gguf_born_knot_gives_its_gguf_back() {
    for (preset, kind, tied) in [
        ("llama-tiny-f32", "q4_0", false),
        ("qwen2-tiny-f32", "q8_0", true),
        ("llama-tiny-f16", "f16", false),
    ] {
        let tmp = tempfile::tempdir().expect("tmp");
        let (files, out) = packed_gguf(tmp.path(), preset, kind, None);
        let back = tmp.path().join("back.gguf");
        let r = ok(&export(&[
            "--gguf",
            s(&back),
            s(&out),
            "--no-cache",
            "--json",
        ]));
        assert_eq!(r["fetched_bytes"], 0, "a local knot");
        assert!(
            fs::read(&back).expect("back") == fs::read(&files[0]).expect("source"),
            "{preset} {kind} (tied {tied}): the same bytes"
        );
        let theirs = fixtures::gguf::dump(&[back]).expect("gguf-py");
        assert_eq!(theirs, fixtures::gguf::dump(&files).expect("gguf-py"));
    }
}

#[test]
fn shards_come_back_as_one_file_gguf_py_reads_as_the_same_model() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (files, out) = packed_gguf(tmp.path(), "qwen2-tiny-bf16", "q4_0", Some(9));
    assert_eq!(files.len(), 3);
    let back = tmp.path().join("back.gguf");
    ok(&export(&[
        "--gguf",
        s(&back),
        s(&out),
        "--no-cache",
        "--json",
    ]));
    let mut theirs = fixtures::gguf::dump(&files).expect("gguf-py");
    let ours = fixtures::gguf::dump(&[back]).expect("gguf-py");
    // one file: the shards' split.* keys are dropped, the rest is the same
    let meta = theirs["metadata"].as_object_mut().expect("metadata");
    meta.retain(|k, _| !k.starts_with("split."));
    assert_eq!(ours, theirs);
}

#[test]
fn a_remote_export_is_a_verified_download_and_the_cache_serves_it_again() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (files, _) = packed_gguf(tmp.path(), "llama-tiny-f32", "q8_0", None);
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let url = format!("{}/m/model.knot", nginx.url());
    let cache = tmp.path().join("cache");
    let run = |out: &Path| {
        ok(&export(&[
            "--gguf",
            s(out),
            &url,
            "--cache-dir",
            s(&cache),
            "--json",
        ]))
    };
    let first = run(&tmp.path().join("a.gguf"));
    assert!(
        first["fetched_bytes"].as_u64().expect("bytes") > 60_000,
        "{first}"
    );
    let second = run(&tmp.path().join("b.gguf"));
    // the header is asked for again (the knot is not pinned); no block is
    let again = second["fetched_bytes"].as_u64().expect("bytes");
    assert!(again < 16_384, "{again} bytes the second time");
    for f in ["a.gguf", "b.gguf"] {
        assert!(
            fs::read(tmp.path().join(f)).expect("gguf") == fs::read(&files[0]).expect("source")
        );
    }
    // a damaged block on the server: refused, nothing written
    let knot = tmp.path().join("www/m/model.knot");
    let mut bytes = fs::read(&knot).expect("knot");
    let n = bytes.len();
    bytes[n - 40] ^= 0x10;
    fs::write(&knot, bytes).expect("write");
    let out = tmp.path().join("c.gguf");
    let o = export(&["--gguf", s(&out), &url, "--no-cache"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("sha256") || err.contains("digest"), "{err}");
    assert!(!out.exists());
    assert!(!fs::read_dir(tmp.path()).expect("dir").any(|e| {
        e.expect("e")
            .file_name()
            .to_string_lossy()
            .contains("gkq-tmp")
    }));
}

/// The tensors of a gguf-py dump, sorted by name.
fn tensors_by_name(d: &serde_json::Value) -> Vec<serde_json::Value> {
    let mut v: Vec<serde_json::Value> = d["tensors"].as_array().expect("tensors").clone();
    v.sort_by_key(|t| t["name"].as_str().expect("name").to_owned());
    v
}

/// A preset packed from safetensors with `configure`d options, exported
/// with `--gguf`: the export's report, then gguf-py's dumps of the export
/// and of gguf-py's own conversion of the source to `outtype`.
fn export_against_gguf_py(
    preset: &str,
    configure: impl FnOnce(&mut gkq_pack::PackOptions),
    outtype: &str,
) -> [serde_json::Value; 3] {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    fixtures::write_model(&src, &fixtures::preset(preset).expect("preset")).expect("fixture");
    let out = tmp.path().join("pkg");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    configure(&mut opts);
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let back = tmp.path().join("back.gguf");
    let r = ok(&export(&[
        "--gguf",
        s(&back),
        s(&out),
        "--no-cache",
        "--json",
    ]));
    let reference =
        fixtures::gguf::write(&src, &tmp.path().join("ref.gguf"), outtype, None).expect("gguf-py");
    let ours = fixtures::gguf::dump(&[back]).expect("gguf-py");
    let theirs = fixtures::gguf::dump(&reference).expect("gguf-py");
    [r, ours, theirs]
}

#[test]
fn a_safetensors_knot_gets_llama_cpps_layout() {
    // gguf-py's conversion of the same source, quantized the same way
    let [r, ours, theirs] = export_against_gguf_py(
        "llama-tiny-f32",
        |o| {
            o.quant.weights = Some(gkq_format::DType::Q4_0);
            o.quant.output = Some(gkq_format::DType::Q4_0);
        },
        "q4_0",
    );
    assert_eq!(r["metadata_from"], "derived from config.json");
    assert_eq!(
        tensors_by_name(&ours),
        tensors_by_name(&theirs),
        "the same tensors, q/k permuted as llama.cpp's"
    );
    for k in [
        "llama.block_count",
        "llama.embedding_length",
        "llama.attention.head_count_kv",
        "llama.rope.freq_base",
    ] {
        assert_eq!(ours["metadata"][k], theirs["metadata"][k], "{k}");
    }
}

/// Issue 44: a safetensors-born package in f16 exports as llama.cpp's
/// converter writes it (gguf-py's conversion here): the 1-D tensors (norms)
/// widened exactly to F32, which llama.cpp's CPU kernels need; the rest as
/// they are.
#[test]
fn a_half_precision_package_exports_its_norms_as_f32() {
    let [_, ours, theirs] = export_against_gguf_py(
        "llama-tiny-f16",
        |o| o.dtypes = vec![gkq_format::DType::F16],
        "f16",
    );
    let (ours, theirs) = (tensors_by_name(&ours), tensors_by_name(&theirs));
    assert!(
        ours.iter()
            .any(|t| t["name"] == "output_norm.weight" && t["type"] == "F32"),
        "{ours:?}"
    );
    assert_eq!(ours, theirs, "the same tensors, types and bytes");
}

#[test]
fn bad_exports_leave_nothing_behind() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (_, out) = packed_gguf(tmp.path(), "llama-tiny-f32", "q8_0", None);
    // an existing file is kept unless --force
    let back = tmp.path().join("back.gguf");
    fs::write(&back, b"keep").expect("write");
    let o = export(&["--gguf", s(&back), s(&out), "--no-cache"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists (pass --force"));
    assert_eq!(fs::read(&back).expect("kept"), b"keep");
    ok(&export(&[
        "--gguf",
        s(&back),
        s(&out),
        "--no-cache",
        "--force",
        "--json",
    ]));
    // a package of an architecture with no llama.cpp mapping
    let bert = tmp.path().join("bert");
    fixtures::write_model(
        &tmp.path().join("bsrc"),
        &fixtures::preset("bert-tiny-f32").expect("preset"),
    )
    .expect("fixture");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(tmp.path().join("bsrc"), &bert),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    let target = tmp.path().join("bert.gguf");
    let o = export(&["--gguf", s(&target), s(&bert), "--no-cache"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("model_type \"bert\"") && err.contains("llama and qwen2"),
        "{err}"
    );
    assert!(!target.exists());
}

/// Issue 57, J4: with two mirrors serving wrong bytes of the right length
/// and a healthy origin, every export succeeds (5 of 5): bytes a mirror
/// served that fail their check are fetched again, the origin last,
/// however many reads at once found the same mirror bad.
#[test]
fn an_export_past_two_bad_mirrors_reaches_the_origin_every_time() {
    let tmp = tempfile::tempdir().expect("tmp");
    // a real model: blocks of several parts, many reads at once
    let gguf = fixtures::smollm2();
    let pkg = tmp.path().join("www/m");
    gkq_pack::pack(
        &gkq_pack::PackOptions::new(&gguf, &pkg),
        &gkq_pack::NoProgress,
    )
    .expect("pack");
    let files = [gguf];
    let nginx = |root: &Path, name: &str| {
        Nginx::start(
            root,
            &tmp.path().join(format!("nginx-{name}")),
            &NginxOptions::default(),
        )
        .expect("nginx")
    };
    let origin = nginx(&tmp.path().join("www"), "origin");
    let bad: Vec<Nginx> = (0..2)
        .map(|i| {
            let root = tmp.path().join(format!("bad{i}"));
            fs::create_dir_all(root.join("m")).expect("dir");
            for e in fs::read_dir(&pkg).expect("pkg") {
                let e = e.expect("entry");
                fs::copy(e.path(), root.join("m").join(e.file_name())).expect("copy");
            }
            // a byte in every 4 KiB of every object (the knot's header
            // left alone): every block and companion is wrong
            for e in fs::read_dir(root.join("m")).expect("copy") {
                let f = e.expect("entry").path();
                let mut b = fs::read(&f).expect("object");
                let from = if f.ends_with("model.knot") {
                    64 << 10
                } else {
                    0
                };
                for at in (from..b.len()).step_by(4096) {
                    b[at] ^= 0x40;
                }
                fs::write(&f, b).expect("write");
            }
            nginx(&root, &format!("bad{i}"))
        })
        .collect();
    let url = format!("{}/m/model.knot", origin.url());
    for run in 0..5 {
        let out = tmp.path().join(format!("back{run}.gguf"));
        let mut args = vec!["--gguf".to_owned(), s(&out).to_owned(), url.clone()];
        for b in &bad {
            args.extend(["--mirror".to_owned(), format!("{}/m/", b.url())]);
        }
        args.extend(["--no-cache".to_owned(), "--json".to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(&export(&args));
        assert!(
            fs::read(&out).expect("back") == fs::read(&files[0]).expect("source"),
            "run {run}: the GGUF back"
        );
    }
}
