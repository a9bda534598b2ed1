//! The warm object (issue 33, FORMAT.md 7d) against nginx: a cold node seeds
//! its LRU in one range request and then serves the warm rows with none; a
//! warm restart reads them from the disk cache with no request; the async
//! and blocking faces give the same; a warm object that is missing, of
//! another length or with a bad chunk table is reported and not used, and a
//! row that fails its proof is not used either; the rows are right in
//! every case.

use std::path::{Path, PathBuf};

use fixtures::servers::{Nginx, NginxOptions};
use gkq_format::DType;
use gkq_reader::{AsyncReader, Reader, ReaderConfig, Serve, WarmReport, WarmUnused};

/// Scattered over the 512-row vocabulary, as frequent ids are.
const WARM: [u64; 12] = [0, 1, 2, 3, 17, 42, 100, 200, 300, 400, 500, 511];

struct Site {
    tmp: tempfile::TempDir,
    nginx: Nginx,
}

impl Site {
    fn url(&self, name: &str) -> String {
        format!("{}/m/{name}", self.nginx.url())
    }
    fn pkg(&self) -> PathBuf {
        self.tmp.path().join("www/m")
    }
    /// The warm object of the row file a node reads (bf16: exact for a bf16 source).
    fn warm_object(&self) -> PathBuf {
        self.pkg().join("token_embd.bf16.rows.warm")
    }
}

fn site() -> Site {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    fixtures::write_model(&src, &fixtures::preset("qwen2-tiny-bf16").expect("preset"))
        .expect("fixture");
    let ids = tmp.path().join("warm.txt");
    std::fs::write(&ids, "511 0 1 2 3 17 42 100 200 300 400 500").expect("ids");
    let mut opts = gkq_pack::PackOptions::new(&src, tmp.path().join("www/m"));
    opts.dtypes = vec![DType::F32, DType::BF16];
    opts.warm.ids = Some(ids);
    let r = gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    assert_eq!(r.warm.expect("warm set").rows, WARM.len());
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx (scripts/install-test-deps.sh)");
    Site { tmp, nginx }
}

fn config(s: &Site, cache: Option<&Path>) -> ReaderConfig {
    let mut c = ReaderConfig {
        columnar_embed: Some(s.url("")),
        require_columnar: true,
        warm: true,
        ..ReaderConfig::default()
    };
    c.cache.dir = cache.map(Path::to_path_buf);
    c
}

/// The rows of `ids` read by `r`, each checked against the knot's block.
fn check_rows(s: &Site, r: &Reader, ids: &[u64]) {
    let rows = r.embedding().expect("input").rows(ids).expect("rows");
    for (i, &id) in ids.iter().enumerate() {
        let want = fixtures::knots::dense_row(&s.pkg(), id, DType::BF16);
        assert_eq!(rows.bytes(i).expect("row"), &want[..], "row {id}");
    }
}

fn open(s: &Site, c: ReaderConfig) -> (Reader, WarmReport) {
    let r = Reader::open(&s.url("model.knot"), c, Serve::INPUT).expect("open");
    let w = r
        .embedding()
        .expect("input")
        .warm_report()
        .expect("warmed at open");
    (r, w)
}

#[test]
fn a_cold_node_warms_in_one_request_and_a_restart_in_none() {
    let s = site();
    let cache = s.tmp.path().join("cache");
    let (r, w) = open(&s, config(&s, Some(&cache)));
    assert_eq!(w.unused, None, "{w:?}");
    assert_eq!(
        (w.listed, w.seeded, w.rejected, w.requests),
        (12, 12, 0, 1),
        "{w:?}"
    );
    let len = std::fs::metadata(s.warm_object()).expect("warm").len();
    assert_eq!(w.bytes, len, "the whole object, table included");
    assert!(
        w.object
            .as_deref()
            .is_some_and(|o| o.ends_with("token_embd.bf16.rows.warm"))
    );
    let before = r.net_stats();
    check_rows(&s, &r, &WARM);
    assert_eq!(
        r.net_stats().since(&before).requests,
        0,
        "warm rows are hits"
    );
    // a row outside the set: one run from the runs object, the table at hand
    check_rows(&s, &r, &[250]);
    assert_eq!(r.net_stats().since(&before).requests, 1);
    drop(r);
    // a restart with the disk cache: the table and every warm row are there
    let (r, w) = open(&s, config(&s, Some(&cache)));
    assert_eq!((w.seeded, w.from_disk, w.requests), (12, 12, 0), "{w:?}");
    let before = r.net_stats();
    check_rows(&s, &r, &WARM);
    assert_eq!(r.net_stats().since(&before).requests, 0);
}

#[test]
fn the_async_and_blocking_faces_warm_alike() {
    let s = site();
    let mut c = config(&s, None);
    c.warm = false;
    let (r, none) = {
        let r = Reader::open(&s.url("model.knot"), c.clone(), Serve::INPUT).expect("open");
        let w = r.embedding().expect("input").warm_report();
        (r, w)
    };
    assert_eq!(none, None, "no warm-up unless asked");
    let blocking = r.embedding().expect("input").warm().expect("warm");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let asynchronous = rt.block_on(async {
        let r = AsyncReader::open(&s.url("model.knot"), c, Serve::INPUT)
            .await
            .expect("open");
        let w = r.embedding().expect("input").warm().await.expect("warm");
        assert_eq!(r.embedding().expect("input").warm_report(), Some(w.clone()));
        w
    });
    assert_eq!(blocking, asynchronous);
    assert_eq!((blocking.seeded, blocking.requests), (12, 1));
}

#[test]
fn a_warm_object_that_fails_is_not_used_and_the_rows_stay_right() {
    let s = site();
    let good = std::fs::read(s.warm_object()).expect("warm");
    let failed = |w: &WarmReport, says: &str| {
        assert_eq!(w.seeded, 0, "{w:?}");
        match &w.unused {
            Some(WarmUnused::Failed { error }) => assert!(error.contains(says), "{error}"),
            other => panic!("{other:?}"),
        }
    };
    // missing
    std::fs::remove_file(s.warm_object()).expect("rm");
    let (r, w) = open(&s, config(&s, None));
    failed(&w, "404");
    check_rows(&s, &r, &WARM);
    // another length
    std::fs::write(s.warm_object(), &good[..good.len() - 1]).expect("write");
    let (r, w) = open(&s, config(&s, None));
    failed(&w, "Content-Range");
    check_rows(&s, &r, &WARM);
    // a chunk table that fails its root (fetched twice, then given up)
    let mut bad = good.clone();
    bad[5] ^= 1;
    std::fs::write(s.warm_object(), &bad).expect("write");
    let (r, w) = open(&s, config(&s, None));
    failed(&w, "merkle_root");
    assert_eq!(w.requests, 2, "{w:?}");
    check_rows(&s, &r, &WARM);
    // one row's byte: that row is not used, the others are
    let mut bad = good.clone();
    let stride = {
        let knot = std::fs::read(s.pkg().join("model.knot")).expect("knot");
        let knot = gkq_format::Knot::parse(&knot).expect("knot");
        let d = knot
            .blocks()
            .iter()
            .flat_map(|b| &b.columnar)
            .find(|d| d.dtype == DType::BF16)
            .expect("bf16 rows")
            .clone();
        gkq_format::warm::WarmLayout::of(&d, 12)
            .expect("layout")
            .stride() as usize
    };
    let last = bad.len() - stride; // the first byte of the last entry's row
    bad[last] ^= 1;
    std::fs::write(s.warm_object(), &bad).expect("write");
    let (r, w) = open(&s, config(&s, None));
    assert_eq!(w.unused, None, "{w:?}");
    assert_eq!((w.seeded, w.rejected), (11, 1), "{w:?}");
    let before = r.net_stats();
    check_rows(&s, &r, &WARM);
    assert_eq!(
        r.net_stats().since(&before).requests,
        1,
        "the bad row on demand"
    );
    // a package without a warm object: nothing to do, said so
    std::fs::write(s.warm_object(), &good).expect("write");
    let plain = s.tmp.path().join("www/plain");
    let src = s.tmp.path().join("src");
    let mut opts = gkq_pack::PackOptions::new(&src, &plain);
    opts.dtypes = vec![DType::F32, DType::BF16];
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let mut c = config(&s, None);
    c.columnar_embed = Some(format!("{}/plain/", s.nginx.url()));
    let r = Reader::open(
        &format!("{}/plain/model.knot", s.nginx.url()),
        c,
        Serve::INPUT,
    )
    .expect("open");
    let w = r.embedding().expect("input").warm_report().expect("report");
    assert_eq!(w.unused, Some(WarmUnused::NoWarmObject));
    assert_eq!(w.requests, 0);
}
