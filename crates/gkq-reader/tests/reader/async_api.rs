//! Issue 24 against nginx: the async API gives the blocking API's verified
//! rows and lm_head bit for bit (TLS + HTTP/2, cold and warm); 64 tasks on
//! one reader fetch each row once; a dropped future cancels its requests
//! and leaves the reader usable; the blocking API inside a runtime is an
//! error, never a panic; the tokio example runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fixtures::servers::{Nginx, NginxOptions, TestCa, WireProxy};
use gkq_format::DType;
use gkq_reader::{
    AsyncReader, PullItem, PullPlan, Pulled, Reader, ReaderConfig, ReaderError, Serve,
};
use gkq_store::StoreError;

struct Site {
    _tmp: tempfile::TempDir,
    nginx: Nginx,
    ca: Option<TestCa>,
}

impl Site {
    fn url(&self, name: &str) -> String {
        format!("{}/m/{name}", self.nginx.url())
    }
}

fn site(preset: &str, tls: bool, extra: &str) -> Site {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    fixtures::write_model(&src, &fixtures::preset(preset).expect("preset")).expect("fixture");
    let mut opts = gkq_pack::PackOptions::new(&src, tmp.path().join("www/m"));
    opts.dtypes = vec![DType::F32, DType::BF16];
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let ca = tls.then(|| TestCa::generate(&tmp.path().join("ca")).expect("openssl"));
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions {
            tls: ca.as_ref().map(|c| c.server.clone()),
            http2: tls,
            extra: extra.to_owned(),
            ..NginxOptions::default()
        },
    )
    .expect("nginx (scripts/install-test-deps.sh)");
    Site {
        _tmp: tmp,
        nginx,
        ca,
    }
}

fn config(s: &Site) -> ReaderConfig {
    let mut c = ReaderConfig {
        columnar_embed: Some(s.url("")),
        require_columnar: true,
        ..ReaderConfig::default()
    };
    c.store.ca_certs = s.ca.iter().map(|c| c.ca.clone()).collect();
    c
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

const IDS: [u32; 7] = [3, 17, 3, 400, 511, 0, 42];

#[test]
fn async_and_blocking_give_the_same_verified_bytes_cold_and_warm() {
    let s = site("qwen2-tiny-bf16", true, "");
    let blocking = Reader::open(&s.url("model.knot"), config(&s), Serve::ALL).expect("open");
    let e = blocking.embedding().expect("input");
    let rows: Vec<Vec<u8>> = {
        let r = e.rows(&IDS).expect("rows");
        (0..r.len())
            .map(|i| r.bytes(i).expect("row").to_vec())
            .collect()
    };
    let lm = blocking
        .lm_head()
        .expect("output")
        .matrix()
        .expect("lm_head");
    assert!(blocking.net_stats().connections >= 1);
    runtime().block_on(async {
        let r = AsyncReader::open(&s.url("model.knot"), config(&s), Serve::ALL)
            .await
            .expect("async open");
        for round in ["cold", "warm"] {
            let got = r
                .embedding()
                .expect("input")
                .rows(&IDS)
                .await
                .expect("rows");
            for (i, want) in rows.iter().enumerate() {
                assert!(
                    got.bytes(i).expect("row") == want.as_slice(),
                    "{round} row {i}"
                );
            }
            let m = r
                .lm_head()
                .expect("output")
                .matrix()
                .await
                .expect("lm_head");
            assert_eq!(m.dtype(), lm.dtype());
            assert!(m.bytes()[..] == lm.bytes()[..], "{round} lm_head");
        }
        assert!(
            r.embedding()
                .expect("input")
                .resolution()
                .reason()
                .contains("bf16.rows")
        );
    });
}

#[test]
fn sixty_four_tasks_on_one_reader_fetch_each_row_once() {
    let s = site("llama-tiny-f32", true, "");
    runtime().block_on(async {
        let r = AsyncReader::open(&s.url("model.knot"), config(&s), Serve::INPUT)
            .await
            .expect("open");
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..64u32 {
            let r = r.clone();
            // overlapping sets, ids three apart (no gap rows are coalesced in)
            let ids: Vec<u32> = (0..8).map(|k| ((t % 8) + k) * 3).collect();
            tasks.spawn(async move {
                let rows = r.embedding()?.rows(&ids).await?;
                Ok::<_, ReaderError>((ids, rows.to_f32()?))
            });
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut answers = Vec::new();
        while let Some(done) = tasks.join_next().await {
            let (ids, values) = done.expect("task").expect("no error");
            seen.extend(ids.iter().copied());
            answers.push((ids, values));
        }
        let stats = r.embedding().expect("input").cache_stats();
        assert_eq!(
            stats.rows_fetched,
            seen.len() as u64,
            "each row fetched once: {stats:?}"
        );
        assert_eq!(stats.rows_rejected, 0);
        // and every answer is the row it asked for
        let one = r
            .embedding()
            .expect("input")
            .rows(&[9u32])
            .await
            .expect("row")
            .to_f32()
            .expect("f32");
        for (ids, values) in answers {
            if let Some(k) = ids.iter().position(|&i| i == 9) {
                assert_eq!(values[k * 64..(k + 1) * 64], one[..]);
            }
        }
    });
}

#[test]
fn a_dropped_future_cancels_its_requests_and_the_reader_stays_usable() {
    // the untied f32 lm_head, 128 KiB, in two parts of 64 KiB one at a
    // time: the first 20 KiB of a response come at once, the rest at
    // 32 KiB/s (1.4 s a part)
    let s = site(
        "llama-tiny-f32",
        false,
        "limit_rate 32k; limit_rate_after 20k;",
    );
    let proxy = WireProxy::start(s.nginx.port(), Duration::ZERO).expect("proxy");
    let base = format!("http://127.0.0.1:{}/m", proxy.port());
    let mut c = ReaderConfig::default();
    c.store.parallel.part_size = 64 << 10;
    c.store.parallel.max_parallel = 1;
    runtime().block_on(async {
        let r = AsyncReader::open(&format!("{base}/model.knot"), c, Serve::ALL)
            .await
            .expect("open");
        let lm = r.lm_head().expect("output");
        let base = proxy.stats().down_bytes;
        // drop the pull once its bytes are arriving (counted at the proxy),
        // whatever the machine's load
        let pulled = |n: u64| proxy.stats().down_bytes > base + n;
        let underway = async {
            while !pulled(24 << 10) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::select! {
            r = lm.matrix() => panic!("finished before it was dropped: {:?}", r.map(|m| m.rows())),
            () = underway => {}
        }
        // the connection goes quiet: nothing more is sent for the dropped pull
        let mut last = proxy.stats().down_bytes;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = proxy.stats().down_bytes;
            if now == last {
                break;
            }
            last = now;
        }
        assert!(
            last - base < 96 << 10,
            "the whole matrix was not pulled: {}",
            last - base
        );
        assert!(!lm.is_resident());
        // still usable: rows, and the lm_head pulled afresh
        let rows = r
            .embedding()
            .expect("input")
            .rows(&[1u32, 2])
            .await
            .expect("rows");
        assert_eq!(rows.len(), 2);
        let m = lm.matrix().await.expect("pulled again");
        assert_eq!((m.rows(), m.cols()), (512, 64));
    });
}

/// A pull hands out its items in plan order, each verified, when the
/// lm_head (two parts here) is started before the blocks that come before
/// it in the plan (issue 45: an item of several parts would otherwise end
/// a pull nearly alone on the link), and with a budget of two items.
#[test]
fn a_pull_hands_out_its_items_in_plan_order_with_the_lm_head_started_first() {
    let s = site("llama-tiny-f32", false, "");
    let mut c = config(&s);
    c.store.parallel.part_size = 64 << 10;
    let knot = Reader::open(&s.url("model.knot"), c.clone(), Serve::ALL).expect("open");
    let blocks = &knot.knot().header().header().blocks;
    let names: Vec<String> = blocks.iter().map(|b| b.name.clone()).collect();
    let mut plan = PullPlan::new().budget(2 << 20);
    let layers = |n: &&String| !n.contains("embed") && !n.contains("lm_head");
    for n in names.iter().filter(layers) {
        plan = plan.block(n.clone());
    }
    let plan = plan.lm_head();
    let want = plan.items().to_vec();
    assert!(want.len() > 3, "{want:?}");
    runtime().block_on(async {
        let r = AsyncReader::open(&s.url("model.knot"), c, Serve::ALL)
            .await
            .expect("open");
        let mut pull = r.pull(plan);
        let mut got = Vec::new();
        while let Some((item, pulled)) = pull.next().await.expect("pulled") {
            match (&item, pulled) {
                (PullItem::Block(n), Pulled::Block { bytes, .. }) => {
                    let (_, direct) = r.block_values(n).await.expect("block");
                    assert_eq!(bytes, direct, "{n}");
                }
                (PullItem::LmHead, Pulled::LmHead(m)) => {
                    assert_eq!((m.rows(), m.cols()), (512, 64))
                }
                (i, _) => panic!("{i:?}: another kind of item"),
            }
            got.push(item);
        }
        assert_eq!(got, want);
    });
}

#[test]
fn the_blocking_api_inside_a_runtime_is_an_error_not_a_panic() {
    let s = site("llama-tiny-f32", false, "");
    let url = s.url("model.knot");
    let outside = Reader::open(&url, ReaderConfig::default(), Serve::ALL).expect("open");
    let rt = runtime();
    rt.block_on(async {
        let e = Reader::open(&url, ReaderConfig::default(), Serve::ALL).expect_err("refused");
        assert!(
            matches!(
                &e,
                ReaderError::Store(StoreError::InsideRuntime {
                    instead: "AsyncReader::open",
                    ..
                })
            ),
            "{e}"
        );
        assert!(e.to_string().contains("use AsyncReader::open"), "{e}");
        // a reader made outside and called inside: the same, for each call
        let e = outside
            .embedding()
            .expect("input")
            .rows(&[1u32])
            .expect_err("refused");
        assert!(e.to_string().contains("AsyncEmbedding::rows"), "{e}");
        let e = outside
            .lm_head()
            .expect("output")
            .matrix()
            .expect_err("refused");
        assert!(e.to_string().contains("AsyncLmHead::matrix"), "{e}");
        drop(outside); // dropping its runtime here does not panic either
    });
}

/// `target/debug/examples/<name>` of this build (cargo test builds them).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/debug/deps");
    dir.join("examples").join(name)
}

#[test]
fn the_tokio_example_serves_concurrent_lookups_against_nginx() {
    let s = site("qwen2-tiny-bf16", false, "");
    let bin = example("tokio_node");
    assert!(bin.is_file(), "{} (built by cargo test)", bin.display());
    let o = std::process::Command::new(&bin)
        .arg(s.url("model.knot"))
        .output()
        .expect("run the example");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // each session's sum, as the blocking reader computes it
    let r =
        Reader::open(&s.url("model.knot"), ReaderConfig::default(), Serve::INPUT).expect("open");
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("session ")).collect();
    assert_eq!(lines.len(), 8, "{out}");
    for l in lines {
        let ids: Vec<u32> = l
            .split_once("ids [")
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(list, _)| list.split(", ").map(|x| x.parse().expect("id")).collect())
            .expect("ids");
        let sum: f64 = r
            .embedding()
            .expect("input")
            .rows(&ids)
            .expect("rows")
            .to_f32()
            .expect("f32")
            .iter()
            .map(|&v| f64::from(v))
            .sum();
        assert!(l.ends_with(&format!("sum {sum:.6}")), "{l} vs {sum:.6}");
    }
    assert!(out.contains("lm_head resident: 512 x 64"), "{out}");
    let sync = std::process::Command::new(example("sync_node"))
        .args([&s.url("model.knot"), "1,2,3"])
        .output()
        .expect("run the sync example");
    assert!(
        sync.status.success(),
        "{}",
        String::from_utf8_lossy(&sync.stderr)
    );
}
