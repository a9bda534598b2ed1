//! The package as a whole: --force, the atomic commit, a full disk, the
//! companion files, the pinned digests and the second (Python) writer.

use super::*;

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

/// Issue 58: `--force` over a signed package. The same knot again keeps
/// its model.sig; another knot removes it and says to re-sign (a kept one
/// would make every node with --trust-key refuse the package).
#[test]
fn force_over_a_signed_package_removes_a_stale_signature() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-bf16");
    let out = tmp.path().join("out");
    packs(&src, &out, &["--quiet"], "first");
    let sig = out.join("model.sig");
    fs::write(&sig, "a signature of this knot").expect("write");
    let r = packs(&src, &out, &["--force", "--json"], "the same knot");
    assert_eq!(json_report(&r)["stale_signature"], false);
    assert!(sig.exists(), "the same knot keeps its signature");
    let r = packs(&src, &out, &["--force", "--dtype", "bf16"], "another knot");
    // the report's lines go to stderr, as cargo's do
    let text = String::from_utf8_lossy(&r.stderr);
    assert!(
        text.contains("removed the replaced package's model.sig, which signed another knot: re-sign with gkq-sign"),
        "{text}"
    );
    assert!(!sig.exists(), "a stale signature is not carried over");
}

/// Issue 58: the report ends with the package's size against the input's.
#[test]
fn the_report_ends_with_the_package_size() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-bf16");
    let out = tmp.path().join("out");
    let r = packs(&src, &out, &[], "pack");
    let text = String::from_utf8_lossy(&r.stderr);
    let last = text.lines().last().expect("a line");
    let on_disk: u64 = fs::read_dir(&out)
        .expect("out")
        .map(|e| e.expect("entry").metadata().expect("meta").len())
        .sum();
    assert!(
        last.starts_with(&format!("package {on_disk} bytes from ")),
        "{last}"
    );
    assert!(last.ends_with("x)"), "{last}");
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

/// The crash tests' child: this test binary run again with
/// `GKQ_TEST_KILL_BEFORE=STEP`, `GKQ_TEST_SRC` and `GKQ_TEST_OUT`: packs
/// with a commit hook that aborts before `STEP` (like a kill).
fn killed_child() {
    let (Ok(step), Ok(src), Ok(out)) = (
        std::env::var("GKQ_TEST_KILL_BEFORE"),
        std::env::var("GKQ_TEST_SRC"),
        std::env::var("GKQ_TEST_OUT"),
    ) else {
        return;
    };
    fn abort_at(step: gkq_pack::CommitStep) {
        if std::env::var("GKQ_TEST_KILL_BEFORE").is_ok_and(|v| v == step.name()) {
            std::process::abort();
        }
    }
    gkq_pack::set_commit_hook(abort_at);
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    opts.force = true;
    opts.dtypes = vec![gkq_format::DType::BF16, gkq_format::DType::F16];
    let r = gkq_pack::pack(&opts, &gkq_pack::NoProgress);
    panic!("the hook did not abort before {step}: {:?}", r.map(|_| ()));
}

/// A run killed between any two steps of the commit leaves a complete old
/// or new package in OUT_DIR, and the next run cleans up after it.
#[test]
fn killed_commit_leaves_a_complete_old_or_new_package() {
    killed_child();
    let tmp = tempfile::tempdir().expect("tmp");
    let src = model(tmp.path(), "qwen2-tiny-bf16");
    for step in gkq_pack::CommitStep::ALL {
        let out = tmp.path().join(format!("out-{}", step.name()));
        packs(&src, &out, &["--quiet", "--dtype", "f32"], "old package");
        fs::write(out.join("notes.txt"), "mine").expect("write");
        let old = complete_package(&out).expect("old package complete");
        let r = Command::new(std::env::current_exe().expect("this test binary"))
            .args([
                "--exact",
                "package::killed_commit_leaves_a_complete_old_or_new_package",
                "--nocapture",
            ])
            .env("GKQ_TEST_KILL_BEFORE", step.name())
            .env("GKQ_TEST_SRC", &src)
            .env("GKQ_TEST_OUT", &out)
            .output()
            .expect("run");
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(
            r.status.signal(),
            Some(6),
            "{}: the hook aborted: {}",
            step.name(),
            String::from_utf8_lossy(&r.stderr)
        );
        let now = complete_package(&out)
            .unwrap_or_else(|e| panic!("killed before {}: incomplete package: {e}", step.name()));
        let is_new = now != old;
        let expect_new = !matches!(
            step,
            gkq_pack::CommitStep::Carry | gkq_pack::CommitStep::Swap
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
/// never the side effect of a faster or more parallel pack. The first case
/// keeps the blocks in the knot (`--knot-holds-blocks`, the version 3
/// layout), the second is the default (version 5: a role block stored in
/// its row file, FORMAT.md 7e; its rows' proofs have height 0, so no
/// record moves and only the knot differs from version 3's).
#[test]
fn packed_digests_are_pinned() {
    type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)]);
    let cases: [Case<'_>; 2] = [
        (
            "committed",
            &["--dtype", "f32", "--dtype", "bf16", "--knot-holds-blocks"],
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
                    "89d949100ab0616f8de462f3aaf5058301391fe8e3c77f1b827ce5ab9030ac94",
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
        // both layouts: version 5 (the default) and, for the sharded
        // model, the blocks in the knot too
        let dtypes: &[&str] = match i {
            1 => &[
                "--dtype",
                "bf16",
                "--dtype",
                "f32",
                "--dtype",
                "f16",
                "--knot-holds-blocks",
            ],
            _ => &["--dtype", "bf16", "--dtype", "f32", "--dtype", "f16"],
        };
        let ours = tmp.path().join(format!("ours{i}"));
        packs(src, &ours, &[dtypes, &["--quiet"]].concat(), "gkq-pack");
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
