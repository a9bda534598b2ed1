//! Helpers shared by the reader's test binaries.

use std::fs;
use std::path::{Path, PathBuf};

use gkq_format::{DType, Knot, cast_row, keys};

/// Writes a knot whose token embedding is a SPECTRAL block (rank 2 of a
/// 6 x 3 matrix) and whose tied lm_head aliases it. Returns its path and
/// the matrix reconstructed independently from the formula.
#[allow(dead_code)]
pub(crate) fn spectral_embedding_knot(dir: &Path) -> (PathBuf, Vec<f32>) {
    use gkq_format::{Block, Encoding, Header, KnotWriter, Metadata, Payload, Quant, Value};
    let (m, n, k) = (6usize, 3usize, 2usize);
    let u: Vec<f32> = (0..m * k).map(|i| 0.25 * i as f32 - 1.0).collect();
    let s = [2.0f32, 0.5];
    let vt: Vec<f32> = (0..k * n).map(|i| 1.0 - 0.375 * i as f32).collect();
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f32;
            for kk in 0..k {
                acc += (u[i * k + kk] * s[kk]) * vt[kk * n + j];
            }
            want[i * n + j] = acc;
        }
    }
    let payload: Vec<u8> = u
        .iter()
        .chain(&s)
        .chain(&vt)
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let mut md = Metadata::new();
    md.insert(keys::ROLE_TOKEN_EMBD.into(), Value::Str("emb".into()));
    md.insert(keys::ROLE_LM_HEAD.into(), Value::Str("head".into()));
    let emb = Block {
        name: "emb".into(),
        dtype: DType::F32,
        flags: 0,
        shape: vec![m as u64, n as u64],
        encoding: Encoding::Spectral {
            rank: k as u32,
            factor_dtype: DType::F32,
            quant: Quant::None,
            payload: Payload {
                offset: 0,
                len: payload.len() as u64,
                sha256: [0; 32],
            },
        },
        columnar: vec![],
    };
    let head = Block {
        name: "head".into(),
        encoding: Encoding::Alias { target: 0 },
        ..emb.clone()
    };
    let path = dir.join("model.knot");
    let mut w = KnotWriter::new(
        fs::File::create(&path).expect("create"),
        Header {
            metadata: md,
            blocks: vec![emb, head],
        },
    )
    .expect("writer");
    w.write_payload(0, payload.as_slice()).expect("payload");
    w.finish().expect("finish");
    (path, want)
}

/// Row `id` of the knot's embedding block in `out`, cast to `dtype`.
#[allow(dead_code)]
pub(crate) fn dense_row(out: &Path, id: u64, dtype: DType) -> Vec<u8> {
    let bytes = fs::read(out.join("model.knot")).expect("knot");
    let knot = Knot::parse(&bytes).expect("valid");
    let h = knot.header().header();
    let i = h
        .block_index(h.meta_str(keys::ROLE_TOKEN_EMBD).expect("role"))
        .expect("block");
    let b = &h.blocks[i];
    let rb = (b.shape[1] * b.dtype.itemsize()) as usize;
    let row = &knot.payload(i).expect("payload")[id as usize * rb..(id as usize + 1) * rb];
    let mut out = Vec::new();
    cast_row(row, b.dtype, dtype, &mut out).expect("castable");
    out
}
