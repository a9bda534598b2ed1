//! Issue 10: no unverified row is ever returned, and the narrowest exact
//! row file is fetched. Servers that lie (swapped rows, another model's
//! rows, a damaged proof object) are real HTTP servers on 127.0.0.1
//! (`FaultServer`), and the honest one is nginx.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fixtures::servers::{Fault, FaultServer, Nginx, NginxOptions};
use fixtures::{FDtype, Spec};
use gkq_format::{DType, cast_row};
use gkq_reader::{Choice, PathKind, Reader, ReaderConfig, ReaderError, Serve, with_timeout};

/// A model whose embedding rows are wide enough for a proof height above 0
/// (hidden 1024: 4 KiB f32 rows, h = 9; 2 KiB bf16 rows, h = 7, 4 chunks),
/// so that path records are fetched and checked, not only the table.
fn wide(dtype: FDtype, seed: u64) -> Spec {
    let mut s = fixtures::preset("qwen2-tiny-f32").expect("preset");
    s.dtype = dtype;
    s.hidden = 1024;
    s.intermediate = 64;
    s.heads = 8;
    s.kv_heads = 8;
    s.layers = 1;
    s.seed = seed;
    s
}

fn pack(spec: &Spec, dtypes: &[DType], dir: &Path) -> PathBuf {
    let src = dir.join("model");
    fixtures::write_model(&src, spec).expect("fixture");
    let out = dir.join("www/m");
    let mut opts = gkq_pack::PackOptions::new(&src, &out);
    opts.dtypes = dtypes.to_vec();
    // the version 3/4 layout (blocks in the knot, runs objects) these
    // tests exercise; one_copy.rs reads version 5's
    opts.one_copy = false;
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    out
}

/// Row `id` of the knot's embedding block, widened to f32.
fn dense_f32(out: &Path, id: u64) -> Vec<f32> {
    fixtures::knots::dense_row(out, id, DType::F32)
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
        .collect()
}

fn open(out: &Path, url: &str, require: bool) -> Reader {
    let mut c = with_timeout(
        ReaderConfig {
            columnar_embed: Some(url.to_owned()),
            require_columnar: require,
            ..ReaderConfig::default()
        },
        Duration::from_secs(5),
    );
    c.store.retry.backoff = Duration::from_millis(5);
    Reader::open(
        out.join("model.knot").to_str().expect("utf8"),
        c,
        Serve::INPUT,
    )
    .expect("open")
}

/// Row `k` of `rows`, widened to f32.
fn row_f32(rows: &gkq_reader::Rows, k: usize) -> Vec<f32> {
    let mut wide = Vec::new();
    cast_row(
        rows.bytes(k).expect("row"),
        rows.dtype(),
        DType::F32,
        &mut wide,
    )
    .expect("castable");
    wide.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
        .collect()
}

const IDS: [u64; 6] = [3, 4, 5, 130, 511, 3];

/// With a lying server, every row returned equals the dense block's (after
/// the fallback), the resolution says why, and with `--require-columnar`
/// the call fails instead.
fn assert_never_wrong(out: &Path, server: &FaultServer, object: &str, why: &str) {
    let url = server.url(object);
    let r = open(out, &url, false);
    let e = r.embedding().expect("input");
    assert_eq!(
        e.resolution().kind(),
        PathKind::Columnar,
        "{}",
        e.resolution().reason()
    );
    let backend = e.columnar().expect("columnar backend");
    let rows = e.rows(&IDS).expect("rows through the dense fallback");
    for (k, &id) in IDS.iter().enumerate() {
        assert_eq!(row_f32(&rows, k), dense_f32(out, id), "row {id}");
    }
    let res = e.resolution();
    assert_eq!(res.kind(), PathKind::Dense, "{why}");
    assert!(
        res.reason().contains("verification"),
        "{why}: {}",
        res.reason()
    );
    // with the cause: the Merkle check that refused the bytes
    assert!(
        res.reason().to_lowercase().contains("merkle"),
        "{why}: {}",
        res.reason()
    );
    let cs = backend.cache_stats();
    assert!(
        cs.rows_rejected > 0 || why.contains("package"),
        "{why}: {cs:?}"
    );
    // only verified rows were cached (rows_fetched counts those), and not
    // all of the 5 distinct ones: the failing rows were not
    assert!(
        backend.cached_rows() as u64 <= cs.rows_fetched,
        "{why}: {cs:?}"
    );
    assert!(cs.rows_fetched < 5, "{why}: {cs:?}");

    let r = open(out, &url, true);
    let err = r
        .embedding()
        .expect("input")
        .rows(&IDS)
        .expect_err("--require-columnar: no dense fallback");
    assert!(
        matches!(err, ReaderError::ColumnarRequired { .. })
            && err.to_string().contains("verification")
            && err.to_string().to_lowercase().contains("merkle"),
        "{why}: {err}"
    );
}

#[test]
fn swapped_rows_are_never_returned() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(&wide(FDtype::F32, 7), &[DType::F32], tmp.path());
    // every range of the row file answered with the bytes one row further on
    let server = FaultServer::start_dir(&out, Fault::OffsetRows(4096)).expect("server");
    assert_never_wrong(&out, &server, "token_embd.f32.rows", "swapped rows");
}

#[test]
fn rows_of_another_model_are_never_returned() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(&wide(FDtype::F32, 7), &[DType::F32], &tmp.path().join("a"));
    let other = pack(&wide(FDtype::F32, 8), &[DType::F32], &tmp.path().join("b"));
    // the other model's rows with this model's proof object...
    let rows = fs::read(other.join("token_embd.f32.rows")).expect("rows");
    let proof = fs::read(out.join("token_embd.f32.rows.proof")).expect("proof");
    let server = FaultServer::start_files(
        vec![
            ("token_embd.f32.rows".into(), rows),
            ("token_embd.f32.rows.proof".into(), proof),
        ],
        Fault::None,
    )
    .expect("server");
    assert_never_wrong(&out, &server, "token_embd.f32.rows", "other model's rows");
    // ...and with its own proof object, whose table fails this knot's root
    let server = FaultServer::start_dir(&other, Fault::None).expect("server");
    assert_never_wrong(
        &out,
        &server,
        "token_embd.f32.rows",
        "other model's package",
    );
}

#[test]
fn a_damaged_proof_object_is_caught() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(&wide(FDtype::BF16, 7), &[DType::BF16], tmp.path());
    let rows = fs::read(out.join("token_embd.bf16.rows")).expect("rows");
    let proof = fs::read(out.join("token_embd.bf16.rows.proof")).expect("proof");
    let layout = gkq_format::merkle::ProofLayout::new(512, 7).expect("layout");
    assert_eq!(proof.len() as u64, layout.object_len().expect("len"));
    // a flipped bit in the path record of row 130, then in the chunk table
    let (rec, _) = layout.records_range(130, 1).expect("range");
    for at in [rec + 40, 5] {
        let mut bad = proof.clone();
        bad[at as usize] ^= 0x10;
        let server = FaultServer::start_files(
            vec![
                ("token_embd.bf16.rows".into(), rows.clone()),
                ("token_embd.bf16.rows.proof".into(), bad),
            ],
            Fault::None,
        )
        .expect("server");
        assert_never_wrong(&out, &server, "token_embd.bf16.rows", "flipped proof bit");
    }
    // a truncated proof object: its ranges fail, and no row is returned
    let server = FaultServer::start_files(
        vec![
            ("token_embd.bf16.rows".into(), rows),
            (
                "token_embd.bf16.rows.proof".into(),
                proof[..proof.len() / 2].to_vec(),
            ),
        ],
        Fault::None,
    )
    .expect("server");
    let r = open(&out, &server.url("token_embd.bf16.rows"), false);
    let e = r.embedding().expect("input");
    match e.rows(&IDS) {
        Ok(rows) => {
            for (k, &id) in IDS.iter().enumerate() {
                assert_eq!(row_f32(&rows, k), dense_f32(&out, id));
            }
        }
        Err(err) => assert!(err.to_string().contains(".proof"), "{err}"),
    }
    assert_eq!(e.cache_stats().rows_fetched, 0);
}

/// Serves a package packed from a `src` model with `dtypes` over nginx and
/// returns the reader's pick for the base URL.
fn narrowest(src: FDtype, dtypes: &[DType]) -> (PathBuf, Reader, Nginx, tempfile::TempDir) {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(&wide(src, 11), dtypes, tmp.path());
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let r = open(&out, &format!("{}/m/", nginx.url()), true);
    (out, r, nginx, tmp)
}

#[test]
fn the_narrowest_exact_row_file_is_fetched_and_widens_to_the_dense_values() {
    // (source dtype, packed dtypes, the row file a base URL must pick)
    let cases = [
        (FDtype::BF16, vec![DType::F32, DType::BF16], DType::BF16),
        (
            FDtype::F16,
            vec![DType::F32, DType::F16, DType::BF16],
            DType::F16,
        ),
        (FDtype::F32, vec![DType::F32, DType::BF16], DType::F32),
    ];
    for (src, dtypes, want) in cases {
        let (out, r, _nginx, _tmp) = narrowest(src, &dtypes);
        let e = r.embedding().expect("input");
        let res = e.resolution();
        let backend = e.columnar().expect("columnar");
        assert_eq!(backend.dtype(), want, "{src:?}: {}", res.reason());
        if want != DType::F32 {
            let c = res.columnar().expect("columnar");
            assert!(
                c.desc.dtype == want && matches!(c.choice, Choice::Narrowest { widest: 4096, .. }),
                "{res:?}"
            );
        }
        // widened on the node, the rows are the f32 row file's values
        let rows = e.rows(&IDS).expect("rows");
        let f32_file = fs::read(out.join("token_embd.f32.rows")).expect("f32 rows");
        for (k, &id) in IDS.iter().enumerate() {
            let want_row: Vec<f32> = f32_file[id as usize * 4096..(id as usize + 1) * 4096]
                .chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
                .collect();
            let got = row_f32(&rows, k);
            assert!(
                got.iter()
                    .zip(&want_row)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{src:?} row {id}"
            );
            assert_eq!(got, dense_f32(&out, id));
        }
    }
}

#[test]
fn embed_dtype_forces_a_row_file() {
    let (out, _r, nginx, _tmp) = narrowest(FDtype::F32, &[DType::F32, DType::BF16]);
    let base = format!("{}/m", nginx.url());
    let mut c = ReaderConfig {
        columnar_embed: Some(base),
        require_columnar: true,
        embed_dtype: Some(DType::BF16),
        ..ReaderConfig::default()
    };
    let r = Reader::open(
        out.join("model.knot").to_str().expect("utf8"),
        c.clone(),
        Serve::INPUT,
    )
    .expect("open");
    let e = r.embedding().expect("input");
    assert_eq!(e.columnar().expect("columnar").dtype(), DType::BF16);
    let res = e.resolution();
    let col = res.columnar().expect("columnar");
    assert!(
        matches!(col.choice, Choice::Forced { .. }) && !col.desc.is_block_exact(),
        "{}",
        res.reason()
    );
    // a dtype the package does not have: the reason names the files
    c.embed_dtype = Some(DType::F16);
    let err = Reader::open(
        out.join("model.knot").to_str().expect("utf8"),
        c,
        Serve::INPUT,
    )
    .expect_err("no f16 row file");
    assert!(err.to_string().contains("has no f16 row file"), "{err}");
}

/// FORMAT.md 7a, one rule for every broken proof object (issue 22, item
/// 13): missing (404), short, long or damaged, the rows are not used; the
/// node loads the dense block and says why, or with `--require-columnar`
/// fails naming the proof object.
#[test]
fn a_missing_or_broken_proof_object_always_means_the_dense_fallback() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(&wide(FDtype::BF16, 7), &[DType::BF16], tmp.path());
    let rows = fs::read(out.join("token_embd.bf16.rows")).expect("rows");
    let proof = fs::read(out.join("token_embd.bf16.rows.proof")).expect("proof");
    let mut longer = proof.clone();
    longer.extend_from_slice(&[0; 32]);
    let mut flipped = proof.clone();
    flipped[7] ^= 1;
    let cases: [(&str, Option<Vec<u8>>); 4] = [
        ("missing", None),
        ("short", Some(proof[..proof.len() / 2].to_vec())),
        ("long", Some(longer)),
        ("damaged", Some(flipped)),
    ];
    for (why, proof) in cases {
        let mut files = vec![("token_embd.bf16.rows".to_owned(), rows.clone())];
        files.extend(proof.map(|p| ("token_embd.bf16.rows.proof".to_owned(), p)));
        let server = FaultServer::start_files(files, Fault::None).expect("server");
        let url = server.url("token_embd.bf16.rows");
        let r = open(&out, &url, false);
        let e = r.embedding().expect("input");
        let got = e.rows(&IDS).unwrap_or_else(|err| panic!("{why}: {err}"));
        for (k, &id) in IDS.iter().enumerate() {
            assert_eq!(row_f32(&got, k), dense_f32(&out, id), "{why}: row {id}");
        }
        let res = e.resolution();
        assert_eq!(res.kind(), PathKind::Dense, "{why}");
        assert!(
            res.reason().contains("fell back to the dense block")
                && res.reason().contains(".proof"),
            "{why}: {}",
            res.reason()
        );
        let err = open(&out, &url, true)
            .embedding()
            .expect("input")
            .rows(&IDS)
            .expect_err("--require-columnar: no dense fallback");
        assert!(
            matches!(err, ReaderError::ColumnarRequired { .. })
                && err.to_string().contains("token_embd.bf16.rows.proof"),
            "{why}: {err}"
        );
        // issue 35: the words say what is wrong, not an I/O internal
        let text = gkq_format::error_chain(&err);
        println!("{why}: {text}");
        assert!(!text.contains("fill whole buffer"), "{why}: {text}");
    }
    // a short proof object of a local package: the same words
    let short = out.join("token_embd.bf16.rows.proof");
    fs::write(&short, &proof[..proof.len() / 2]).expect("truncate");
    let local = out.join("token_embd.bf16.rows");
    let err = open(&out, local.to_str().expect("utf8"), true)
        .embedding()
        .expect("input")
        .rows(&IDS)
        .expect_err("--require-columnar");
    let text = gkq_format::error_chain(&err);
    println!("local short: {text}");
    assert!(
        !text.contains("fill whole buffer") && text.contains("token_embd.bf16.rows.proof"),
        "{text}"
    );
}

/// Issue 23: the runs object (FORMAT.md 7b) gives the same verified rows as
/// the row file and the proof object, bit for bit, in one request per run
/// instead of two; without it the reader falls back and says why.
#[test]
fn the_runs_object_gives_the_same_rows_in_one_request_per_run() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(&wide(FDtype::BF16, 7), &[DType::BF16], tmp.path());
    assert!(
        out.join("token_embd.bf16.rows.runs").is_file(),
        "gkq-pack writes it"
    );
    let nginx = Nginx::start(
        &tmp.path().join("www"),
        &tmp.path().join("nginx"),
        &NginxOptions::default(),
    )
    .expect("nginx");
    let base = format!("{}/m/", nginx.url());
    // runs of 1 row (spread ids) and of several (a block of neighbours)
    let ids: Vec<u64> = [3u64, 4, 5, 6, 7, 130, 300, 301, 511, 3].to_vec();
    let read = |r: &Reader| {
        let e = r.embedding().expect("input");
        let n0 = r.net_stats().requests;
        let rows = e.rows(&ids).expect("rows");
        let bytes: Vec<Vec<u8>> = (0..ids.len())
            .map(|k| rows.bytes(k).expect("row").to_vec())
            .collect();
        (bytes, r.net_stats().requests - n0, e.resolution().reason())
    };
    let runs_bytes = fs::read(out.join("token_embd.bf16.rows.runs")).expect("runs");
    let (with_runs, req_runs, why) = read(&open(&out, &base, true));
    assert!(
        why.contains("token_embd.bf16.rows.runs") && why.contains("one range per run"),
        "{why}"
    );
    fs::remove_file(out.join("token_embd.bf16.rows.runs")).expect("rm");
    let (split, req_split, why) = read(&open(&out, &base, true));
    assert!(
        why.contains("no runs object") && why.contains("two objects"),
        "{why}"
    );
    assert_eq!(with_runs, split, "the same rows, bit for bit");
    for (k, &id) in ids.iter().enumerate() {
        let wide: Vec<f32> = {
            let mut v = Vec::new();
            cast_row(&with_runs[k], DType::BF16, DType::F32, &mut v).expect("cast");
            v.chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
                .collect()
        };
        assert_eq!(wide, dense_f32(&out, id), "row {id}");
    }
    // 4 runs: [3..=7], [130], [300..=301], [511]; plus the chunk table
    assert_eq!(req_runs, 4 + 1, "one request per run, and the table");
    assert_eq!(req_split, 2 * 4 + 1, "rows and records apart");
    // the bench's four workloads (Qwen token ids, folded into this
    // vocabulary), session by session: the same rows both ways, bit for bit
    let sessions: Vec<Vec<u64>> = fixtures::sessions::WORKLOADS
        .iter()
        .flat_map(|(name, _)| {
            let path = fixtures::sessions::dir().join(format!("{name}.jsonl"));
            let text = fs::read_to_string(path).expect("workload");
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    let ids: Vec<u64> = serde_json::from_str(l).expect("ids");
                    ids.into_iter().map(|i| i % 512).collect()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let replay = |r: &Reader| -> Vec<Vec<u8>> {
        let e = r.embedding().expect("input");
        sessions
            .iter()
            .flat_map(|ids| {
                let rows = e.rows(ids).expect("rows");
                (0..ids.len())
                    .map(|k| rows.bytes(k).expect("row").to_vec())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let split_all = replay(&open(&out, &base, true));
    fs::write(out.join("token_embd.bf16.rows.runs"), &runs_bytes).expect("restore");
    let runs_reader = open(&out, &base, true);
    let reason = runs_reader
        .embedding()
        .expect("input")
        .resolution()
        .reason();
    assert!(reason.contains(".runs"), "{reason}");
    assert!(
        replay(&runs_reader) == split_all,
        "the workloads' rows differ between the two paths"
    );
}

/// A server that tampers with the runs object (a row byte, a record byte,
/// two runs swapped) gets no row through. Issue 35: the rows that failed
/// are fetched again from the intact row file and proof object (fewer
/// bytes than the dense block, the same guarantee), which serve from then
/// on; only when those fail too does the node load the dense block, and
/// the reason names the objects.
#[test]
fn a_tampered_runs_object_returns_no_row() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = pack(&wide(FDtype::BF16, 7), &[DType::BF16], tmp.path());
    let runs = fs::read(out.join("token_embd.bf16.rows.runs")).expect("runs");
    let proof = fs::read(out.join("token_embd.bf16.rows.proof")).expect("proof");
    let rows = fs::read(out.join("token_embd.bf16.rows")).expect("rows");
    let stride = 2048 + 32 * 7;
    let mut row_byte = runs.clone();
    row_byte[130 * stride + 17] ^= 1;
    let mut record_byte = runs.clone();
    record_byte[130 * stride + 2048 + 5] ^= 1;
    let mut swapped = runs.clone();
    let (a, b) = (4 * stride, 130 * stride);
    let tmp_run = swapped[a..a + stride].to_vec();
    swapped.copy_within(b..b + stride, a);
    swapped[b..b + stride].copy_from_slice(&tmp_run);
    let mut bad_rows = rows.clone();
    bad_rows[130 * 2048 + 17] ^= 1;
    for (why, bad) in [
        ("row byte", row_byte),
        ("record byte", record_byte),
        ("swapped runs", swapped),
    ] {
        let serve = |rows: &[u8]| {
            FaultServer::start_files(
                vec![
                    ("token_embd.bf16.rows".into(), rows.to_vec()),
                    ("token_embd.bf16.rows.proof".into(), proof.clone()),
                    ("token_embd.bf16.rows.runs".into(), bad.clone()),
                ],
                Fault::None,
            )
            .expect("server")
        };
        let server = serve(&rows);
        let url = server.url("token_embd.bf16.rows");
        let r = open(&out, &url, true);
        let e = r.embedding().expect("input");
        let res = e.resolution();
        assert!(
            res.columnar()
                .and_then(|c| c.runs())
                .is_some_and(|u| u.ends_with(".runs")),
            "{why}: {res:?}"
        );
        let backend = e.columnar().expect("columnar backend");
        let got = e.rows(&IDS).expect("rows from the row file and the proof");
        for (k, &id) in IDS.iter().enumerate() {
            assert_eq!(row_f32(&got, k), dense_f32(&out, id), "{why}: row {id}");
        }
        assert_eq!(e.resolution().kind(), PathKind::Columnar, "{why}");
        assert!(backend.cache_stats().rows_rejected > 0, "{why}");
        // the row file is bad too: the dense fallback, naming the objects
        let server = serve(&bad_rows);
        let url = server.url("token_embd.bf16.rows");
        let e = open(&out, &url, false);
        let e = e.embedding().expect("input");
        let got = e.rows(&IDS).expect("rows through the dense fallback");
        for (k, &id) in IDS.iter().enumerate() {
            assert_eq!(row_f32(&got, k), dense_f32(&out, id), "{why}: row {id}");
        }
        assert_eq!(e.resolution().kind(), PathKind::Dense, "{why}");
        let err = open(&out, &url, true)
            .embedding()
            .expect("input")
            .rows(&IDS)
            .expect_err("--require-columnar");
        let text = gkq_format::error_chain(&err);
        assert!(
            matches!(err, ReaderError::ColumnarRequired { .. })
                && text.contains("token_embd.bf16.rows.proof"),
            "{why}: {text}"
        );
    }
}
