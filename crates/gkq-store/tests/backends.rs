//! One contract for every backend (object_store's `integration.rs` way):
//! the same calls and edge cases against a local file, nginx over HTTP,
//! and s3s-fs over S3, each a real server on 127.0.0.1, and the same
//! answer from each.

use std::path::Path;

use fixtures::servers::{Nginx, NginxOptions, S3_ACCESS_KEY, S3_SECRET_KEY, S3sFs};
use gkq_store::{
    HttpStore, LocalStore, RangeRead, ReadCheck, ReadChecked, ReadOptions, Store, StoreConfig,
    StoreError,
};
use sha2::{Digest, Sha256};

const LEN: usize = 100_003;

fn object() -> Vec<u8> {
    (0..LEN).map(|i| (i * 31 % 251) as u8).collect()
}

fn config() -> StoreConfig {
    let mut c = StoreConfig {
        max_read_bytes: 1 << 20,
        ..StoreConfig::default()
    };
    c.retry.backoff = std::time::Duration::from_millis(5);
    c.parallel.part_size = 8192;
    c
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The contract: `obj` holds [`object`], `missing` names nothing.
async fn contract(name: &str, b: &dyn RangeRead, obj: &str, missing: &str) {
    let data = object();
    let opts = ReadOptions::default();
    // HEAD gives the length
    assert_eq!(b.head(obj).await.expect("head").len, LEN as u64, "{name}");
    // an exact range, into the caller's buffer; the object's length back
    let mut buf = vec![0u8; 1000];
    let total = b.read_into(obj, 500, &mut buf, opts).await.expect("range");
    assert_eq!((total, &buf[..]), (LEN as u64, &data[500..1500]), "{name}");
    // the last byte, and a range given by its inclusive end
    let v = b.read_vec(obj, LEN as u64 - 1, LEN as u64 - 1, opts).await;
    assert_eq!(v.expect("last byte"), data[LEN - 1..], "{name}");
    // a prefix longer than the object is the whole object
    let (all, total) = b.read_prefix(obj, 1 << 19).await.expect("prefix");
    assert_eq!((total, all.len()), (LEN as u64, LEN), "{name}");
    assert!(all == data, "{name}");
    // the edge cases, refused before anything is sent
    let e = b.read_prefix(obj, 0).await.expect_err("empty prefix");
    assert!(matches!(e, StoreError::EmptyRange { .. }), "{name}: {e}");
    let e = b.read_prefix(obj, 2 << 20).await.expect_err("over the cap");
    assert!(
        matches!(e, StoreError::TooLarge { cap, .. } if cap == 1 << 20),
        "{name}: {e}"
    );
    let e = b
        .read_vec(obj, 0, 2 << 20, opts)
        .await
        .expect_err("over the cap");
    assert!(matches!(e, StoreError::TooLarge { .. }), "{name}: {e}");
    let e = b
        .read_into(obj, 0, &mut [], opts)
        .await
        .expect_err("empty buffer");
    assert!(matches!(e, StoreError::EmptyRange { .. }), "{name}: {e}");
    let e = b.read_vec(obj, 10, 9, opts).await.expect_err("reversed");
    assert!(matches!(e, StoreError::EmptyRange { .. }), "{name}: {e}");
    // a range past the end says how long the object is
    let e = b.read_vec(obj, LEN as u64, LEN as u64 + 9, opts).await;
    let e = e.expect_err("past the end");
    assert!(
        matches!(e, StoreError::PastEnd { len, .. } if len == LEN as u64),
        "{name}: {e}"
    );
    // an object of another length than the caller knows
    let wrong = ReadOptions {
        total: Some(LEN as u64 + 1),
        ..opts
    };
    let e = b
        .read_vec(obj, 0, 9, wrong)
        .await
        .expect_err("another length");
    assert!(
        matches!(e, StoreError::ObjectLength { expected, found, .. } if expected == LEN as u64 + 1 && found == LEN as u64),
        "{name}: {e}"
    );
    // a missing object
    let e = b.head(missing).await.expect_err("missing");
    assert!(matches!(e, StoreError::NotFound { .. }), "{name}: {e}");
    let e = b.read_vec(missing, 0, 9, opts).await.expect_err("missing");
    assert!(matches!(e, StoreError::NotFound { .. }), "{name}: {e}");
    // parallel verified parts
    let want: [u8; 32] = Sha256::digest(&data[7..90_007]).into();
    let got = b
        .read_checked(obj, (7, 90_000), Some(LEN as u64), ReadCheck::Sha256(want))
        .await
        .expect("verified");
    assert!(got[..] == data[7..90_007], "{name}");
    let e = b
        .read_checked(obj, (0, 50_000), None, ReadCheck::Sha256([7; 32]))
        .await
        .expect_err("a wrong digest");
    assert!(matches!(e, StoreError::Digest { .. }), "{name}: {e}");
}

/// The S3 backend on `s3`, with the test credentials.
fn s3_store(s3: &S3sFs) -> gkq_store::s3::S3Store {
    let ep = gkq_store::s3::Endpoint {
        url: s3.url(),
        region: "us-east-1".into(),
    };
    let creds = aws_sdk_s3::config::SharedCredentialsProvider::new(
        aws_sdk_s3::config::Credentials::new(S3_ACCESS_KEY, S3_SECRET_KEY, None, None, "test"),
    );
    gkq_store::s3::S3Store::new(&ep, creds, config())
}

/// nginx serving [`object`] as `/object` from `tmp/www`.
fn serving_object(tmp: &Path) -> Nginx {
    write_object(&tmp.join("www"));
    Nginx::start(
        &tmp.join("www"),
        &tmp.join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx (scripts/install-test-deps.sh)")
}

fn write_object(dir: &Path) {
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::write(dir.join("object"), object()).expect("object");
}

#[test]
fn local_files_keep_the_contract() {
    let tmp = tempfile::tempdir().expect("tmp");
    write_object(tmp.path());
    let b = LocalStore::new(&config());
    let at = |n: &str| tmp.path().join(n).display().to_string();
    rt().block_on(contract("local", &b, &at("object"), &at("missing")));
}

/// A local read longer than the blocking pool's 1 MiB pieces comes back
/// whole and in order, from any offset (the pieces keep memory bounded).
#[test]
fn local_reads_longer_than_a_piece_are_whole() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data: Vec<u8> = (0..(5 << 19) + 77)
        .map(|i: usize| (i * 131 % 253) as u8)
        .collect();
    let path = tmp.path().join("big");
    std::fs::write(&path, &data).expect("big");
    let mut c = config();
    c.max_read_bytes = 8 << 20;
    let b = LocalStore::new(&c);
    let at = path.display().to_string();
    for (start, len) in [(0, data.len()), (13, (2 << 20) + 5), (1 << 20, 1 << 20)] {
        let got = rt()
            .block_on(b.read_vec(
                &at,
                start as u64,
                (start + len - 1) as u64,
                ReadOptions::default(),
            ))
            .expect("read");
        assert!(got[..] == data[start..start + len], "{start} {len}");
    }
}

#[test]
fn http_keeps_the_contract() {
    let tmp = tempfile::tempdir().expect("tmp");
    let nginx = serving_object(tmp.path());
    let b = HttpStore::new(config()).expect("client");
    let at = |n: &str| format!("{}/{n}", nginx.url());
    rt().block_on(contract("http", &b, &at("object"), &at("missing")));
    // the router gives the same answers
    let s = Store::new(config()).expect("store");
    rt().block_on(contract("store/http", &s, &at("object"), &at("missing")));
}

#[test]
fn s3_keeps_the_contract() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s3 = S3sFs::start(&tmp.path().join("s3")).expect("s3s-fs (scripts/install-test-deps.sh)");
    write_object(&s3.data().join("bucket"));
    let b = s3_store(&s3);
    rt().block_on(contract(
        "s3",
        &b,
        "s3://bucket/object",
        "s3://bucket/missing",
    ));
    assert!(b.stats().requests > 0);
}

/// Reads a range of `obj`, lets `replace` put another version of the
/// object at its URL, and reads again: the store notices (the validator
/// first seen is not the new version's) and never mixes the two.
async fn replaced_is_noticed(name: &str, b: &dyn RangeRead, obj: &str, replace: impl FnOnce()) {
    let opts = ReadOptions::default();
    let first = b.read_vec(obj, 0, 99, opts).await.expect("first read");
    assert!(first[..] == object()[..100], "{name}");
    replace();
    let e = b
        .read_vec(obj, 100, 199, opts)
        .await
        .expect_err("another version");
    assert!(matches!(e, StoreError::Changed { .. }), "{name}: {e}");
    assert!(e.to_string().contains("changed"), "{name}: {e}");
}

/// Another version of the object in `dir`: other bytes, the same length,
/// a later mtime (nginx's ETag is the mtime in seconds and the length).
fn another_version(dir: &Path) {
    let mut v = object();
    v[150] ^= 0xff;
    let path = dir.join("object");
    std::fs::write(&path, v).expect("write");
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
    let f = std::fs::File::options()
        .write(true)
        .open(&path)
        .expect("open");
    f.set_modified(later).expect("mtime");
}

#[test]
fn an_object_replaced_at_its_url_is_noticed_over_http_and_s3() {
    let tmp = tempfile::tempdir().expect("tmp");
    let www = tmp.path().join("www");
    write_object(&www);
    let nginx = Nginx::start(&www, &tmp.path().join("nginx"), &NginxOptions::default())
        .expect("nginx (scripts/install-test-deps.sh)");
    let http = HttpStore::new(config()).expect("client");
    let url = format!("{}/object", nginx.url());
    rt().block_on(replaced_is_noticed("http", &http, &url, || {
        another_version(&www)
    }));
    let s3 = S3sFs::start(&tmp.path().join("s3")).expect("s3s-fs (scripts/install-test-deps.sh)");
    let bucket = s3.data().join("bucket");
    write_object(&bucket);
    let b = s3_store(&s3);
    rt().block_on(replaced_is_noticed("s3", &b, "s3://bucket/object", || {
        another_version(&bucket)
    }));
}

/// Bytes that fail their check are fetched once more from the origin,
/// unless the store's retry policy makes a single attempt (a gate such as
/// `gkq-verify --url`): then the first answer is the finding.
#[test]
fn failed_checks_are_fetched_again_only_when_the_policy_retries() {
    let tmp = tempfile::tempdir().expect("tmp");
    let nginx = serving_object(tmp.path());
    let url = format!("{}/object", nginx.url());
    for (attempts, fetches) in [(3, 2), (1, 1)] {
        let mut c = config();
        c.retry.attempts = attempts;
        c.parallel.part_size = 1 << 20; // one part a fetch
        let s = Store::new(c).expect("store");
        let read = s.read_checked(&url, (0, 1000), None, ReadCheck::Sha256([7; 32]));
        let e = rt().block_on(read).expect_err("a wrong digest");
        assert!(matches!(e, StoreError::Digest { .. }), "{e}");
        assert_eq!(s.stats().requests, fetches, "{attempts} attempts");
    }
}

/// A small object comes whole in one request, checked, with no HEAD
/// first; a longer one is read once its length is known; bytes that fail
/// the check are fetched once more only when the policy retries, then are
/// the check's error (companion files of a package: `config.json`).
#[test]
fn a_small_object_is_one_checked_request() {
    let tmp = tempfile::tempdir().expect("tmp");
    let nginx = serving_object(tmp.path());
    let url = format!("{}/object", nginx.url());
    let want: [u8; 32] = Sha256::digest(object()).into();
    // whole in the probe: one request; longer than the probe: the probe,
    // then the parts of the object (13 of 8 KiB)
    for (probe, requests) in [(1 << 19, 1), (4096, 1 + 13)] {
        let s = Store::new(config()).expect("store");
        let got = rt().block_on(s.read_small_checked(&url, probe, want));
        assert!(got.expect("checked") == object(), "probe {probe}");
        assert_eq!(s.stats().requests, requests, "probe {probe}");
    }
    for (attempts, requests) in [(3, 2), (1, 1)] {
        let mut c = config();
        c.retry.attempts = attempts;
        let s = Store::new(c).expect("store");
        let e = rt()
            .block_on(s.read_small_checked(&url, 1 << 19, [7; 32]))
            .expect_err("a wrong digest");
        let StoreError::Digest {
            url: at, expected, ..
        } = &e
        else {
            panic!("{e}")
        };
        assert_eq!((at.as_str(), &expected[..4]), (url.as_str(), "0707"), "{e}");
        assert_eq!(s.stats().requests, requests, "{attempts} attempts");
    }
}
