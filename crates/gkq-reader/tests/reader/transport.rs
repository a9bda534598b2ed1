//! Issue 20 against real servers: blocks pulled in parallel parts that the
//! server sees (nginx's access log), a failed part retried alone, corrupt
//! parts that expose nothing (a block, an lm_head row chunk), and the
//! persistent verified cache (corrupt and truncated entries, the bound,
//! a pinned restart with the server gone, a changed knot noticed).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fixtures::servers::{Fault, FaultServer, HoldProxy, Nginx, NginxOptions};
use gkq_format::{DType, Knot, keys};
use gkq_reader::{CacheConfig, PathKind, Reader, ReaderConfig, ReaderError, Serve};

/// A preset packed into `dir/www/m` with `dtypes`.
fn pack(preset: &str, dtypes: &[DType], dir: &Path) -> PathBuf {
    let src = dir.join(format!("src-{preset}"));
    fixtures::write_model(&src, &fixtures::preset(preset).expect("preset")).expect("fixture");
    let out = dir.join("www/m");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    opts.dtypes = dtypes.to_vec();
    // the version 3/4 layout (blocks in the knot, runs objects) these
    // tests exercise; one_copy.rs reads version 5's
    opts.one_copy = false;
    opts.force = true;
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    out
}

/// Small parts, so that the tiny fixtures' blocks have several.
fn config(part: u64) -> ReaderConfig {
    let mut c = ReaderConfig::default();
    c.store.parallel.part_size = part;
    c.store.parallel.max_parallel = 4;
    c.store.retry.backoff = Duration::from_millis(5);
    c.store.timeout = Duration::from_secs(5);
    c
}

/// The payload `(offset, len)` and values of block `name` in the local knot.
fn local_block(out: &Path, name: &str) -> (u64, u64, Vec<u8>) {
    let bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&bytes).expect("valid");
    let i = knot.header().header().block_index(name).expect("block");
    let p = knot.header().payload_of(i).expect("payload");
    (p.offset, p.len, knot.payload(i).expect("payload").to_vec())
}

const EMBED: &str = "model.embed_tokens.weight";

#[test]
fn parallel_parts_cover_each_block_once_several_at_a_time() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack("llama-tiny-f32", &[DType::F32], tmp.path());
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions {
            log_format: Some("$status $http_range $uri".into()),
            ..NginxOptions::default()
        },
    )
    .expect("nginx (scripts/install-test-deps.sh)");
    // answers wait until two parts are asked for together (or 2 s, within
    // the reader's 5 s timeout): the parts' concurrency does not hang on
    // how fast nginx answers on a loaded machine
    let proxy = HoldProxy::start(nginx.port()).expect("proxy");
    let url = format!("{}/m/model.knot", proxy.url());
    let r = Reader::open(&url, config(32 << 10), Serve::NONE).expect("open");
    proxy.hold_until(2, Duration::from_secs(2));
    let (block, values) = r.block_values(EMBED).expect("pulled");
    assert!(
        proxy.released_by_count(),
        "parts were asked for one at a time"
    );
    let (offset, len, want) = local_block(&out, EMBED);
    assert!(values[..] == want[..] && block.name == EMBED);
    // the server's view: the parts of the block, each once, several at a
    // time (nginx logs a request once it has sent it: wait for the last)
    let want = aligned_parts(offset, len, 32 << 10) as usize;
    let mut log = nginx.access_log();
    let t = std::time::Instant::now();
    while log.lines().filter(|l| l.contains("/m/model.knot")).count() < want + 1
        && t.elapsed() < std::time::Duration::from_secs(10)
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
        log = nginx.access_log();
    }
    let mut parts: Vec<(u64, u64)> = Vec::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(range), Some(&"/m/model.knot")) = (f.get(1), f.get(2)) else {
            continue;
        };
        let Some((a, b)) = range.strip_prefix("bytes=").and_then(|r| r.split_once('-')) else {
            continue;
        };
        let (a, b): (u64, u64) = (a.parse().expect("a"), b.parse().expect("b"));
        if a >= offset && b < offset + len {
            assert_eq!(f[0], "206", "{line}");
            parts.push((a, b));
        }
    }
    parts.sort_unstable();
    assert_eq!(
        parts.len(),
        want,
        "{parts:?} offset {offset} len {len}\n{log}"
    );
    let mut next = offset;
    for p in &parts {
        assert_eq!(
            p.0, next,
            "parts cover the block once, with no gap or overlap"
        );
        next = p.1 + 1;
    }
    assert_eq!(next, offset + len);
    // the client's count of parts reading at once: several, never more
    // than max_parallel
    let peak = r.peak_parts_in_flight();
    assert!((2..=4).contains(&peak), "parts in flight at once: {peak}");
}

/// Parts of `len` bytes at `offset` cut on multiples of `part` in the
/// object (issue 32: the same ranges from every node, for a slice cache).
fn aligned_parts(offset: u64, len: u64, part: u64) -> u64 {
    (offset + len).div_ceil(part) - offset / part
}

#[test]
fn a_failed_part_is_retried_alone_and_the_block_verifies() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack("llama-tiny-f32", &[DType::F32], tmp.path());
    let (offset, len, want) = local_block(&out, EMBED);
    for status in [500, 0] {
        let fault = Fault::FailOnce {
            object: "model.knot",
            at: offset + 5 * 8192 + 17,
            status,
        };
        let server = FaultServer::start_dir(&out, fault).expect("server");
        let r = Reader::open(&server.url("model.knot"), config(8192), Serve::NONE).expect("open");
        let before = r.net_stats();
        let (_, values) = r.block_values(EMBED).expect("the failed part is retried");
        assert!(values[..] == want[..]);
        let s = r.net_stats().since(&before);
        // one request per part, and one more: the part that failed, alone
        assert_eq!(
            s.requests,
            aligned_parts(offset, len, 8192) + 1,
            "status {status}: {s:?}"
        );
        assert_eq!(s.retries, 1);
    }
}

#[test]
fn a_corrupt_part_exposes_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack("llama-tiny-f32", &[DType::F32], tmp.path());
    let (offset, _, _) = local_block(&out, EMBED);
    let fault = Fault::Corrupt {
        object: "model.knot",
        at: offset + 3 * 8192 + 100,
    };
    let server = FaultServer::start_dir(&out, fault).expect("server");
    let r = Reader::open(&server.url("model.knot"), config(8192), Serve::NONE).expect("open");
    let e = r.block_values(EMBED).expect_err("never the corrupt bytes");
    let msg = e.to_string();
    assert!(
        matches!(e, ReaderError::Digest { .. })
            && msg.contains(EMBED)
            && msg.contains("fetched twice"),
        "{msg}"
    );
    // another block, untouched, still comes through
    r.block_values("model.norm.weight")
        .expect("an intact block");
}

/// The f32 + bf16 package of a bf16 source: the untied lm_head is pulled
/// from its exact bf16 rows. A corrupt chunk of them never reaches the
/// matrix: the dense block is pulled instead, or with --require-columnar
/// the pull fails.
#[test]
fn a_corrupt_lm_head_row_chunk_exposes_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack("llama-tiny-bf16", &[DType::F32, DType::BF16], tmp.path());
    let (_, _, want) = local_block(&out, "lm_head.weight");
    let fault = Fault::Corrupt {
        object: "lm_head.bf16.rows",
        at: 300 * 128 + 5,
    };
    let server = FaultServer::start_dir(&out, fault).expect("server");
    let r = Reader::open(&server.url("model.knot"), config(16 * 128), Serve::OUTPUT).expect("open");
    let lm = r.lm_head().expect("output role");
    assert_eq!(
        lm.resolution().kind(),
        PathKind::Columnar,
        "{}",
        lm.resolution().reason()
    );
    let m = lm.matrix().expect("the dense block instead");
    assert_eq!(m.dtype(), DType::F32);
    assert!(m.bytes()[..] == want[..]);
    let res = lm.resolution();
    assert_eq!(res.kind(), PathKind::Dense);
    assert!(
        res.reason().contains("fail verification"),
        "{}",
        res.reason()
    );
    let mut c = config(16 * 128);
    c.require_columnar = true;
    let r = Reader::open(&server.url("model.knot"), c, Serve::OUTPUT).expect("open");
    let e = r.lm_head().expect("lm").matrix().expect_err("required");
    assert!(e.to_string().contains("lm_head.bf16.rows"), "{e}");
}

fn cached(dir: &Path, max: u64) -> ReaderConfig {
    ReaderConfig {
        cache: CacheConfig {
            dir: Some(dir.to_path_buf()),
            max_bytes: max,
            explicit: true,
        },
        ..config(8192)
    }
}

fn blob_of(cache: &Path, want: &[u8]) -> PathBuf {
    let name = gkq_format::hex(&<sha2::Sha256 as sha2::Digest>::digest(want));
    cache.join("v1/blob").join(name)
}

#[test]
fn corrupt_and_truncated_cache_entries_are_fetched_again() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack("llama-tiny-f32", &[DType::F32], tmp.path());
    let server = FaultServer::start_dir(&out, Fault::None).expect("server");
    let url = server.url("model.knot");
    let cache = tmp.path().join("cache");
    let (_, _, want) = local_block(&out, EMBED);
    let r = Reader::open(&url, cached(&cache, 1 << 30), Serve::NONE).expect("cold");
    r.block_values(EMBED).expect("pulled");
    let entry = blob_of(&cache, &want);
    assert!(entry.is_file(), "cached by its sha256");
    for damage in ["flip", "truncate"] {
        let mut b = fs::read(&entry).expect("entry");
        if damage == "flip" {
            b[1000] ^= 1;
        } else {
            b.truncate(b.len() / 2);
        }
        fs::write(&entry, &b).expect("damage");
        let r = Reader::open(&url, cached(&cache, 1 << 30), Serve::NONE).expect("warm");
        let before = r.net_stats();
        let (_, values) = r.block_values(EMBED).expect("fetched again");
        assert!(values[..] == want[..], "{damage}");
        assert_eq!(r.disk_stats().corrupt, 1, "{damage}");
        assert!(r.net_stats().since(&before).payload_bytes >= want.len() as u64);
        assert!(
            fs::read(&entry).expect("rewritten")[..] == want[..],
            "{damage}"
        );
    }
}

#[test]
fn eviction_keeps_the_cache_within_its_bound() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack("llama-tiny-f32", &[DType::F32], tmp.path());
    let server = FaultServer::start_dir(&out, Fault::None).expect("server");
    let cache = tmp.path().join("cache");
    let bound = 100 << 10;
    let r = Reader::open(
        &server.url("model.knot"),
        cached(&cache, bound),
        Serve::NONE,
    )
    .expect("open");
    let names: Vec<String> = r
        .knot()
        .header()
        .header()
        .blocks
        .iter()
        .map(|b| b.name.clone())
        .collect();
    for n in &names {
        r.block_values(n).expect("block");
    }
    let total: u64 = walk(&cache.join("v1"));
    assert!(total <= bound, "{total} > {bound}");
    assert!(r.disk_stats().evicted > 0);
}

fn walk(dir: &Path) -> u64 {
    let mut n = 0;
    for e in fs::read_dir(dir).expect("dir").flatten() {
        let m = e.metadata().expect("meta");
        n += if m.is_dir() { walk(&e.path()) } else { m.len() };
    }
    n
}

/// What a node reads: rows, the lm_head, every block.
fn read_all(r: &Reader) -> (Vec<f32>, Vec<u8>, Vec<Vec<u8>>) {
    let rows = r
        .embedding()
        .expect("input")
        .rows(&[1u64, 5, 300, 5])
        .expect("rows")
        .to_f32()
        .expect("f32");
    let lm = r.lm_head().expect("output").matrix().expect("lm_head");
    let blocks = ["model.layers.0.mlp.up_proj.weight", "model.norm.weight"]
        .iter()
        .map(|n| r.block_values(n).expect("block").1.to_vec())
        .collect();
    (rows, lm.bytes().to_vec(), blocks)
}

#[test]
fn a_pinned_warm_restart_needs_no_server_and_a_changed_knot_is_noticed() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack("qwen2-tiny-bf16", &[DType::F32, DType::BF16], tmp.path());
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let base = format!("{}/m", nginx.url());
    let cache = tmp.path().join("cache");
    let with = |pin: Option<&str>| ReaderConfig {
        columnar_embed: Some(format!("{base}/")),
        require_columnar: true,
        knot_id: pin.map(|p| p.parse().expect("a knot id")),
        ..cached(&cache, 1 << 30)
    };
    let cold = Reader::open(&format!("{base}/model.knot"), with(None), Serve::ALL).expect("cold");
    let id = cold.knot_id();
    let want = read_all(&cold);
    assert!(cold.net_stats().payload_bytes > 0);
    // the same knot, changed: another model at the same URL (no pin)
    let other = tmp.path().join("other");
    fs::create_dir_all(&other).expect("dir");
    let out2 = pack("llama-tiny-bf16", &[DType::F32, DType::BF16], &other);
    let nginx2 = Nginx::start(
        &other.join("www"),
        &other.join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    drop(nginx);
    // the pinned restart: the first server is gone, nothing is requested
    let warm = Reader::open(&format!("{base}/model.knot"), with(Some(&id)), Serve::ALL)
        .expect("pinned restart from the cache");
    assert!(warm.knot().header_from_cache());
    assert!(read_all(&warm) == want, "the same bytes from the cache");
    assert_eq!(warm.net_stats().requests, 0, "{:?}", warm.net_stats());
    // unpinned, the header is read again: the other model is noticed
    let moved = format!("{}/m/model.knot", nginx2.url());
    let r = Reader::open(
        &moved,
        ReaderConfig {
            columnar_embed: None,
            require_columnar: false,
            ..with(None)
        },
        Serve::INPUT,
    )
    .expect("open");
    let bytes2 = fs::read(out2.join("model.knot")).expect("knot");
    let knot2 = Knot::parse(&bytes2).expect("valid");
    assert_eq!(
        r.knot_id(),
        gkq_format::hex(&knot2.header().preamble().header_sha256)
    );
    assert_ne!(r.knot_id(), id);
    assert_eq!(
        r.knot().header().header().meta_str(keys::ARCHITECTURE),
        Some("LlamaForCausalLM")
    );
    // pinned to the first model, the node keeps using it: from the cache,
    // whatever the URL serves now (a block it lacked would fail its digest)
    let pinned = Reader::open(&moved, with(Some(&id)), Serve::INPUT).expect("from the cache");
    assert_eq!(pinned.knot_id(), id);
    assert!(pinned.knot().header_from_cache());
    // issue 35: a block the cache lacks fails its digest at this URL, and
    // the node says why: the URL now serves another knot
    for kind in ["blob", "rows", "table"] {
        fs::remove_dir_all(cache.join("v1").join(kind)).expect("emptied");
    }
    let pinned = Reader::open(&moved, with(Some(&id)), Serve::NONE).expect("from the cache");
    let name = &pinned.knot().header().header().blocks[0].name;
    let e = pinned.block_values(name).expect_err("another knot");
    assert!(
        matches!(&e, gkq_reader::ReaderError::KnotId { expected, found, .. }
            if *expected == id && *found == r.knot_id()),
        "{e}"
    );
    assert!(
        e.to_string().contains("the URL now serves another model"),
        "{e}"
    );
    let _ = out;
}

/// Issue 34, item 7: a tied model read from its dense block (`--dense`) pulls its
/// one matrix once, for the rows and for the resident lm_head (it pulled
/// the embedding block twice: 9.02 MB at the origin for a 4.83 MB knot).
#[test]
fn a_tied_model_pulls_its_matrix_once_for_both_roles() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack("qwen2-tiny-f32", &[DType::F32], tmp.path());
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let (_, len, values) = local_block(&out, EMBED);
    let r = Reader::open(
        &format!("{}/m/model.knot", nginx.url()),
        ReaderConfig {
            dense: true,
            ..config(8192)
        },
        Serve::ALL,
    )
    .expect("open");
    let opened = r.net_stats().payload_bytes;
    let e = r.embedding().expect("input");
    assert_eq!(e.resolution().kind(), PathKind::Dense);
    let rows = e.rows(&[3u64, 500]).expect("rows");
    let row = 64 * 4;
    assert_eq!(rows.bytes(0).expect("row"), &values[3 * row..4 * row]);
    let m = r.lm_head().expect("output").matrix().expect("lm_head");
    assert_eq!(&m.bytes()[..], &values[..], "the same matrix");
    let pulled = r.net_stats().payload_bytes - opened;
    assert_eq!(pulled, len, "the block once, for both roles");
    assert_eq!(
        e.fetched_bytes() + r.lm_head().expect("lm").fetched_bytes(),
        len
    );
}

/// Issue 34, item 7: with a tied lm_head forced to a row file that is not
/// exact (`--lm-head-dtype bf16` of an f32 block), the embedding's rows
/// still come from its exact row file, never from that lossy matrix.
#[test]
fn a_lossy_forced_lm_head_never_serves_embedding_rows() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack("qwen2-tiny-f32", &[DType::F32, DType::BF16], tmp.path());
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let base = format!("{}/m", nginx.url());
    let c = ReaderConfig {
        columnar_embed: Some(format!("{base}/")),
        lm_head_dtype: Some(DType::BF16),
        ..config(8192)
    };
    let r = Reader::open(&format!("{base}/model.knot"), c, Serve::ALL).expect("open");
    let m = r.lm_head().expect("output").matrix().expect("lm_head");
    assert!(!m.is_exact() && m.dtype() == DType::BF16);
    let e = r.embedding().expect("input");
    let res = e.resolution();
    assert!(
        res.columnar()
            .is_some_and(|c| c.desc.is_block_exact() && c.desc.dtype == DType::F32),
        "{}",
        res.reason()
    );
    let rows = e.rows(&[3u64]).expect("rows");
    let (_, _, values) = local_block(&out, EMBED);
    assert_eq!(rows.dtype(), DType::F32);
    assert_eq!(
        rows.bytes(0).expect("row"),
        &values[3 * 256..4 * 256],
        "exact"
    );
}
