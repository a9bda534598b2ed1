//! `--analyze` and `--spectral`: ranks, errors, determinism, refusals,
//! and the real all-MiniLM-L6-v2 weights.

use super::*;

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

/// Issue 14 on real weights: `--analyze` of all-MiniLM-L6-v2 finds what
/// docs/BENCHMARKS.md records (its attention projections are not
/// low-rank), and `--spectral` packs its query and key projections with
/// the ranks and errors recorded there.
#[test]
fn real_minilm_analyze_and_spectral() {
    let src = fixtures::minilm();
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
