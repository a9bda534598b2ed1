//! Version 5 packages (FORMAT.md 7e, gkq-pack's default) at the release
//! gate: a block stored in its row file is checked from there, against its
//! digest and its source; the records inline are checked against the rows;
//! a flipped row byte, a flipped record byte, a truncated row file and a
//! proof object of the old length are each named, locally and at the URL.

use std::fs;

use fixtures::servers::NginxOptions;

use super::{Packed, fails_with, flip, packed_with, passes, s, serve, verify};

/// bf16 rows 2 KiB wide: proof height 7, so every row carries a record.
fn packed_v5() -> Packed {
    let mut spec = fixtures::preset("qwen2-tiny-bf16").expect("preset");
    spec.hidden = 1024;
    spec.heads = 8;
    spec.kv_heads = 8;
    spec.layers = 1;
    packed_with(&spec, |opts, _| {
        opts.one_copy = true;
        opts.dtypes = vec![gkq_format::DType::BF16, gkq_format::DType::F32];
    })
}

const ROWS: &str = "token_embd.bf16.rows";
/// A row and its record: 2,048 + 7 × 32 bytes.
const STRIDE: usize = 2048 + 224;

#[test]
fn a_version_5_package_passes_with_its_source_and_at_its_url() {
    let p = packed_v5();
    let knot = fs::read(p.out.join("model.knot")).expect("knot");
    assert_eq!(knot[8], 5, "version 5");
    assert!(!p.out.join(format!("{ROWS}.runs")).exists());
    passes(&verify(&[s(&p.out), "--source", s(&p.src)]));
    let (nginx, _www) = serve(&p, &NginxOptions::default(), |_| {});
    let url = format!("{}/v1", nginx.url());
    passes(&verify(&[s(&p.out), "--url", &url, "--sample-rows", "16"]));
}

#[test]
fn a_flipped_row_or_record_byte_is_named() {
    let p = packed_v5();
    let f = p.out.join(ROWS);
    // row 5's bytes: the file's digest, the block's digest, the row itself
    flip(&f, 5 * STRIDE + 7);
    fails_with(
        &verify(&[s(&p.out)]),
        &[ROWS, "sha256", "model.embed_tokens.weight"],
    );
    flip(&f, 5 * STRIDE + 7);
    passes(&verify(&[s(&p.out)]));
    // row 9's record: the rows are right, the record is not
    flip(&f, 9 * STRIDE + 2048 + 3);
    fails_with(&verify(&[s(&p.out)]), &[ROWS, "row 9", "inline record"]);
}

#[test]
fn a_truncated_row_file_or_an_old_proof_object_is_named() {
    let p = packed_v5();
    let f = p.out.join(ROWS);
    let full = fs::read(&f).expect("rows");
    fs::write(&f, &full[..full.len() - 100]).expect("truncate");
    fails_with(
        &verify(&[s(&p.out)]),
        &["stored in its row file", ROWS, "cannot be read"],
    );
    fs::write(&f, &full).expect("restore");
    // the proof object as version 4 wrote it: the table and the records
    let proof = p.out.join(format!("{ROWS}.proof"));
    let mut table = fs::read(&proof).expect("proof");
    table.extend_from_slice(&vec![0u8; 512 * 224]);
    fs::write(&proof, &table).expect("longer");
    fails_with(&verify(&[s(&p.out)]), &[".proof"]);
}

#[test]
fn a_flipped_record_at_the_url_is_named() {
    let p = packed_v5();
    let (nginx, _www) = serve(&p, &NginxOptions::default(), |d| {
        let f = d.join(ROWS);
        let mut b = fs::read(&f).expect("rows");
        for r in 0..512 {
            b[r * STRIDE + 2048 + 3] ^= 1;
        }
        fs::write(&f, b).expect("write");
    });
    let url = format!("{}/v1", nginx.url());
    let out = verify(&[s(&p.out), "--url", &url, "--sample-rows", "8"]);
    fails_with(&out, &[ROWS]);
}
