//! Quantized packages from a real nginx (issue 29): a block type's rows are
//! its own blocks, fetched by range and verified, raw and dequantized; a
//! float block's lossy quantized rows are taken only when asked for; a
//! quantized lm_head stays quantized on the node, its logits computed on
//! its blocks.

use candle_core::{Device, Tensor};
use fixtures::servers::{Nginx, NginxOptions};
use gkq_format::{DType, Knot};
use gkq_reader::{PathKind, Reader, ReaderConfig, Serve};

use super::ids;

/// A fixture packed with `opts` and served by nginx.
struct Served {
    _tmp: tempfile::TempDir,
    knot: Vec<u8>,
    nginx: Nginx,
}

fn serve(preset: &str, edit: impl FnOnce(&mut gkq_pack::PackOptions)) -> Served {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    fixtures::write_model(&src, &fixtures::preset(preset).expect("preset")).expect("fixture");
    let out = tmp.path().join("www/m");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    edit(&mut opts);
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let knot = std::fs::read(out.join("model.knot")).expect("knot");
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("start nginx (scripts/install-test-deps.sh)");
    Served {
        _tmp: tmp,
        knot,
        nginx,
    }
}

impl Served {
    fn open(&self, edit: impl FnOnce(&mut ReaderConfig)) -> Reader {
        let base = format!("{}/m/", self.nginx.url());
        let mut config = ReaderConfig {
            columnar_embed: Some(base.clone()),
            ..ReaderConfig::default()
        };
        edit(&mut config);
        Reader::open(&format!("{base}model.knot"), config, Serve::ALL).expect("open")
    }

    /// Rows `ids` of the knot's block `name`, and its dtype.
    fn block_rows(&self, name: &str, ids: &[u64]) -> (DType, Vec<Vec<u8>>) {
        let knot = Knot::parse(&self.knot).expect("knot");
        let i = knot.header().header().block_index(name).expect("block");
        let b = &knot.blocks()[i];
        let rb = b.dtype.row_bytes(b.shape[1]).expect("whole blocks") as usize;
        let out = self._tmp.path().join("www/m");
        let payload = fixtures::knots::block_payload(&out, &knot, i);
        let rows = ids
            .iter()
            .map(|&id| payload[id as usize * rb..(id as usize + 1) * rb].to_vec())
            .collect();
        (b.dtype, rows)
    }
}

#[test]
fn a_quantized_blocks_rows_are_its_own_blocks_verified() {
    let s = serve("llama-tiny-k", |o| o.quant.weights = Some(DType::Q8_0));
    let r = s.open(|_| {});
    let e = r.embedding().expect("input role");
    let res = e.resolution();
    assert_eq!(res.kind(), PathKind::Columnar, "{}", res.reason());
    let c = res.columnar().expect("columnar");
    assert_eq!(c.desc.dtype, DType::Q8_0);
    assert!(c.runs().is_some(), "272-byte rows have a runs object");
    assert!(
        res.reason()
            .contains("its rows are its own quantized blocks"),
        "{}",
        res.reason()
    );
    let rows = e.rows(&ids()).expect("rows");
    let (dtype, want) = s.block_rows("model.embed_tokens.weight", &ids());
    assert_eq!((rows.dtype(), dtype), (DType::Q8_0, DType::Q8_0));
    let mut values = Vec::new();
    for (k, w) in want.iter().enumerate() {
        assert!(
            rows.bytes(k).expect("row") == w.as_slice(),
            "row {}",
            ids()[k]
        );
        let mut v = Vec::new();
        assert!(gkq_format::decode_f32(w, DType::Q8_0, &mut v));
        values.extend(v);
    }
    assert_eq!(
        rows.to_f32().expect("f32"),
        values,
        "dequantized as FORMAT.md 3.5"
    );
    // each run of rows in one range, the bytes counted
    assert!(e.fetched_bytes() > 0);
}

#[test]
fn lossy_rows_of_a_float_block_only_when_asked_for() {
    let s = serve("llama-tiny-bf16", |o| {
        o.dtypes = vec![DType::BF16, DType::Q8_0]
    });
    // exact values asked for (the default): the bf16 rows, though q8_0 is narrower
    let r = s.open(|_| {});
    let e = r.embedding().expect("input role");
    let c = e.resolution().columnar().expect("columnar").clone();
    assert_eq!(c.desc.dtype, DType::BF16, "{}", e.resolution().reason());
    // asked for: the q8_0 rows, and the reason says they are lossy
    let r = s.open(|c| c.embed_dtype = Some(DType::Q8_0));
    let e = r.embedding().expect("input role");
    let res = e.resolution();
    assert_eq!(res.columnar().expect("columnar").desc.dtype, DType::Q8_0);
    assert!(
        res.reason().contains("lossy") && res.reason().contains("asked for"),
        "{}",
        res.reason()
    );
    let rows = e.rows(&ids()).expect("rows");
    let (_, block) = s.block_rows("model.embed_tokens.weight", &ids());
    for (k, b) in block.iter().enumerate() {
        let mut v = Vec::new();
        gkq_format::decode_f32(b, DType::BF16, &mut v);
        let mut q = Vec::new();
        assert!(gkq_format::quant::quantize(&v, DType::Q8_0, &mut q));
        assert!(
            rows.bytes(k).expect("row") == q.as_slice(),
            "row {}",
            ids()[k]
        );
    }
}

#[test]
fn a_quantized_lm_head_stays_quantized() {
    let s = serve("llama-tiny-k", |o| {
        o.quant.weights = Some(DType::Q4_0);
        o.quant.output = Some(DType::Q4_0);
    });
    let r = s.open(|_| {});
    let lm = r.lm_head().expect("output role");
    let m = lm.matrix().expect("matrix");
    assert_eq!(m.dtype(), DType::Q4_0);
    assert_eq!(m.bytes().len(), 512 * 256 / 32 * 18, "the blocks, not f32");
    assert!(m.is_exact());
    let reason = lm.resolution().reason();
    assert!(
        reason.contains("kept resident in its quantized form"),
        "{reason}"
    );
    assert_eq!(lm.fetched_bytes(), 512 * 256 / 32 * 18);
    // logits on the blocks (activations quantized to q8_0, as ggml does)
    // against an f32 product with the dequantized weights
    let hidden: Vec<f32> = (0..2 * 256)
        .map(|i| ((i * 31 % 97) as f32 - 48.0) / 50.0)
        .collect();
    let h = Tensor::from_vec(hidden, (2, 256), &Device::Cpu).expect("hidden");
    let got: Vec<Vec<f32>> = lm.logits(&h).expect("logits").to_vec2().expect("vec");
    let w = Tensor::from_vec(m.to_f32().expect("f32"), (512, 256), &Device::Cpu).expect("w");
    let want: Vec<Vec<f32>> = h
        .matmul(&w.t().expect("t"))
        .expect("matmul")
        .to_vec2()
        .expect("vec");
    for (g, w) in got.iter().zip(&want) {
        let scale = w.iter().fold(0f32, |a, x| a.max(x.abs()));
        let err = g.iter().zip(w).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(
            err <= 0.02 * scale,
            "max error {err} against max |logit| {scale}"
        );
    }
}

#[test]
fn a_tied_quantized_embedding_is_pulled_once_and_serves_its_rows() {
    let s = serve("qwen2-tiny-f32", |o| {
        o.quant.weights = Some(DType::Q4_0);
        o.quant.output = Some(DType::Q4_0);
    });
    let r = s.open(|_| {});
    let lm = r.lm_head().expect("output role");
    let m = lm.matrix().expect("matrix");
    assert_eq!(m.dtype(), DType::Q4_0);
    let e = r.embedding().expect("input role");
    let rows = e.rows(&ids()).expect("rows from the resident matrix");
    let (_, want) = s.block_rows("model.embed_tokens.weight", &ids());
    for (k, w) in want.iter().enumerate() {
        assert!(
            rows.bytes(k).expect("row") == w.as_slice(),
            "row {}",
            ids()[k]
        );
    }
    assert_eq!(e.fetched_bytes(), 0, "the rows came with the lm_head");
}
