//! What an upload sends is what it checked, and two uploads racing to one
//! prefix never both succeed (issue 22, items 5 to 8).

use std::fs;
use std::path::Path;
use std::sync::Mutex;
use std::sync::mpsc;

use fixtures::servers::S3_SECRET_KEY;
use r2_upload::{LocalObject, ObjectKind, Progress, UploadError, UploadOptions};

use super::{BUCKET, assert_published, packed, server, stored, uploader, uploader_to};

/// Flips one byte in the middle of `path`.
fn flip(path: &Path) {
    let mut b = fs::read(path).expect("read");
    let i = b.len() / 2;
    b[i] ^= 0x01;
    fs::write(path, b).expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_after_the_check_is_not_published() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s3 = server(tmp.path());
    // a single PutObject (tiny) and a multipart upload (big, 5 MiB parts)
    for (big, prefix) in [(false, "tiny/v1"), (true, "big/v1")] {
        let out = packed(&tmp.path().join(prefix), big);
        let objects = r2_upload::prepare(&out, prefix).expect("prepare");
        let rows = objects
            .iter()
            .filter(|o| o.kind == ObjectKind::Rows)
            .max_by_key(|o| o.bytes)
            .expect("a row file");
        // the file changes between the check and the upload
        flip(&rows.path);
        let e = uploader(&s3.url(), S3_SECRET_KEY, 5)
            .await
            .publish(&objects, &r2_upload::NoProgress)
            .await
            .expect_err("a changed file is refused");
        assert!(matches!(e, UploadError::ChangedOnDisk { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(&rows.path.display().to_string()), "{msg}");
        assert!(msg.contains(&rows.sha256), "{msg}");
        assert!(
            !stored(&s3, &rows.key).exists(),
            "{} was published",
            rows.key
        );
        let knot = objects.last().expect("knot");
        assert!(!stored(&s3, &knot.key).exists(), "the knot was published");
    }
}

/// Holds the upload after its first object until released.
struct PauseAfterFirst {
    paused: Mutex<Option<mpsc::Sender<()>>>,
    resume: Mutex<mpsc::Receiver<()>>,
}

impl Progress for PauseAfterFirst {
    fn advance(&self, _bytes: u64) {
        if let Some(tx) = self.paused.lock().expect("lock").take() {
            tx.send(()).expect("test waits");
            self.resume.lock().expect("lock").recv().expect("released");
        }
    }
}

/// Runs `a` until its first object is stored, then `b` whole, then the rest
/// of `a`; returns both results.
async fn race(
    url: &str,
    a: Vec<LocalObject>,
    b: &[LocalObject],
) -> (Result<(), UploadError>, Result<(), UploadError>) {
    let (paused_tx, paused_rx) = mpsc::channel();
    let (resume_tx, resume_rx) = mpsc::channel();
    let url_a = url.to_owned();
    let first = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let pause = PauseAfterFirst {
                paused: Mutex::new(Some(paused_tx)),
                resume: Mutex::new(resume_rx),
            };
            let up = uploader(&url_a, S3_SECRET_KEY, 5).await;
            up.publish(&a, &pause).await.map(|_| ())
        })
    });
    paused_rx.recv().expect("A stored its first object");
    let up = uploader(url, S3_SECRET_KEY, 5).await;
    let rb = up.publish(b, &r2_upload::NoProgress).await.map(|_| ());
    resume_tx.send(()).expect("A waits");
    let ra = first.join().expect("A does not panic");
    (ra, rb)
}

/// Two packages of one model under one prefix: f32 rows (A), bf16 rows (B).
fn two_packages(tmp: &Path, prefix: &str) -> (Vec<LocalObject>, Vec<LocalObject>) {
    let mut out = Vec::new();
    for (name, dtype) in [
        ("a", gkq_format::DType::F32),
        ("b", gkq_format::DType::BF16),
    ] {
        let src = tmp.join(name).join("model");
        let spec = fixtures::preset("qwen2-tiny-f32").expect("preset");
        fixtures::write_model(&src, &spec).expect("fixture");
        let dir = tmp.join(name).join("out");
        let mut opts = gkq_pack::PackOptions::new(&src, &dir);
        opts.dtypes = vec![dtype];
        gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
        out.push(r2_upload::prepare(&dir, prefix).expect("prepare"));
    }
    let b = out.pop().expect("b");
    (out.pop().expect("a"), b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_uploads_to_one_prefix_never_both_succeed() {
    let tmp = tempfile::tempdir().expect("tmp");
    let s3 = server(tmp.path());
    let (a, b) = two_packages(tmp.path(), "race1/v1");

    // A stops after an object B shares byte for byte (config.json), so B's
    // check sees nothing foreign and publishes; A's next new objects then
    // meet B's with If-None-Match: * and the final listing.
    let mut a_shared_first = a.clone();
    let i = a_shared_first
        .iter()
        .position(|o| o.key.ends_with("/config.json"))
        .expect("config.json");
    let config = a_shared_first.remove(i);
    a_shared_first.insert(0, config);
    let (ra, rb) = race(&s3.url(), a_shared_first, &b).await;
    rb.expect("B published first");
    let e = ra.expect_err("A must fail: B's package holds the prefix");
    assert!(
        matches!(e, UploadError::Raced { .. } | UploadError::Mixed { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("race1/v1/"), "{e}");
    // B's package, its knot included, is what the prefix holds
    assert_published(&s3, &b);

    // In the natural order (row files first), A's first object is foreign
    // to B: B refuses before sending anything, and A completes.
    let (a, b) = two_packages(&tmp.path().join("2"), "race2/v1");
    let (ra, rb) = race(&s3.url(), a.clone(), &b).await;
    let e = rb.expect_err("B refuses a prefix holding another package");
    assert!(matches!(e, UploadError::WouldReplace { .. }), "{e}");
    assert!(e.to_string().contains("not part of this package"), "{e}");
    ra.expect("A completes");
    assert_published(&s3, &a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_multipart_uploads_that_cannot_be_listed_are_reported() {
    // s3s-fs answers ListMultipartUploads with 501: the upload goes on, and
    // says what it could not clean up.
    let tmp = tempfile::tempdir().expect("tmp");
    let s3 = server(tmp.path());
    let out = packed(&tmp.path().join("big"), true);
    let objects = r2_upload::prepare(&out, "big/v1").expect("prepare");
    let opts = UploadOptions {
        part_size: Some(5 << 20),
        ..UploadOptions::default()
    };
    let reports = uploader_to(&s3.url(), S3_SECRET_KEY, BUCKET, opts)
        .await
        .publish(&objects, &r2_upload::NoProgress)
        .await
        .expect("publish");
    let multipart = reports
        .iter()
        .find(|r| r.parts > 1)
        .expect("a multipart upload");
    let note = multipart.notes.join("\n");
    assert!(
        note.contains("could not list stale multipart uploads") && note.contains(&multipart.key),
        "{note}"
    );
    assert!(
        reports
            .iter()
            .filter(|r| r.parts <= 1)
            .all(|r| r.notes.is_empty()),
        "single uploads list nothing"
    );
    assert_published(&s3, &objects);
}

#[test]
fn credentials_in_the_endpoint_url_are_refused_and_never_echoed() {
    let no_env = |_: &str| None;
    for url in [
        "http://AKID42:s3cr3t-value@127.0.0.1:8014",
        "https://AKID42:s3cr3t-value@acct.r2.cloudflarestorage.com",
    ] {
        let e = gkq_store::s3::endpoint(Some(url), None, &no_env).expect_err("refused");
        let msg = format!("{e} {e:?}");
        assert!(!msg.contains("s3cr3t-value"), "{msg}");
        assert!(msg.contains("R2_SECRET_ACCESS_KEY"), "{msg}");
    }
}
