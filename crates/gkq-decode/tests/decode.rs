//! Issue 11: a decode through the reader is bit-identical to a fully dense
//! local load: the same tokens and the same logits at every step, with the
//! embedding read as verified columnar rows over nginx, cold and warm, for
//! every row-file dtype choice; and two chained stages equal one.

use std::path::{Path, PathBuf};

use fixtures::servers::{Nginx, NginxOptions};
use gkq_decode::{Generation, Stage, StageRoles, generate};
use gkq_format::DType;
use gkq_reader::ReaderConfig;

const PROMPT: [u32; 6] = [5, 17, 300, 17, 42, 500];
const NEW: usize = 6;

struct Served {
    _tmp: tempfile::TempDir,
    out: PathBuf,
    nginx: Nginx,
}

impl Served {
    fn url(&self, name: &str) -> String {
        format!("{}/m/{name}", self.nginx.url())
    }
}

fn serve(src: &Path, dtypes: &[DType]) -> Served {
    serve_with(src, |o| o.dtypes = dtypes.to_vec())
}

fn serve_with(src: &Path, edit: impl FnOnce(&mut gkq_pack::PackOptions)) -> Served {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("www/m");
    let mut opts = gkq_pack::PackOptions::new(src, &out);
    edit(&mut opts);
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("start nginx (scripts/install-test-deps.sh)");
    Served {
        _tmp: tmp,
        out,
        nginx,
    }
}

fn fixture(tmp: &Path, preset: &str) -> PathBuf {
    let dir = tmp.join(preset);
    fixtures::write_model(&dir, &fixtures::preset(preset).expect("preset")).expect("fixture");
    dir
}

/// A fully dense decode of the local knot (`--dense`).
fn dense(s: &Served) -> Generation {
    let mut st = Stage::open(
        s.out.join("model.knot").to_str().expect("utf8"),
        ReaderConfig {
            dense: true,
            ..ReaderConfig::default()
        },
        StageRoles::All,
        None,
    )
    .expect("open");
    let g = generate(std::slice::from_mut(&mut st), &PROMPT, NEW).expect("dense decode");
    assert_eq!(g.resolutions[0].path, "dense");
    g
}

/// A remote decode with the embedding from the row file `embed_dtype`
/// (or the narrowest exact one), cold, then warm through the same reader.
fn columnar(s: &Served, embed_dtype: Option<DType>) -> (Generation, Generation) {
    let config = ReaderConfig {
        columnar_embed: Some(s.url("")),
        require_columnar: true,
        embed_dtype,
        ..ReaderConfig::default()
    };
    let mut st = Stage::open(&s.url("model.knot"), config, StageRoles::All, None).expect("open");
    let cold = generate(std::slice::from_mut(&mut st), &PROMPT, NEW).expect("cold decode");
    assert_eq!(
        cold.resolutions[0].path, "columnar",
        "{:?}",
        cold.resolutions
    );
    assert!(cold.bytes.knot_header > 0 && cold.bytes.other_blocks > 0 && cold.bytes.lm_head > 0);
    st.reset();
    // the cold decode's waits (its first layers came over the network)
    let before = st.waited().as_secs_f64() * 1e3;
    let warm = generate(std::slice::from_mut(&mut st), &PROMPT, NEW).expect("warm decode");
    assert_eq!(
        warm.bytes.embedding_rows, 0,
        "warm: every row from the cache or the resident matrix"
    );
    // a decode's prefill_wait_ms is its own: the weights were all in, so
    // the warm one's is not the cold one's waits again
    assert!(
        warm.prefill_wait_ms < before && warm.prefill_wait_ms <= warm.prefill_ms,
        "warm decode waited {} ms of a {} ms prefill; the stage had waited {before} ms before",
        warm.prefill_wait_ms,
        warm.prefill_ms
    );
    (cold, warm)
}

fn assert_same(a: &Generation, b: &Generation, what: &str) {
    assert_eq!(a.tokens, b.tokens, "{what}: tokens");
    assert_eq!(a.logits_sha256, b.logits_sha256, "{what}: logits bits");
}

#[test]
fn committed_tiny_qwen2_is_bit_identical_dense_and_columnar() {
    let src = fixtures::committed_tiny();
    // f32 block with f32 rows (the payload) and bf16 rows (not exact: forced)
    let s = serve(&src, &[DType::F32, DType::BF16]);
    let d = dense(&s);
    assert_eq!(d.tokens.len(), NEW);
    let (cold, warm) = columnar(&s, None);
    assert!(cold.resolutions[0].reason.contains("token_embd.f32.rows"));
    assert!(cold.bytes.embedding_rows > 0);
    assert_same(&d, &cold, "f32 rows, cold");
    assert_same(&d, &warm, "f32 rows, warm");
    // the check can fail: the bf16 rows of this f32 block are not exact,
    // and forcing them changes the logits
    let (lossy, _) = columnar(&s, Some(DType::BF16));
    assert_ne!(
        d.logits_sha256, lossy.logits_sha256,
        "inexact rows must show"
    );
    // bf16 block: the bf16 row file is its payload
    let s = serve(&src, &[DType::BF16]);
    let d = dense(&s);
    let (cold, warm) = columnar(&s, None);
    assert_same(&d, &cold, "bf16 rows of a bf16 block, cold");
    assert_same(&d, &warm, "bf16 rows of a bf16 block, warm");
}

#[test]
fn untied_llama_is_bit_identical_for_every_row_file() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = fixture(tmp.path(), "llama-tiny-bf16");
    // a bf16 source packed with f32 blocks: the bf16 rows are exact and
    // picked by default, the f32 rows are the blocks' own bytes
    let s = serve(&src, &[DType::F32, DType::BF16]);
    let d = dense(&s);
    for want in [None, Some(DType::F32), Some(DType::BF16)] {
        let (cold, warm) = columnar(&s, want);
        let file = match want {
            Some(DType::F32) => "token_embd.f32.rows",
            _ => "token_embd.bf16.rows",
        };
        assert!(
            cold.resolutions[0].reason.contains(file),
            "{:?}",
            cold.resolutions
        );
        assert!(cold.resolutions[1].reason.contains("lm_head.weight"));
        assert_same(&d, &cold, &format!("{want:?}, cold"));
        assert_same(&d, &warm, &format!("{want:?}, warm"));
    }
}

/// Issue 29: a quantized package (q4_k weights, a q8_0 embedding, the
/// default q6_k lm_head) loads as a bf16 one does, pipelined, verified and
/// cached: the same tokens and logits bits dense and columnar, cold and
/// warm, the quantized blocks run through the quantized matmul, the
/// lm_head pulled in its blocks.
#[test]
fn a_quantized_package_decodes_alike_dense_and_columnar() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = fixture(tmp.path(), "llama-tiny-k");
    let s = serve_with(&src, |o| {
        o.quant.weights = Some(DType::Q4_K);
        o.quant.token_embedding = Some(DType::Q8_0);
    });
    let d = dense(&s);
    let (cold, warm) = columnar(&s, None);
    assert!(
        cold.resolutions[0].reason.contains("token_embd.q8_0.rows"),
        "{:?}",
        cold.resolutions
    );
    assert_same(&d, &cold, "quantized, cold");
    assert_same(&d, &warm, "quantized, warm");
    // the lm_head moved as its q6_k blocks: 512 rows of one 210-byte super-block
    assert_eq!(cold.bytes.lm_head, 512 * 210);
    // and the quantized blocks are not the f32 model's: the logits differ
    let f = serve(&src, &[DType::F32]);
    assert_ne!(dense(&f).logits_sha256, d.logits_sha256);
}

/// Issue 30: a knot packed from a GGUF (gguf-py's conversion: llama.cpp's
/// names, Llama's q/k rows permuted for its rotary layout) decodes to the
/// tokens of the same model packed from safetensors and quantized the
/// same way, its embedding rows fetched over nginx and verified; a GGUF
/// of an architecture gkq-decode does not run packs, and decode says why.
#[test]
fn a_gguf_born_knot_decodes_as_its_safetensors_twin() {
    let tmp = tempfile::tempdir().expect("tmp");
    for (preset, kind, q) in [
        ("llama-tiny-f32", "q4_0", DType::Q4_0),
        ("qwen2-tiny-f32", "q8_0", DType::Q8_0),
        ("llama-tiny-f16", "f16", DType::F16),
    ] {
        let src = fixture(tmp.path(), preset);
        let file = tmp.path().join(format!("{preset}-{kind}.gguf"));
        fixtures::gguf::write(&src, &file, kind, None).expect("gguf-py");
        let g = serve_with(&file, |_| {});
        let twin = serve_with(&src, |o| {
            if q.is_quantized() {
                o.quant.weights = Some(q);
                o.quant.output = Some(q);
            } else {
                o.dtypes = vec![q];
            }
        });
        let (cold, warm) = columnar(&g, None);
        assert!(
            cold.resolutions[0]
                .reason
                .contains(&format!("token_embd.{}.rows", q.name())),
            "{:?}",
            cold.resolutions
        );
        let d = dense(&twin);
        assert_eq!(
            cold.tokens, d.tokens,
            "{preset} {kind}: GGUF-born against the safetensors twin"
        );
        assert_eq!(warm.tokens, d.tokens, "{preset} {kind}: warm");
    }
    // phi2: packs, and decode names the architecture
    let src = fixture(tmp.path(), "llama-tiny-f32");
    let file = tmp.path().join("llama.gguf");
    fixtures::gguf::write(&src, &file, "q8_0", None).expect("gguf-py");
    let phi = fixtures::gguf::with_architecture(&std::fs::read(&file).expect("gguf"), "phi2")
        .expect("phi2");
    let phi_file = tmp.path().join("phi2.gguf");
    std::fs::write(&phi_file, phi).expect("write");
    let s = serve_with(&phi_file, |_| {});
    let Err(err) = Stage::open(
        s.out.join("model.knot").to_str().expect("utf8"),
        ReaderConfig::default(),
        StageRoles::All,
        None,
    ) else {
        panic!("phi2 is not decoded");
    };
    let err = err.to_string();
    assert!(
        err.contains("GGUF of architecture \"phi2\", which gkq-decode does not run"),
        "{err}"
    );
}

#[test]
fn an_input_stage_and_an_output_stage_equal_one_stage() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = fixture(tmp.path(), "llama-tiny-f16");
    let s = serve(&src, &[DType::F16]);
    let whole = dense(&s);
    let config = ReaderConfig {
        columnar_embed: Some(s.url("")),
        require_columnar: true,
        ..ReaderConfig::default()
    };
    let input = Stage::open(
        &s.url("model.knot"),
        config.clone(),
        StageRoles::Input,
        Some(0..1),
    )
    .expect("input stage");
    let output = Stage::open(&s.url("model.knot"), config, StageRoles::Output, Some(1..2))
        .expect("output stage");
    let mut chain = [input, output];
    let g = generate(&mut chain, &PROMPT, NEW).expect("chained decode");
    assert_same(&whole, &g, "two stages");
    let (a, b) = (chain[0].bytes(), chain[1].bytes());
    assert_eq!(a.lm_head, 0, "an input stage never pulls lm_head");
    assert!(chain[0].reader().lm_head().is_err());
    assert_eq!(
        b.embedding_rows, 0,
        "an output stage never fetches embedding rows"
    );
    assert!(chain[1].reader().embedding().is_err());
    assert!(a.embedding_rows > 0 && b.lm_head > 0);
    // the layers must cover the model, input first
    let mut wrong = [chain.into_iter().nth(1).expect("output")];
    assert!(generate(&mut wrong, &PROMPT, 1).is_err());
}

/// The forward pass agrees with `scripts/reference_decode.py`, an
/// independent implementation of the published equations in float64 that
/// reads only config.json and model.safetensors: the same greedy tokens,
/// and logits within 1e-4 of the largest logit (f32 against f64).
#[test]
fn matches_an_independent_reference() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for (src, what) in [
        (
            fixtures::committed_tiny(),
            "committed tiny qwen2 (f32, tied, q/k/v biases)",
        ),
        (
            fixture(tmp.path(), "llama-tiny-bf16"),
            "llama-tiny-bf16 (untied)",
        ),
    ] {
        let out = tmp.path().join(format!("pkg-{}", what.len()));
        gkq_pack::pack(
            &gkq_pack::PackOptions::new(&src, &out),
            &gkq_pack::NoProgress,
        )
        .expect("pack");
        let o = std::process::Command::new("python3")
            .arg(root.join("scripts/reference_decode.py"))
            .arg(&src)
            .arg("5,17,300")
            .arg("4")
            .output()
            .expect("python3 (scripts/install-test-deps.sh installs it)");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        let mut st = Stage::open(
            out.join("model.knot").to_str().expect("utf8"),
            ReaderConfig::default(),
            StageRoles::All,
            None,
        )
        .expect("open");
        let mut ids = vec![5u32, 17, 300];
        for step in 0..4 {
            let x = st.embed(&ids).expect("embed");
            let x = st.forward(&x).expect("forward");
            let logits: Vec<f32> = st.logits(&x).expect("logits").to_vec1().expect("vec");
            let want: Vec<f64> = r["logits"][step]
                .as_array()
                .expect("logits")
                .iter()
                .map(|v| v.as_f64().expect("f64"))
                .collect();
            let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            let worst = logits
                .iter()
                .zip(&want)
                .fold(0f64, |m, (a, b)| m.max((f64::from(*a) - b).abs()));
            assert!(
                worst <= 1e-4 * scale,
                "{what} step {step}: |diff| {worst} vs scale {scale}"
            );
            let next = logits
                .iter()
                .enumerate()
                .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
                .0 as u32;
            assert_eq!(
                u64::from(next),
                r["tokens"][step].as_u64().expect("token"),
                "{what} step {step}"
            );
            ids = vec![next];
        }
    }
}
