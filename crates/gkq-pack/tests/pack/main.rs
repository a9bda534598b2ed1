//! Integration tests of gkq-pack, by subject: rows (packed rows against
//! their source), inputs (bad input fails cleanly), package (commit, force,
//! pinned digests) and spectral. The helpers they share live here.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gkq_format::{DType, Encoding, Knot, keys};
use half::{bf16, f16};
use safetensors::SafeTensors;
use sha2::{Digest, Sha256};

mod gguf;
mod inputs;
mod package;
mod quant;
mod rows;
mod spectral;
mod warm;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gkq-pack"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run gkq-pack")
}

fn model(tmp: &Path, preset: &str) -> PathBuf {
    let dir = tmp.join(preset);
    fixtures::write_model(&dir, &fixtures::preset(preset).expect("preset")).expect("write fixture");
    dir
}

/// All source tensors by name, from every safetensors file in `dir`.
fn source_tensors(dir: &Path) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).expect("dir") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let bytes = fs::read(&p).expect("read");
            let st = SafeTensors::deserialize(&bytes).expect("valid");
            for (name, v) in st.tensors() {
                out.push((
                    name,
                    format!("{:?}", v.dtype()),
                    v.shape().to_vec(),
                    v.data().to_vec(),
                ));
            }
        }
    }
    out.sort();
    out
}

fn to_f32(bytes: &[u8], dtype: &str) -> Vec<f32> {
    match dtype {
        "F32" => bytes
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
            .collect(),
        "F16" => bytes
            .chunks(2)
            .map(|c| f16::from_le_bytes(c.try_into().expect("2")).to_f32())
            .collect(),
        "BF16" => bytes
            .chunks(2)
            .map(|c| bf16::from_le_bytes(c.try_into().expect("2")).to_f32())
            .collect(),
        other => panic!("not a float dtype {other}"),
    }
}

/// Independent reference of the documented cast (half's round-to-nearest-even).
fn encode(vals: &[f32], d: DType) -> Vec<u8> {
    match d {
        DType::F32 => vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => vals
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
        DType::BF16 => vals
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
        other => panic!("{other}"),
    }
}

fn sha(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Checks a packed output directory against its source, row by row.
fn check_pack(src_dir: &Path, out: &Path, dtypes: &[DType], tied: bool) {
    let knot_bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&knot_bytes).expect("valid knot");
    let header = knot.header().header();
    let sources = source_tensors(src_dir);
    let embed_name = header
        .meta_str(keys::ROLE_TOKEN_EMBD)
        .expect("role")
        .to_owned();
    let lm_name = header
        .meta_str(keys::ROLE_LM_HEAD)
        .expect("role")
        .to_owned();
    assert_eq!(header.meta_bool(keys::TIE_WORD_EMBEDDINGS), Some(tied));
    for (i, b) in header.blocks.iter().enumerate() {
        let want = header.resolve(i).and_then(|d| d.encoding.payload());
        let got = sha(&fixtures::knots::block_payload(out, &knot, i));
        assert_eq!(
            want.map(|p| p.sha256),
            Some(got),
            "payload digest of {}",
            b.name
        );
    }
    let alias = header
        .blocks
        .iter()
        .find(|b| matches!(b.encoding, Encoding::Alias { .. }));
    assert_eq!(alias.is_some(), tied, "alias exists exactly when tied");
    if let Some(a) = alias {
        assert_eq!(a.name, lm_name);
        assert_eq!(
            header
                .resolve(header.block_index(&a.name).expect("alias"))
                .expect("target")
                .name,
            embed_name
        );
    }
    let mut accounted = 0;
    for (name, st_dtype, shape, data) in &sources {
        let idx = header.block_index(name);
        let is_role = *name == embed_name || (!tied && *name == lm_name);
        if tied && *name == lm_name {
            // identical lm_head stored in the source: recorded as the alias
            assert!(matches!(
                header.blocks[idx.expect("alias block")].encoding,
                Encoding::Alias { .. }
            ));
            accounted += 1;
            continue;
        }
        let idx = idx.unwrap_or_else(|| panic!("source tensor {name} missing from the knot"));
        accounted += 1;
        let b = &header.blocks[idx];
        assert_eq!(b.shape, shape.iter().map(|&d| d as u64).collect::<Vec<_>>());
        let payload = fixtures::knots::block_payload(out, &knot, idx);
        let payload = payload.as_slice();
        if !is_role {
            assert!(
                payload == data.as_slice(),
                "{name}: dense block differs from source"
            );
            assert!(!b.is_columnar_eligible());
            continue;
        }
        assert!(b.is_columnar_eligible(), "{name} must be columnar-eligible");
        assert_eq!(b.dtype, dtypes[0]);
        let vals = to_f32(data, st_dtype);
        let block_expected = encode(&vals, dtypes[0]);
        assert!(
            payload == block_expected.as_slice(),
            "{name}: block != cast(source)"
        );
        let role = if *name == embed_name {
            "token_embd"
        } else {
            "lm_head"
        };
        assert_eq!(b.columnar.len(), dtypes.len());
        let block_vals = to_f32(payload, &format!("{:?}", dtypes[0]).to_uppercase());
        for (d, &dt) in b.columnar.iter().zip(dtypes) {
            assert_eq!(d.dtype, dt);
            assert_eq!(d.object, format!("{role}.{}.rows", dt.name()));
            let (rows, cols) = (shape[0] as u64, shape[1] as u64);
            assert_eq!(d.rows, rows);
            assert_eq!(d.row_bytes, cols * dt.itemsize());
            assert_eq!(d.byte_len, rows * d.row_bytes);
            let file = fs::read(out.join(&d.object)).expect("row file");
            assert_eq!(file.len() as u64, d.byte_len, "{}: length", d.object);
            assert_eq!(sha(&file), d.sha256, "{}: digest", d.object);
            let expected = encode(&block_vals, dt);
            let rb = d.row_bytes as usize;
            for r in 0..rows as usize {
                assert!(
                    file[r * rb..(r + 1) * rb] == expected[r * rb..(r + 1) * rb],
                    "{}: row {r} differs",
                    d.object
                );
            }
        }
    }
    assert_eq!(accounted, sources.len());
    assert!(!fs::read_dir(out).expect("out").any(|e| {
        e.expect("e")
            .file_name()
            .to_string_lossy()
            .ends_with(".gkq-tmp")
    }));
}

/// Every file of a package directory, by name, in name order.
fn package_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(dir)
        .expect("package dir")
        .map(|e| {
            let p = e.expect("entry").path();
            (
                p.file_name().expect("name").to_string_lossy().into_owned(),
                fs::read(&p).expect("read"),
            )
        })
        .collect();
    files.sort();
    files
}

/// Runs gkq-pack on `src` into `out` with `extra` flags, asserting success.
fn packs(src: &Path, out: &Path, extra: &[&str], what: &str) -> Output {
    let mut args = vec![
        src.to_str().expect("utf8"),
        "--out",
        out.to_str().expect("utf8"),
    ];
    args.extend_from_slice(extra);
    let r = run(&args);
    assert!(
        r.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    r
}

/// Runs gkq-pack expecting failure; returns stderr. Asserts no knot and no temp files remain.
fn fails(src: &Path, out: &Path, extra: &[&str], must_mention: &[&str]) -> String {
    let mut args = vec![
        src.to_str().expect("utf8"),
        "--out",
        out.to_str().expect("utf8"),
    ];
    args.extend_from_slice(extra);
    let r = run(&args);
    let err = String::from_utf8_lossy(&r.stderr).into_owned();
    assert!(!r.status.success(), "expected failure for {must_mention:?}");
    for m in must_mention {
        assert!(err.contains(m), "error {err:?} should mention {m:?}");
    }
    assert!(
        !out.join("model.knot").exists(),
        "a knot was left behind: {err}"
    );
    for leftover in [".gkq-new", ".gkq-old"] {
        let name = format!(
            ".{}{leftover}",
            out.file_name().expect("name").to_string_lossy()
        );
        assert!(
            !out.with_file_name(&name).exists(),
            "left behind {name}: {err}"
        );
    }
    if out.exists() {
        for e in fs::read_dir(out).expect("out") {
            let n = e.expect("e").file_name().to_string_lossy().into_owned();
            assert!(
                !n.ends_with(".gkq-tmp") && !n.ends_with(".rows"),
                "left behind {n}"
            );
        }
    }
    err
}

/// Whether `out` holds a complete package: a valid knot, every payload and
/// every row file it names with the recorded length and digest.
fn complete_package(out: &Path) -> Result<Vec<u8>, String> {
    let knot_bytes = fs::read(out.join("model.knot")).map_err(|e| format!("knot: {e}"))?;
    let knot = Knot::parse(&knot_bytes).map_err(|e| e.to_string())?;
    for (i, b) in knot.blocks().iter().enumerate() {
        match knot.header().home_of(i) {
            // stored in its row file (FORMAT.md 7e): its rows' digest
            Some((p, _)) if sha(&fixtures::knots::block_payload(out, &knot, i)) != p.sha256 => {
                return Err(format!(
                    "{}: its row file's rows are not its payload",
                    b.name
                ));
            }
            Some(_) => {}
            None => knot.check_payload(i).map_err(|e| e.to_string())?,
        }
        for d in &b.columnar {
            let rows = fs::read(out.join(&d.object)).map_err(|e| format!("{}: {e}", d.object))?;
            gkq_format::check_row_file_len(d, rows.len() as u64).map_err(|e| e.to_string())?;
            gkq_format::check_row_file_digest(d, sha(&rows)).map_err(|e| e.to_string())?;
        }
    }
    Ok(knot_bytes)
}

/// A tiny Qwen2 whose attention projections are rank 16 plus noise of
/// relative RMS 1e-4 (the synthetic low-rank matrix).
fn low_rank_model(tmp: &Path, dtype: fixtures::FDtype) -> PathBuf {
    let dir = tmp.join(format!("low-rank-{}", dtype.name()));
    let spec = fixtures::Spec {
        low_rank: Some((16, 1e-4)),
        ..fixtures::Spec::tiny(fixtures::Arch::Qwen2, dtype)
    };
    fixtures::write_model(&dir, &spec).expect("write fixture");
    dir
}

fn json_report(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).expect("json report")
}

/// The relative Frobenius error of the knot's block `name` against the
/// source tensor, computed here from the reconstruction.
fn block_error(knot_path: &Path, src: &Path, name: &str) -> f64 {
    let bytes = fs::read(knot_path).expect("knot");
    let knot = Knot::parse(&bytes).expect("parse");
    let i = knot.header().header().block_index(name).expect("block");
    let b = &knot.blocks()[i];
    let w = gkq_format::reconstruct_spectral(b, knot.payload(i).expect("payload")).expect("rec");
    let approx = to_f32(&w, &b.dtype.to_string().to_uppercase());
    let (_, dt, _, data) = source_tensors(src)
        .into_iter()
        .find(|t| t.0 == name)
        .expect("source tensor");
    let exact = to_f32(&data, &dt);
    let (mut d2, mut r2) = (0f64, 0f64);
    for (a, e) in approx.iter().zip(&exact) {
        d2 += (f64::from(*a) - f64::from(*e)).powi(2);
        r2 += f64::from(*e).powi(2);
    }
    (d2 / r2).sqrt()
}
