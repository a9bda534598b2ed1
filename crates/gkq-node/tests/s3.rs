//! Private reads from an S3-compatible server (s3s-fs, SigV4 enforced) at
//! s3://bucket/key URLs, with the credentials and --endpoint the upload
//! uses, by the gkq-rows of the workspace build (where the uploader turns
//! on gkq-store's `s3` feature, so every tool has it); a build without the
//! feature must say so and name it.

use std::fs;

use fixtures::servers::{S3_ACCESS_KEY, S3_SECRET_KEY, S3sFs};
use gkq_format::DType;
use gkq_reader::{Reader, ReaderConfig, Serve};

#[test]
fn gkq_rows_reads_a_private_bucket() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    fixtures::write_model(&src, &fixtures::preset("llama-tiny-bf16").expect("preset"))
        .expect("fixture");
    let out = tmp.path().join("out");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    opts.dtypes = vec![DType::BF16, DType::F32];
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    let s3 = S3sFs::start(&tmp.path().join("s3")).expect("s3s-fs (scripts/install-test-deps.sh)");
    // s3s-fs keeps objects as files under DATA/<bucket>/<key>
    let prefix = s3.data().join("private/m/v1");
    fs::create_dir_all(&prefix).expect("bucket");
    for e in fs::read_dir(&out).expect("out") {
        let p = e.expect("entry").path();
        fs::copy(&p, prefix.join(p.file_name().expect("name"))).expect("copy");
    }
    let run = |secret: &str| {
        fixtures::tool(env!("CARGO_BIN_EXE_gkq-rows"))
            .args([
                "s3://private/m/v1/model.knot",
                "--columnar-embed",
                "s3://private/m/v1",
                "--endpoint",
                &s3.url(),
                "--tokens",
                "1,17,42,511",
                "--f32",
                "--json",
                "--require-columnar",
            ])
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env("R2_ACCESS_KEY_ID", S3_ACCESS_KEY)
            .env("R2_SECRET_ACCESS_KEY", secret)
            .output()
            .expect("run gkq-rows")
    };
    let o = run(S3_SECRET_KEY);
    if !gkq_store::FEATURES.contains(&"s3") {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("without the `s3` feature"), "{err}");
        return;
    }
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["resolution"]["path"], "columnar", "{}", v["resolution"]);
    assert!(
        v["resolution"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("s3://private/m/v1/token_embd.bf16.rows")),
        "{}",
        v["resolution"]
    );
    // the rows are the dense block's, widened
    let local = Reader::open(
        out.join("model.knot").to_str().expect("utf8"),
        ReaderConfig::default(),
        Serve::INPUT,
    )
    .expect("local");
    let want = local
        .embedding()
        .expect("input")
        .rows(&[1u64, 17, 42, 511])
        .expect("rows")
        .to_f32()
        .expect("f32");
    let got: Vec<f32> = v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .flat_map(|r| {
            r.as_array()
                .expect("row")
                .iter()
                .map(|x| x.as_f64().expect("num") as f32)
        })
        .collect();
    assert_eq!(got, want);
    // a wrong secret: SigV4 refused, the message says what to check
    let o = run("wrong-secret");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("403") && err.contains("R2_ACCESS_KEY_ID"),
        "{err}"
    );
    assert!(
        !err.contains("wrong-secret"),
        "the secret is never printed: {err}"
    );
}
