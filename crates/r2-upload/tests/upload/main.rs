//! Uploads against a real S3-compatible server (s3s-fs, SigV4 enforced) on
//! 127.0.0.1, started here; nginx over its data directory plays R2's public
//! bucket URL.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fixtures::servers::{Nginx, NginxOptions, S3_ACCESS_KEY, S3_SECRET_KEY, S3sFs};
use r2_upload::{LocalObject, ObjectKind, Progress, UploadError, UploadOptions, Uploader};

const BUCKET: &str = "models";

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

async fn uploader(url: &str, secret: &str, part_mib: u64) -> Uploader {
    let opts = UploadOptions {
        part_size: Some(part_mib << 20),
        concurrency: 4,
        retry: gkq_store::RetryPolicy {
            attempts: 2,
            ..r2_upload::UPLOAD_RETRY
        },
        replace: false,
    };
    uploader_to(url, secret, BUCKET, opts).await
}

/// An uploader for `bucket` at `url` with the test credentials and `secret`.
async fn uploader_to(url: &str, secret: &str, bucket: &str, opts: UploadOptions) -> Uploader {
    let creds = gkq_store::s3::credentials(&env(&[
        ("R2_ACCESS_KEY_ID", S3_ACCESS_KEY),
        ("R2_SECRET_ACCESS_KEY", secret),
    ]))
    .await
    .expect("credentials");
    let ep = gkq_store::s3::endpoint(Some(url), None, &env(&[])).expect("endpoint");
    assert_eq!(ep.region, "auto");
    let client = gkq_store::s3::client(&ep, creds, &opts.retry);
    Uploader::new(client, bucket, &ep.url, opts)
}

/// A tiny tied model (single PutObjects) or an untied one with 32 MiB row files.
fn packed(tmp: &Path, big: bool) -> PathBuf {
    let spec = if big {
        fixtures::Spec {
            vocab: 32_768,
            hidden: 256,
            intermediate: 64,
            layers: 1,
            heads: 2,
            kv_heads: 1,
            ..fixtures::Spec::tiny(fixtures::Arch::Llama, fixtures::FDtype::BF16)
        }
    } else {
        fixtures::preset("qwen2-tiny-f32").expect("preset")
    };
    let src = tmp.join("model");
    fixtures::write_model(&src, &spec).expect("fixture");
    let out = tmp.join("out");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    if !big {
        // a warm object (FORMAT.md 7d) is published like the other objects
        let ids = tmp.join("warm.txt");
        std::fs::write(&ids, "1 2 3 100").expect("ids");
        opts.warm.ids = Some(ids);
    }
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    out
}

fn server(tmp: &Path) -> S3sFs {
    let s3 = S3sFs::start(&tmp.join("s3")).expect("start s3s-fs (scripts/install-test-deps.sh)");
    fs::create_dir_all(s3.data().join(BUCKET)).expect("bucket");
    s3
}

fn stored(s3: &S3sFs, key: &str) -> PathBuf {
    s3.data().join(BUCKET).join(key)
}

fn assert_published(s3: &S3sFs, objects: &[LocalObject]) {
    for o in objects {
        let got = fs::read(stored(s3, &o.key)).unwrap_or_else(|e| panic!("{}: {e}", o.key));
        assert!(
            got == fs::read(&o.path).expect("local"),
            "{} differs from {}",
            o.key,
            o.path.display()
        );
    }
    // the knot was written after every row file
    let mtime = |k: &str| {
        fs::metadata(stored(s3, k))
            .expect("stored")
            .modified()
            .expect("mtime")
    };
    let knot = objects
        .iter()
        .find(|o| o.kind == ObjectKind::Knot)
        .expect("knot");
    assert!(
        objects
            .iter()
            .any(|o| o.kind == ObjectKind::Companion && o.key.ends_with("/config.json")),
        "config.json is published"
    );
    for o in objects.iter().filter(|o| o.kind != ObjectKind::Knot) {
        assert!(
            mtime(&o.key) <= mtime(&knot.key),
            "{} stored after the knot",
            o.key
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_and_multipart_uploads_then_skip_on_rerun() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s3 = server(tmp.path());
    for (big, prefix) in [(false, "tiny/v1"), (true, "big/v1")] {
        let out = packed(&tmp.path().join(prefix), big);
        let objects = r2_upload::prepare(&out, prefix).expect("prepare");
        assert_eq!(
            objects.last().expect("knot").kind,
            ObjectKind::Knot,
            "knot last"
        );
        assert_eq!(
            objects.iter().any(|o| o.kind == ObjectKind::Warm),
            !big,
            "the warm object is published"
        );
        let up = uploader(&s3.url(), S3_SECRET_KEY, 5).await;
        up.check_bucket().await.expect("bucket exists");
        let reports = up
            .publish(&objects, &r2_upload::NoProgress)
            .await
            .expect("publish");
        assert_eq!(reports.len(), objects.len());
        for (r, o) in reports.iter().zip(&objects) {
            assert_eq!(r.status, "uploaded");
            let expected_parts = if o.bytes > 5 << 20 {
                o.bytes.div_ceil(5 << 20)
            } else {
                1
            };
            assert_eq!(r.parts, expected_parts, "{}", o.key);
            // HEAD: length and sha256 metadata
            let (len, sha) = up.head(&o.key).await.expect("head").expect("exists");
            assert_eq!(len, o.bytes);
            assert_eq!(sha.as_deref(), Some(o.sha256.as_str()));
        }
        if big {
            assert!(
                reports.iter().any(|r| r.parts > 5),
                "a multipart upload happened"
            );
        }
        assert_published(&s3, &objects);
        // second run: nothing sent
        let again = up
            .publish(&objects, &r2_upload::NoProgress)
            .await
            .expect("re-run");
        assert!(again.iter().all(|r| r.status == "skipped" && r.parts == 0));
    }
}

/// Kills the server once `after` bytes have been reported done.
struct KillAfter {
    s3: Arc<Mutex<S3sFs>>,
    after: u64,
    done: AtomicU64,
}

impl Progress for KillAfter {
    fn advance(&self, bytes: u64) {
        let d = self.done.fetch_add(bytes, Ordering::SeqCst) + bytes;
        if d >= self.after && d - bytes < self.after {
            self.s3.lock().expect("lock").stop();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_after_the_server_dies_mid_multipart() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s3 = Arc::new(Mutex::new(server(tmp.path())));
    let url = s3.lock().expect("lock").url();
    let out = packed(tmp.path(), true);
    let objects = r2_upload::prepare(&out, "big/v2").expect("prepare");
    // a row file, its proof object, the next row file
    assert!(objects.len() >= 4 && objects[0].bytes > 10 << 20 && objects[2].bytes > 10 << 20);
    assert!(
        objects[1].key.ends_with(".rows.proof"),
        "{}",
        objects[1].key
    );
    let up = uploader(&url, S3_SECRET_KEY, 5).await;
    // die after the first row file, its proof and two parts of the second
    let kill = KillAfter {
        s3: s3.clone(),
        after: objects[0].bytes + objects[1].bytes + (10 << 20),
        done: AtomicU64::new(0),
    };
    let err = up
        .publish(&objects, &kill)
        .await
        .expect_err("the server died");
    // refused connections once it is gone, or a reset in the middle of a part
    assert!(
        matches!(
            err,
            UploadError::Unreachable { .. } | UploadError::S3 { .. }
        ),
        "{err}"
    );
    let data = s3.lock().expect("lock").data().to_path_buf();
    let at = |k: &str| data.join(BUCKET).join(k);
    assert!(
        at(&objects[0].key).exists(),
        "the first row file was complete"
    );
    assert!(
        !at(&objects.last().expect("knot").key).exists(),
        "no knot published before its rows"
    );
    assert!(at(&objects[1].key).exists(), "its proof was complete");
    assert!(!at(&objects[2].key).exists(), "no partial object visible");
    s3.lock().expect("lock").restart().expect("restart");
    let reports = up
        .publish(&objects, &r2_upload::NoProgress)
        .await
        .expect("resume");
    assert!(
        reports[..2].iter().all(|r| r.status == "skipped"),
        "complete objects are not sent again"
    );
    assert!(reports[2..].iter().all(|r| r.status == "uploaded"));
    assert_published(&s3.lock().expect("lock"), &objects);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_a_corrupt_package() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s3 = server(tmp.path());
    let out = packed(tmp.path(), false);
    let rows = out.join("token_embd.f32.rows");
    let mut b = fs::read(&rows).expect("read");
    b[1000] ^= 1;
    fs::write(&rows, b).expect("write");
    match r2_upload::prepare(&out, "x") {
        Err(e @ UploadError::LocalCheck { .. }) => {
            assert!(e.to_string().contains("token_embd.f32.rows"), "{e}")
        }
        other => panic!("expected LocalCheck, got {other:?}"),
    }
    // a knot that does not parse: typed, with the parser's finding as cause
    let knot = fs::read(out.join("model.knot")).expect("knot");
    fs::write(out.join("model.knot"), &knot[..40]).expect("truncate");
    match r2_upload::prepare(&out, "x") {
        Err(UploadError::BadKnot { path, source }) => {
            assert!(path.ends_with("model.knot"), "{path:?}");
            assert!(!source.to_string().is_empty());
        }
        other => panic!("expected BadKnot, got {other:?}"),
    }
    fs::remove_file(out.join("model.knot")).expect("rm");
    match r2_upload::prepare(&out, "x") {
        Err(UploadError::NoKnot { source, .. }) => {
            let io = source
                .downcast_ref::<std::io::Error>()
                .expect("an I/O cause");
            assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected NoKnot, got {other:?}"),
    }
    assert_eq!(
        fs::read_dir(s3.data().join(BUCKET))
            .expect("bucket")
            .count(),
        0,
        "nothing uploaded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_endpoint_and_bucket_errors() {
    // no credentials anywhere: the message names the variables
    let e = gkq_store::s3::credentials(&env(&[("HOME", "/nonexistent")]))
        .await
        .expect_err("no credentials")
        .to_string();
    for v in [
        "R2_ACCESS_KEY_ID",
        "R2_SECRET_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_PROFILE",
    ] {
        assert!(e.contains(v), "{e}");
    }
    assert!(matches!(
        gkq_store::s3::endpoint(None, None, &env(&[])),
        Err(gkq_store::StoreError::NoEndpoint)
    ));
    let ep: gkq_store::s3::Endpoint =
        gkq_store::s3::endpoint(None, None, &env(&[("R2_ACCOUNT_ID", "abc123")]))
            .expect("endpoint");
    assert_eq!(ep.url, "https://abc123.r2.cloudflarestorage.com");

    let tmp = tempfile::tempdir().expect("tmp");
    let s3 = server(tmp.path());
    // wrong secret: refused, and the secret is never in the message
    let wrong = "wrong-secret-do-not-print";
    let e = uploader(&s3.url(), wrong, 5)
        .await
        .check_bucket()
        .await
        .expect_err("bad signature");
    let msg = format!("{e} {e:?}");
    assert!(
        !msg.contains(wrong) && !msg.contains(S3_SECRET_KEY),
        "{msg}"
    );
    assert!(
        msg.contains("403")
            || msg.to_lowercase().contains("signature")
            || msg.contains("AccessDenied"),
        "{msg}"
    );
    // a bucket that does not exist
    let up = uploader_to(
        &s3.url(),
        S3_SECRET_KEY,
        "no-such-bucket",
        UploadOptions::default(),
    )
    .await;
    let e = up.check_bucket().await.expect_err("missing bucket");
    assert!(matches!(e, UploadError::NoBucket { .. }), "{e}");
    // an unreachable endpoint
    let dead = format!(
        "http://127.0.0.1:{}",
        fixtures::servers::free_port().expect("port")
    );
    let e = uploader(&dead, S3_SECRET_KEY, 5)
        .await
        .check_bucket()
        .await
        .expect_err("unreachable")
        .to_string();
    assert!(e.contains(&dead), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_objects_pass_gkq_verify_over_the_public_url() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s3 = server(tmp.path());
    let out = packed(tmp.path(), false);
    let objects = r2_upload::prepare(&out, "qwen/v1").expect("prepare");
    uploader(&s3.url(), S3_SECRET_KEY, 5)
        .await
        .publish(&objects, &r2_upload::NoProgress)
        .await
        .expect("publish");
    let nginx = Nginx::start(
        s3.data(),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let public = format!("{}/{BUCKET}/qwen/v1", nginx.url());
    // the public check is a blocking gate: it runs outside the runtime
    // (inside one, gkq-store's blocking facade refuses, naming the async way)
    std::thread::spawn(move || r2_upload::verify_public(&out, &public))
        .join()
        .expect("join")
        .expect("public checks pass");
}

/// A published prefix is immutable: uploading a different package to it is
/// refused before anything is sent, naming each object and both digests;
/// identical objects are still skipped; `replace` means it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_replace_published_objects() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s3 = server(tmp.path());
    let first = packed(&tmp.path().join("a"), false);
    let objects = r2_upload::prepare(&first, "m/v1").expect("prepare");
    let up = uploader(&s3.url(), S3_SECRET_KEY, 5).await;
    up.publish(&objects, &r2_upload::NoProgress)
        .await
        .expect("first publish");
    let snapshot = |objects: &[LocalObject]| -> Vec<(String, Vec<u8>)> {
        objects
            .iter()
            .map(|o| {
                (
                    o.key.clone(),
                    fs::read(stored(&s3, &o.key)).expect("stored"),
                )
            })
            .collect()
    };
    let before = snapshot(&objects);
    // the same package again: skipped, not a conflict
    let again = up
        .publish(&objects, &r2_upload::NoProgress)
        .await
        .expect("identical objects are skipped");
    assert!(again.iter().all(|r| r.status == "skipped"));
    // a different package (bf16 rows) under the same prefix
    let src = tmp.path().join("b/model");
    fixtures::write_model(&src, &fixtures::preset("qwen2-tiny-f32").expect("preset"))
        .expect("fixture");
    let second = tmp.path().join("b/out");
    let mut opts = gkq_pack::PackOptions::new(&src, &second);
    opts.dtypes = vec![gkq_format::DType::F32, gkq_format::DType::BF16];
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let other = r2_upload::prepare(&second, "m/v1").expect("prepare");
    let e = up
        .publish(&other, &r2_upload::NoProgress)
        .await
        .expect_err("a published prefix is immutable");
    let msg = e.to_string();
    assert!(matches!(e, UploadError::WouldReplace { .. }), "{msg}");
    assert!(
        msg.contains("m/v1/model.knot") && msg.contains("new prefix") && msg.contains("--replace"),
        "{msg}"
    );
    let knot = objects
        .iter()
        .find(|o| o.kind == ObjectKind::Knot)
        .expect("knot");
    assert!(
        msg.contains(&knot.sha256),
        "names the published digest: {msg}"
    );
    assert_eq!(snapshot(&objects), before, "nothing changed on the server");
    assert!(
        !stored(&s3, "m/v1/token_embd.bf16.rows").exists(),
        "not even the new row file was sent"
    );
    // --replace: someone who means it
    let replacing = uploader_to(
        &s3.url(),
        S3_SECRET_KEY,
        BUCKET,
        UploadOptions {
            part_size: Some(5 << 20),
            replace: true,
            ..UploadOptions::default()
        },
    )
    .await;
    replacing
        .publish(&other, &r2_upload::NoProgress)
        .await
        .expect("replace");
    assert_published(&s3, &other);
}

mod races;
