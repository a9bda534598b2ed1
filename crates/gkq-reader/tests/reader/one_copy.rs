//! Version 5 packages (docs/FORMAT.md 7e), gkq-pack's default: the
//! embedding stored once, in its row file, each row followed by its
//! record. Served by nginx, a node reads the same rows with one request per
//! run, the whole block from the row file, and never a tampered row.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fixtures::servers::{Nginx, NginxOptions};
use fixtures::{FDtype, Spec};
use gkq_format::{DType, Knot, merkle};
use gkq_reader::{Reader, ReaderConfig, Serve, with_timeout};

const EMBED: &str = "model.embed_tokens.weight";
const OBJECT: &str = "token_embd.bf16.rows";

/// Rows 2 KiB wide (bf16, hidden 1024): proof height 7, so records move.
fn wide() -> Spec {
    let mut s = fixtures::preset("qwen2-tiny-f32").expect("preset");
    s.dtype = FDtype::BF16;
    s.hidden = 1024;
    s.intermediate = 64;
    s.heads = 8;
    s.kv_heads = 8;
    s.layers = 1;
    s
}

/// The model packed into `dir/www/m`, one copy (the default) or not.
fn pack(dir: &Path, one_copy: bool) -> PathBuf {
    let src = dir.join("model");
    if !src.exists() {
        fixtures::write_model(&src, &wide()).expect("fixture");
    }
    let out = dir.join(if one_copy { "www/m" } else { "www/v4" });
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    opts.dtypes = vec![DType::BF16];
    opts.one_copy = one_copy;
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    out
}

fn open(url: &str, require: bool) -> Reader {
    let mut c = with_timeout(
        ReaderConfig {
            require_columnar: require,
            ..ReaderConfig::default()
        },
        Duration::from_secs(5),
    );
    c.store.retry.backoff = Duration::from_millis(5);
    Reader::open(url, c, Serve::INPUT).expect("open")
}

fn rows_of(r: &Reader, ids: &[u64]) -> Vec<Vec<u8>> {
    let rows = r.embedding().expect("input").rows(ids).expect("rows");
    (0..ids.len())
        .map(|k| rows.bytes(k).expect("row").to_vec())
        .collect()
}

#[test]
fn a_version_5_package_serves_the_same_rows_in_one_request_per_run() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (one, v4) = (pack(tmp.path(), true), pack(tmp.path(), false));
    let knot = fs::read(one.join("model.knot")).expect("knot");
    let k = Knot::parse(&knot).expect("parse");
    assert_eq!(k.header().preamble().version, 5);
    let d = &k.blocks()[k.header().header().block_index(EMBED).expect("embed")].columnar[0];
    assert!(d.inline_proof() && d.proof.is_some_and(|p| p.height == 7));
    let layout = merkle::layout_of(d).expect("proof");
    let len = |p: &str| fs::metadata(one.join(p)).expect(p).len();
    assert_eq!(len(OBJECT), d.rows * (d.row_bytes + 32 * 7));
    assert_eq!(len(&format!("{OBJECT}.proof")), layout.table_len());
    assert!(!one.join(format!("{OBJECT}.runs")).exists());
    let v4_knot = fs::metadata(v4.join("model.knot")).expect("v4").len();
    assert!(
        v4_knot - len("model.knot") >= d.rows * d.row_bytes,
        "the knot holds no embedding"
    );
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let ids = [3u64, 4, 5, 6, 7, 130, 300, 301, 511, 3];
    let r = open(&format!("{}/m/model.knot", nginx.url()), true);
    let why = r.embedding().expect("input").resolution().reason();
    assert!(
        why.contains("FORMAT.md 7e") && why.contains("one range per run"),
        "{why}"
    );
    let n0 = r.net_stats().requests;
    let got = rows_of(&r, &ids);
    // 4 runs: [3..=7], [130], [300..=301], [511]; plus the chunk table
    assert_eq!(r.net_stats().requests - n0, 4 + 1, "one request per run");
    let old = rows_of(&open(&format!("{}/v4/model.knot", nginx.url()), true), &ids);
    assert_eq!(got, old, "the same rows as the version 4 layout's");
    for (k, &id) in ids.iter().enumerate() {
        assert_eq!(
            got[k],
            fixtures::knots::dense_row(&one, id, DType::BF16),
            "row {id}"
        );
    }
    // the whole block comes from the row file, its records dropped
    let (block, values) = r.block_values(EMBED).expect("block");
    assert_eq!(block.name, EMBED);
    let (_, want) = open(&format!("{}/v4/model.knot", nginx.url()), true)
        .block_values(EMBED)
        .expect("v4 block");
    assert!(values[..] == want[..], "the block's values");
}

#[test]
fn a_tampered_row_or_record_is_never_returned() {
    let tmp = tempfile::tempdir().expect("tmp");
    let one = pack(tmp.path(), true);
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let url = format!("{}/m/model.knot", nginx.url());
    let path = one.join(OBJECT);
    let clean = fs::read(&path).expect("rows");
    let stride = clean.len() / 512;
    // a byte of row 130, then a byte of its record
    for at in [130 * stride + 5, 130 * stride + 2048 + 40] {
        let mut bad = clean.clone();
        bad[at] ^= 0x40;
        fs::write(&path, &bad).expect("tamper");
        for require in [true, false] {
            let r = open(&url, require);
            let e = r.embedding().expect("input");
            let got = e.rows(&[130u64, 3]);
            let err = got.expect_err("a tampered row file serves no row, nor the block it holds");
            let msg = gkq_format::error_chain(&err);
            assert!(msg.contains(OBJECT), "byte {at}, require {require}: {msg}");
        }
    }
    fs::write(&path, &clean).expect("restore");
    let r = open(&url, true);
    assert_eq!(
        rows_of(&r, &[130])[0],
        fixtures::knots::dense_row(&one, 130, DType::BF16)
    );
}

/// A local package's block stored in its row file is read in steps, each
/// hashed while the next is read, with the rows kept and the records
/// dropped as they pass (the peak holds the rows, not the file): the same
/// values as the version 4 knot's block, over several steps; and a byte
/// changed anywhere (a row or a record, the first step or the last) or a
/// file cut short gives no block, naming the file.
#[test]
fn a_local_block_from_its_row_file_is_read_in_steps_and_never_tampered() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    let mut spec = wide();
    spec.vocab = 4096; // 9.3 MB of rows and records: three steps of 4 MiB
    fixtures::write_model(&src, &spec).expect("fixture");
    let (one, v4) = (pack(tmp.path(), true), pack(tmp.path(), false));
    let values = |dir: &Path| -> Result<bytes::Bytes, String> {
        let c = ReaderConfig::default();
        let knot = dir.join("model.knot");
        let r = Reader::open(knot.to_str().expect("utf8"), c, Serve::INPUT);
        let r = r.map_err(|e| gkq_format::error_chain(&e))?;
        let (block, v) = r
            .block_values(EMBED)
            .map_err(|e| gkq_format::error_chain(&e))?;
        assert_eq!(block.name, EMBED);
        Ok(v)
    };
    let want = values(&v4).expect("v4 block");
    // a row file over the store's cap is refused before room for its rows
    // is taken (what a hostile knot claims is never allocated)
    let mut small = ReaderConfig::default();
    small.store.max_read_bytes = 1 << 20;
    let knot = one.join("model.knot");
    let r = Reader::open(knot.to_str().expect("utf8"), small, Serve::INPUT).expect("open");
    let err = gkq_format::error_chain(&r.block_values(EMBED).expect_err("over the cap"));
    let file = fs::metadata(one.join(OBJECT)).expect("rows").len();
    let whole = format!("is {file} bytes, over the 1048576-byte limit");
    assert!(err.contains(OBJECT) && err.contains(&whole), "{err}");
    let got = values(&one).expect("block");
    assert!(got[..] == want[..], "the block's values, from three steps");
    let path = one.join(OBJECT);
    let clean = fs::read(&path).expect("rows");
    let stride = clean.len() / 4096;
    assert!(clean.len() > 2 * (4 << 20), "more than two steps");
    let last = clean.len() - 1;
    for at in [5, 4000 * stride + 17, 100 * stride + 2048 + 40, last] {
        let mut bad = clean.clone();
        bad[at] ^= 0x40;
        fs::write(&path, &bad).expect("tamper");
        let msg = values(&one).expect_err("a tampered row file");
        assert!(
            msg.contains(OBJECT) && msg.contains("sha256"),
            "byte {at}: {msg}"
        );
    }
    fs::write(&path, &clean[..clean.len() - stride]).expect("cut");
    let msg = values(&one).expect_err("a row file cut short");
    assert!(msg.contains(OBJECT), "{msg}");
    fs::write(&path, &clean).expect("restore");
    assert!(values(&one).expect("restored")[..] == want[..]);
}
