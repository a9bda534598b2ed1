//! gkq-reader against real servers on 127.0.0.1: nginx (started here) for
//! the normal paths and the server that ignores Range; an in-process server
//! for wrong Content-Range, short bodies and resets; a silent socket for stalls.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use fixtures::servers::{Fault, FaultServer, Nginx, NginxOptions, Staller};
use gkq_format::{DType, Knot, keys};
use gkq_reader::{
    DenseCause, FetchConfig, PathKind, ReadPath, Reader, ReaderConfig, ReaderError, Serve,
    with_timeout,
};

use fixtures::knots::dense_row;

mod quant;

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

fn pack(spec: &fixtures::Spec, dtypes: &[DType], tmp: &Path) -> PathBuf {
    let src = tmp.join("model");
    fixtures::write_model(&src, spec).expect("fixture");
    let out = tmp.join("www/m");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    opts.dtypes = dtypes.to_vec();
    // the version 3/4 layout (blocks in the knot, runs objects) these
    // tests exercise; one_copy.rs reads version 5's
    opts.one_copy = false;
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    out
}

fn serve(spec: &fixtures::Spec, dtypes: &[DType], opts: &NginxOptions) -> Served {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(spec, dtypes, tmp.path());
    let nginx = Nginx::start(&tmp.path().join("www"), &tmp.path().join("nginx"), opts)
        .expect("start nginx (scripts/install-test-deps.sh)");
    Served {
        _tmp: tmp,
        out,
        nginx,
    }
}

/// llama-tiny f32 served by an nginx that ignores Range.
fn serve_ignoring_range() -> Served {
    serve(
        &fixtures::preset("llama-tiny-f32").expect("preset"),
        &[DType::F32],
        &NginxOptions {
            ignore_ranges: true,
            ..Default::default()
        },
    )
}

/// The local knot of `s`, with its f32 row file from the server.
fn open_local_with_remote_rows(s: &Served) -> Reader {
    Reader::open(
        s.out.join("model.knot").to_str().expect("utf8"),
        config(Some(s.url("token_embd.f32.rows"))),
        Serve::INPUT,
    )
    .expect("open")
}

/// Rows from `url`, or (`None`) the dense block.
fn config(url: Option<String>) -> ReaderConfig {
    ReaderConfig {
        dense: url.is_none(),
        columnar_embed: url,
        ..ReaderConfig::default()
    }
}

fn ids() -> Vec<u64> {
    vec![0, 5, 6, 7, 300, 5, 511, 42, 43, 0, 200]
}

#[test]
fn every_preset_and_dtype_is_bit_identical_to_the_dense_block() {
    let dtypes = [DType::F32, DType::BF16, DType::F16];
    for preset in fixtures::test_presets() {
        let spec = fixtures::preset(preset).expect("preset");
        let s = serve(&spec, &dtypes, &NginxOptions::default());
        for d in dtypes {
            let rows_url = s.url(&format!("token_embd.{d}.rows"));
            let r = Reader::open(&s.url("model.knot"), config(Some(rows_url)), Serve::INPUT)
                .expect("open");
            let e = r.embedding().expect("input role");
            assert_eq!(
                e.resolution().kind(),
                PathKind::Columnar,
                "{preset} {d}: {}",
                e.resolution().reason()
            );
            let rows = e.rows(&ids()).expect("rows");
            assert_eq!(rows.len(), ids().len());
            assert_eq!(rows.dtype(), d);
            for (k, &id) in ids().iter().enumerate() {
                assert!(
                    rows.bytes(k).expect("row") == dense_row(&s.out, id, d).as_slice(),
                    "{preset} {d}: row {id}"
                );
            }
            let t = rows.to_tensor().expect("tensor");
            assert_eq!(t.dims(), &[ids().len(), spec.hidden]);
        }
    }
}

#[test]
fn remote_open_reads_only_the_header() {
    // A knot whose header is larger than the first 64 KiB fetch: two GETs.
    let mut spec = fixtures::Spec::tiny(fixtures::Arch::Llama, fixtures::FDtype::BF16);
    spec.layers = 120;
    spec.hidden = 16;
    spec.intermediate = 16;
    spec.heads = 2;
    spec.kv_heads = 1;
    let s = serve(&spec, &[DType::F32], &NginxOptions::default());
    let knot_len = fs::metadata(s.out.join("model.knot")).expect("knot").len();
    let r = Reader::open(&s.url("model.knot"), config(None), Serve::INPUT).expect("open");
    let header_end = r.knot().header().header_end();
    assert!(header_end > 64 * 1024, "header is {header_end} bytes");
    let st = r.net_stats();
    assert_eq!(st.requests, 2, "two range GETs, no HEAD");
    assert!(
        st.payload_bytes <= header_end && st.payload_bytes < knot_len / 2,
        "{st:?}"
    );
    // a small header: one GET, whose Content-Range gives the knot's length
    let s = serve(
        &fixtures::preset("qwen2-tiny-f32").expect("preset"),
        &[DType::F32],
        &NginxOptions::default(),
    );
    let r = Reader::open(&s.url("model.knot"), config(None), Serve::INPUT).expect("open");
    assert_eq!(r.net_stats().requests, 1);
    // the dense fallback fetches the one block, checked against its digest
    let e = r.embedding().expect("embedding");
    assert_eq!(e.resolution().path, ReadPath::Dense(DenseCause::Asked));
    let rows = e.rows(&[3u64, 4]).expect("rows");
    assert!(rows.bytes(1).expect("row") == dense_row(&s.out, 4, DType::F32).as_slice());
    assert_eq!(r.net_stats().requests, 2);
    assert_eq!(
        r.net_stats().payload_bytes - 32768.min(header_end_of(&s.out)),
        512 * 64 * 4
    );
}

fn header_end_of(out: &Path) -> u64 {
    let bytes = fs::read(out.join("model.knot")).expect("knot");
    Knot::parse(&bytes)
        .expect("valid")
        .header()
        .header_end()
        .max(32768)
        .min(bytes.len() as u64)
}

#[test]
fn cache_hits_make_no_requests_and_gaps_are_coalesced() {
    let s = serve(
        &fixtures::preset("qwen2-tiny-f32").expect("preset"),
        &[DType::F32],
        &NginxOptions::default(),
    );
    let mut c = config(Some(s.url("token_embd.f32.rows")));
    c.fetch = FetchConfig {
        max_gap_rows: 2,
        ..FetchConfig::default()
    };
    let r = Reader::open(
        s.out.join("model.knot").to_str().expect("utf8"),
        c,
        Serve::INPUT,
    )
    .expect("open");
    let e = r.embedding().expect("embedding");
    let before = r.net_stats();
    e.rows(&[10u64, 12, 13, 100]).expect("rows");
    let st = r.net_stats().since(&before);
    assert_eq!(
        st.requests, 3,
        "10..=13 in one range (gap of 1 row), 100 alone, and the proof's chunk table"
    );
    // 256-byte rows get proof height 0: no path records, a table of 512 leaf hashes
    let cs = e.cache_stats();
    assert_eq!(cs.proof_bytes, 512 * 32);
    assert_eq!(st.payload_bytes, 5 * 256 + 512 * 32, "4 asked + 1 gap row");
    assert_eq!((cs.hits, cs.misses, cs.rows_fetched), (0, 4, 5));
    let before = r.net_stats();
    let rows = e.rows(&[11u64, 13, 10]).expect("rows");
    assert_eq!(
        r.net_stats().since(&before).requests,
        0,
        "gap row 11 was cached too"
    );
    assert_eq!(e.cache_stats().hits, 3);
    assert!(rows.bytes(0).expect("row") == dense_row(&s.out, 11, DType::F32).as_slice());
}

#[test]
fn token_out_of_range_fetches_nothing() {
    let s = serve(
        &fixtures::preset("qwen2-tiny-f32").expect("preset"),
        &[DType::F32],
        &NginxOptions::default(),
    );
    let r = Reader::open(
        &s.url("model.knot"),
        config(Some(s.url("token_embd.f32.rows"))),
        Serve::INPUT,
    )
    .expect("open");
    let before = r.net_stats();
    let e = r.embedding().expect("embedding");
    match e.rows(&[1u64, 512]) {
        Err(ReaderError::TokenOutOfRange {
            id: 512,
            vocab: 512,
        }) => {}
        other => panic!("expected TokenOutOfRange, got {other:?}"),
    }
    let msg = e.rows(&[9999u64]).expect_err("out of range").to_string();
    assert_eq!(
        msg,
        "token id 9,999 is out of range: the vocabulary has 512 rows (ids 0 to 511)"
    );
    assert_eq!(r.net_stats(), before, "nothing fetched");
}

#[test]
fn server_ignoring_range_falls_back_to_dense_without_reading_the_body() {
    let s = serve_ignoring_range();
    let r = open_local_with_remote_rows(&s);
    let e = r.embedding().expect("embedding");
    assert_eq!(
        e.resolution().kind(),
        PathKind::Columnar,
        "HEAD looks right"
    );
    let rows = e.rows(&[7u64, 8]).expect("falls back");
    assert!(rows.bytes(1).expect("row") == dense_row(&s.out, 8, DType::F32).as_slice());
    let res = e.resolution();
    assert_eq!(res.kind(), PathKind::Dense);
    assert!(
        res.reason().contains("ignored Range")
            && res.reason().contains("HTTP 200")
            && res.reason().contains("python3 -m http.server does not"),
        "{}",
        res.reason()
    );
    assert_eq!(r.net_stats().payload_bytes, 0, "the 200 body was not read");
}

#[test]
fn wrong_content_length_at_resolution_falls_back() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(
        &fixtures::preset("qwen2-tiny-f32").expect("preset"),
        &[DType::F32],
        tmp.path(),
    );
    fs::OpenOptions::new()
        .write(true)
        .open(out.join("token_embd.f32.rows"))
        .expect("open")
        .set_len(1000)
        .expect("truncate");
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let url = format!("{}/m/token_embd.f32.rows", nginx.url());
    let r = Reader::open(
        out.join("model.knot").to_str().expect("utf8"),
        config(Some(url)),
        Serve::INPUT,
    )
    .expect("open");
    let res = r.embedding().expect("embedding").resolution();
    assert!(
        matches!(
            res.path,
            ReadPath::Dense(DenseCause::Length {
                len: 1000,
                expected: 131072,
                ..
            })
        ),
        "{res:?}"
    );
    // a URL naming no row file of the block, and a 404
    let r = Reader::open(
        out.join("model.knot").to_str().expect("utf8"),
        config(Some(format!("{}/m/other.rows", nginx.url()))),
        Serve::INPUT,
    )
    .expect("open");
    let res = r.embedding().expect("e").resolution();
    assert!(
        matches!(&res.path, ReadPath::Dense(DenseCause::UnknownRowFile { url, .. }) if url.ends_with("/m/other.rows")),
        "{res:?}"
    );
    let r = Reader::open(
        out.join("model.knot").to_str().expect("utf8"),
        config(Some(format!("{}/nope/", nginx.url()))),
        Serve::INPUT,
    )
    .expect("open");
    let res = r.embedding().expect("e").resolution();
    assert!(
        matches!(&res.path, ReadPath::Dense(DenseCause::Head { error, timeout: false, .. }) if error.contains("HTTP 404")),
        "{res:?}"
    );
}

fn fault_reader(fault: Fault) -> (tempfile::TempDir, PathBuf, FaultServer, Reader) {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(
        &fixtures::preset("qwen2-tiny-f32").expect("preset"),
        &[DType::F32],
        tmp.path(),
    );
    let server = FaultServer::start_dir(&out, fault).expect("server");
    let mut c = with_timeout(
        config(Some(server.url("token_embd.f32.rows"))),
        Duration::from_secs(2),
    );
    c.store.retry.backoff = Duration::from_millis(5);
    let r = Reader::open(
        out.join("model.knot").to_str().expect("utf8"),
        c,
        Serve::INPUT,
    )
    .expect("open");
    (tmp, out, server, r)
}

/// A wrong Content-Range is never used: the row file is given up for the
/// dense block (one fallback policy for both roles: issue 34), and the
/// reason names the header; nothing of the answer is cached.
#[test]
fn wrong_content_range_falls_back_and_nothing_is_cached() {
    let (_t, out, _s, r) = fault_reader(Fault::WrongContentRange);
    let e = r.embedding().expect("embedding");
    assert_eq!(e.resolution().kind(), PathKind::Columnar);
    let backend = e.columnar().expect("columnar");
    let rows = e.rows(&[3u64]).expect("rows from the dense block");
    assert_eq!(
        rows.bytes(0).expect("row"),
        &fixtures::knots::dense_row(&out, 3, gkq_format::DType::F32)[..]
    );
    match e.resolution().path {
        ReadPath::Dense(DenseCause::FellBack { error }) => assert!(
            error.contains("Content-Range") && error.contains("bytes 768-1023/131072"),
            "{error}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(backend.cached_rows(), 0);
}

#[test]
fn short_body_is_an_error_and_nothing_is_cached() {
    let (_t, _o, server, r) = fault_reader(Fault::ShortBody);
    let e = r.embedding().expect("embedding");
    let err = e.rows(&[3u64, 4]).expect_err("short body").to_string();
    assert!(
        err.contains("256 of 512 bytes") && err.contains("3 attempts"),
        "{err}"
    );
    assert_eq!(e.columnar().expect("columnar").cached_rows(), 0);
    assert_eq!(
        server.connections(),
        1 + 1 + 3,
        "HEAD, the proof's chunk table, 3 attempts of the rows"
    );
}

#[test]
fn connection_reset_is_retried() {
    // the first two connections are dropped: the HEAD at open is retried through them
    let (_tmp, out, _server, r) = fault_reader(Fault::ResetFirst(2));
    let e = r.embedding().expect("embedding");
    assert_eq!(
        e.resolution().kind(),
        PathKind::Columnar,
        "{}",
        e.resolution().reason()
    );
    let rows = e.rows(&[9u64]).expect("rows after retries");
    assert!(rows.bytes(0).expect("row") == dense_row(&out, 9, DType::F32).as_slice());
    assert!(r.net_stats().retries >= 2);
}

#[test]
fn stalled_server_times_out() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(
        &fixtures::preset("qwen2-tiny-f32").expect("preset"),
        &[DType::F32],
        tmp.path(),
    );
    let staller = Staller::start().expect("staller");
    let mut c = with_timeout(
        config(Some(format!("{}/token_embd.f32.rows", staller.url()))),
        Duration::from_millis(300),
    );
    c.store.retry.attempts = 2;
    let t = Instant::now();
    let r = Reader::open(
        out.join("model.knot").to_str().expect("utf8"),
        c,
        Serve::INPUT,
    )
    .expect("open");
    let res = r.embedding().expect("e").resolution();
    assert!(
        matches!(
            res.path,
            ReadPath::Dense(DenseCause::Head { timeout: true, .. })
        ),
        "{res:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn concurrent_callers_fetch_each_row_once() {
    let s = serve(
        &fixtures::preset("qwen2-tiny-f32").expect("preset"),
        &[DType::F32],
        &NginxOptions::default(),
    );
    let mut c = config(Some(s.url("token_embd.f32.rows")));
    c.fetch.max_gap_rows = 0;
    let r = Arc::new(
        Reader::open(
            s.out.join("model.knot").to_str().expect("utf8"),
            c,
            Serve::INPUT,
        )
        .expect("open"),
    );
    let sets: Vec<Vec<u64>> = (0..8u64)
        .map(|t| (0..40).map(|k| (k * 7 + t * 3) % 97).collect())
        .collect();
    let distinct: std::collections::BTreeSet<u64> = sets.iter().flatten().copied().collect();
    std::thread::scope(|sc| {
        for set in &sets {
            let r = r.clone();
            let out = s.out.clone();
            sc.spawn(move || {
                let rows = r.embedding().expect("e").rows(set).expect("rows");
                for (k, &id) in set.iter().enumerate() {
                    assert!(
                        rows.bytes(k).expect("row") == dense_row(&out, id, DType::F32).as_slice(),
                        "torn row {id}"
                    );
                }
            });
        }
    });
    let cs = r.embedding().expect("e").cache_stats();
    assert_eq!(
        cs.rows_fetched,
        distinct.len() as u64,
        "each row fetched once"
    );
    assert_eq!(
        r.net_stats().payload_bytes,
        distinct.len() as u64 * 256 + cs.proof_bytes,
        "each row once, and the proof's chunk table once"
    );
    assert_eq!(cs.proof_bytes, 512 * 32);
}

fn hidden(n: usize, h: usize) -> Tensor {
    let v: Vec<f32> = (0..n * h)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    Tensor::from_vec(v, (n, h), &Device::Cpu).expect("tensor")
}

/// Logits computed directly from the dense block of the local knot.
fn reference_logits(out: &Path, role_key: &str, x: &Tensor) -> Vec<Vec<f32>> {
    let bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&bytes).expect("valid");
    let h = knot.header().header();
    let i = h
        .block_index(h.meta_str(role_key).expect("role"))
        .expect("block");
    let b = h.resolve(i).expect("data");
    let dtype = match b.dtype {
        DType::F32 => candle_core::DType::F32,
        DType::F16 => candle_core::DType::F16,
        DType::BF16 => candle_core::DType::BF16,
        d => panic!("not a float block: {d}"),
    };
    let shape = [b.shape[0] as usize, b.shape[1] as usize];
    let w = Tensor::from_raw_buffer(
        knot.payload(i).expect("payload"),
        dtype,
        &shape,
        &Device::Cpu,
    )
    .and_then(|t| t.to_dtype(candle_core::DType::F32))
    .expect("weights");
    x.matmul(&w.t().expect("t"))
        .expect("matmul")
        .to_vec2::<f32>()
        .expect("vec")
}

#[test]
fn tied_lm_head_is_resident_and_serves_embedding_lookups() {
    let spec = fixtures::preset("qwen2-tiny-bf16").expect("preset");
    let s = serve(&spec, &[DType::BF16], &NginxOptions::default());
    let r = Reader::open(
        &s.url("model.knot"),
        config(Some(s.url("token_embd.bf16.rows"))),
        Serve::ALL,
    )
    .expect("open");
    let e = r.embedding().expect("e");
    e.rows(&[1u64, 2]).expect("columnar rows before residency");
    let lm = r.lm_head().expect("output role");
    assert!(!lm.is_resident());
    let x = hidden(3, spec.hidden);
    let logits = lm
        .logits(&x)
        .expect("logits")
        .to_vec2::<f32>()
        .expect("vec");
    let reference = reference_logits(&s.out, keys::ROLE_LM_HEAD, &x);
    assert!(
        logits
            .iter()
            .flatten()
            .map(|v| v.to_bits())
            .eq(reference.iter().flatten().map(|v| v.to_bits())),
        "logits not bit-identical"
    );
    let am = lm.argmax(&x).expect("argmax");
    for (row, &a) in reference.iter().zip(&am) {
        let best = row
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .expect("non-empty")
            .0;
        assert_eq!(a as usize, best);
    }
    assert!(lm.is_resident());
    let before = r.net_stats();
    let rows = e
        .rows(&[1u64, 400, 77])
        .expect("rows from the resident matrix");
    assert_eq!(r.net_stats(), before, "no requests once resident");
    assert!(rows.bytes(1).expect("row") == dense_row(&s.out, 400, DType::BF16).as_slice());
}

#[test]
fn untied_lm_head_background_pull_and_roles() {
    let spec = fixtures::preset("llama-tiny-f16").expect("preset");
    let s = serve(&spec, &[DType::F32], &NginxOptions::default());
    // first pipeline stage: input only, never pulls lm_head
    let first = Reader::open(
        &s.url("model.knot"),
        config(Some(s.url("token_embd.f32.rows"))),
        Serve::INPUT,
    )
    .expect("open");
    first
        .embedding()
        .expect("e")
        .rows(&[1u64, 2, 3])
        .expect("rows");
    assert!(matches!(
        first.lm_head(),
        Err(ReaderError::RoleNotServed("output"))
    ));
    // the first 32 KiB of the knot (its header), three 256-byte rows and
    // their proof (height 0: the table of 512 leaf hashes): no matrix
    assert_eq!(
        first.net_stats().payload_bytes,
        32768 + 3 * 256 + 512 * 32,
        "{:?}",
        first.net_stats()
    );
    // last stage: eager background pull while "prefill" runs
    let last = Reader::open(&s.url("model.knot"), config(None), Serve::OUTPUT).expect("open");
    assert!(matches!(
        last.embedding(),
        Err(ReaderError::RoleNotServed("input"))
    ));
    let lm = last.lm_head().expect("lm_head");
    lm.start_background();
    let x = hidden(2, spec.hidden);
    let logits = lm
        .logits(&x)
        .expect("logits")
        .to_vec2::<f32>()
        .expect("vec");
    let reference = reference_logits(&s.out, keys::ROLE_LM_HEAD, &x);
    assert!(
        logits
            .iter()
            .flatten()
            .map(|v| v.to_bits())
            .eq(reference.iter().flatten().map(|v| v.to_bits()))
    );
    let before = last.net_stats();
    lm.argmax(&x).expect("argmax");
    assert_eq!(last.net_stats(), before, "resident: no more requests");
    // the untied lm_head is not the embedding
    let m = lm.matrix().expect("matrix");
    assert_eq!((m.rows(), m.cols(), m.dtype()), (512, 64, DType::F32));
}

#[test]
fn spectral_blocks_are_returned_untouched() {
    use gkq_format::{
        Block, COLUMNAR_ELIGIBLE, ColumnarDescriptor, Encoding, Header, KnotWriter, Metadata,
        Payload, Quant, Value,
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let mut md = Metadata::new();
    md.insert(keys::ROLE_TOKEN_EMBD.into(), Value::Str("e".into()));
    let mut e = Block::dense("e", DType::F32, vec![4, 2]).expect("block");
    e.flags = COLUMNAR_ELIGIBLE;
    e.columnar.push(
        ColumnarDescriptor::for_shape(4, 2, DType::F32, "token_embd.f32.rows".into())
            .expect("desc"),
    );
    // rank-1 factors of a 2x2 matrix: U = [1, 2], S = [3], Vt = [1, -1]
    let s = Block {
        name: "attn.q".into(),
        dtype: DType::F32,
        flags: 0,
        shape: vec![2, 2],
        encoding: Encoding::Spectral {
            rank: 1,
            factor_dtype: DType::F32,
            quant: Quant::None,
            payload: Payload {
                offset: 0,
                len: 20,
                sha256: [0; 32],
            },
        },
        columnar: vec![],
    };
    let factors: Vec<u8> = [1.0f32, 2.0, 3.0, 1.0, -1.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let emb: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let path = tmp.path().join("model.knot");
    let mut w = KnotWriter::new(
        fs::File::create(&path).expect("create"),
        Header {
            metadata: md,
            blocks: vec![e, s],
        },
    )
    .expect("writer");
    w.write_payload(0, emb.as_slice()).expect("e");
    w.write_payload(1, factors.as_slice()).expect("s");
    w.finish().expect("finish");
    let r = Reader::open(path.to_str().expect("utf8"), config(None), Serve::INPUT).expect("open");
    let res = r.resolve("attn.q").expect("resolve");
    assert_eq!(res.path, ReadPath::Spectral { rank: 1 });
    let payload = r.block_payload("attn.q").expect("factors");
    assert!(&payload[..] == factors.as_slice(), "factors untouched");
    let block = r
        .knot()
        .data_block(r.knot().index("attn.q").expect("index"))
        .expect("block")
        .clone();
    let w = gkq_format::reconstruct_spectral(&block, &payload).expect("reconstruct");
    let w: Vec<f32> = w
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
        .collect();
    assert_eq!(w, [3.0, -3.0, 6.0, -6.0]);
    assert_eq!(r.resolve("e").expect("e").kind(), PathKind::Dense);
}

/// A spectral token embedding resolves as `spectral` and its rows are the
/// reconstruction, never slices of the factor bytes; an id past the
/// vocabulary is an error, not a panic.
#[test]
fn spectral_token_embedding_rows_are_reconstructed() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (path, want) = fixtures::knots::spectral_embedding_knot(tmp.path());
    let r = Reader::open(path.to_str().expect("utf8"), config(None), Serve::ALL).expect("open");
    let emb = r.embedding().expect("input role");
    assert_eq!(emb.resolution().kind(), PathKind::Spectral);
    assert!(
        emb.resolution().reason().contains("reconstructed"),
        "{}",
        emb.resolution().reason()
    );
    let rows = emb
        .rows(&[5u64, 0, 3])
        .expect("rows")
        .to_f32()
        .expect("f32");
    let expect: Vec<f32> = [5usize, 0, 3]
        .iter()
        .flat_map(|&i| want[i * 3..i * 3 + 3].to_vec())
        .collect();
    assert_eq!(
        rows.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        expect.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    assert!(matches!(
        emb.rows(&[6u64]),
        Err(ReaderError::TokenOutOfRange { id: 6, vocab: 6 })
    ));
    assert!(matches!(
        emb.rows(&[1u64 << 40]),
        Err(ReaderError::TokenOutOfRange { .. })
    ));
    // the tied lm_head computes with the same reconstructed matrix
    let lm = r.lm_head().expect("output role");
    let x = Tensor::from_vec(vec![1f32, 0.0, 0.0], (1, 3), &Device::Cpu).expect("x");
    let logits: Vec<f32> = lm
        .logits(&x)
        .expect("logits")
        .flatten_all()
        .expect("flat")
        .to_vec1()
        .expect("vec");
    let col0: Vec<f32> = (0..6).map(|i| want[i * 3]).collect();
    assert_eq!(logits, col0);
}

/// A remote knot that declares a 4 TiB payload gives an error, not an
/// allocation abort: nothing is allocated from a declared length.
#[test]
fn four_tib_payload_is_an_error_not_an_abort() {
    use gkq_format::{Header, Metadata, Value};
    let mut md = Metadata::new();
    md.insert(keys::ROLE_TOKEN_EMBD.into(), Value::Str("emb".into()));
    let emb = gkq_format::Block::dense("emb", DType::F32, vec![1 << 38, 4]).expect("shape");
    let (prefix, file_len) = gkq_format::encode_prefix(Header {
        metadata: md,
        blocks: vec![emb],
    })
    .expect("a valid header");
    assert!(file_len > 4 << 40);
    let server = FaultServer::start(prefix, Fault::ClaimLength(file_len)).expect("server");
    let url = server.url("model.knot");
    let r = Reader::open(&url, config(None), Serve::INPUT).expect("the header is valid");
    let e = r
        .embedding()
        .expect("input")
        .rows(&[0u64])
        .expect_err("too large to hold");
    let msg = e.to_string();
    assert!(msg.contains("over the") && msg.contains("limit"), "{msg}");
}

/// Concurrent callers waiting on one fetch see the same typed error: with a
/// server that ignores Range, every caller of the backend gets an error that
/// `ignores_range()`, and every caller of the embedding falls back to the
/// dense block and gets the right rows.
#[test]
fn concurrent_callers_all_fall_back_when_range_is_ignored() {
    let s = serve_ignoring_range();
    let ids: Vec<u64> = (0..40).map(|i| i * 7).collect();
    // with --require-columnar: the same typed error for every caller
    let mut c = config(Some(s.url("token_embd.f32.rows")));
    c.require_columnar = true;
    let local = s.out.join("model.knot");
    // (the resolution HEAD passes: only the GETs show the ignored Range)
    let r = Reader::open(local.to_str().expect("utf8"), c, Serve::INPUT).expect("open");
    let e = r.embedding().expect("input");
    let errors: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..12).map(|_| sc.spawn(|| e.rows(&ids))).collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .expect("thread")
                    .expect_err("Range ignored")
                    .to_string()
            })
            .collect()
    });
    assert!(
        errors.iter().all(|m| m.contains("ignored Range")),
        "{errors:?}"
    );
    // through the embedding: every caller falls back and gets the dense rows
    let r = open_local_with_remote_rows(&s);
    let e = r.embedding().expect("input");
    let want = dense_row(&s.out, 7, DType::F32);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..12).map(|_| sc.spawn(|| e.rows(&ids))).collect();
        for h in hs {
            let rows = h.join().expect("thread").expect("every caller falls back");
            assert!(rows.bytes(1).expect("row 7") == want.as_slice());
        }
    });
    assert_eq!(e.resolution().kind(), PathKind::Dense);
}

/// `--knot-id` pins the model: the right id opens, any other is refused
/// before anything in the knot is used.
#[test]
fn knot_id_pins_the_model() {
    let s = serve(
        &fixtures::preset("qwen2-tiny-f32").expect("preset"),
        &[DType::F32],
        &NginxOptions::default(),
    );
    let bytes = fs::read(s.out.join("model.knot")).expect("knot");
    let id = gkq_format::hex(
        &Knot::parse(&bytes)
            .expect("valid")
            .header()
            .preamble()
            .header_sha256,
    );
    let pinned = |id: &str| ReaderConfig {
        knot_id: Some(id.parse().expect("a knot id")),
        ..config(Some(s.url("token_embd.f32.rows")))
    };
    let r = Reader::open(
        &s.url("model.knot"),
        pinned(&id.to_uppercase()),
        Serve::INPUT,
    )
    .expect("the right id (any case)");
    assert_eq!(
        r.embedding()
            .expect("input")
            .rows(&[3u64])
            .expect("rows")
            .len(),
        1
    );
    let wrong = "00".repeat(32);
    let e =
        Reader::open(&s.url("model.knot"), pinned(&wrong), Serve::INPUT).expect_err("another knot");
    assert!(
        matches!(&e, ReaderError::KnotId { expected, found, .. } if *expected == wrong && *found == id),
        "{e}"
    );
}

/// A package gkq-pack wrote with `--spectral`, read over nginx: the factors
/// come back untouched, and `block_values` reconstructs them (FORMAT.md
/// section 5) to the bits the format's own reconstruction gives.
#[test]
fn packed_spectral_blocks_over_http() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    let spec = fixtures::Spec {
        low_rank: Some((16, 1e-4)),
        ..fixtures::Spec::tiny(fixtures::Arch::Qwen2, fixtures::FDtype::BF16)
    };
    fixtures::write_model(&src, &spec).expect("fixture");
    let out = tmp.path().join("www/m");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    opts.spectral = vec![
        "*.self_attn.q_proj.weight=rank:16,quant:u8"
            .parse()
            .expect("spec"),
    ];
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("start nginx (scripts/install-test-deps.sh)");
    let knot_bytes = fs::read(out.join("model.knot")).expect("knot");
    let local = Knot::parse(&knot_bytes).expect("parse");
    let r = Reader::open(
        &format!("{}/m/model.knot", nginx.url()),
        config(None),
        Serve::ALL,
    )
    .expect("open");
    let name = "model.layers.1.self_attn.q_proj.weight";
    let res = r.resolve(name).expect("resolve");
    assert_eq!(res.path, ReadPath::Spectral { rank: 16 });
    let i = local.header().header().block_index(name).expect("index");
    let payload = r.block_payload(name).expect("factors");
    assert!(
        &payload[..] == local.payload(i).expect("payload"),
        "untouched"
    );
    let (block, values) = r.block_values(name).expect("values");
    assert_eq!(block.dtype, DType::BF16);
    let want = gkq_format::reconstruct_spectral(&local.blocks()[i], &payload).expect("rec");
    assert!(values[..] == want[..], "reconstruction differs");
    // a dense neighbour is still the source's bytes
    let (_, o) = r
        .block_values("model.layers.1.self_attn.o_proj.weight")
        .expect("o_proj");
    let j = local
        .header()
        .header()
        .block_index("model.layers.1.self_attn.o_proj.weight")
        .expect("o");
    assert!(o[..] == local.payload(j).expect("o payload")[..]);
}
