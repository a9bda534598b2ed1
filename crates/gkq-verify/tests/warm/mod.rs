//! Warm objects (issue 33, FORMAT.md 7d) at the release gate: checked byte
//! for byte against the proof object's table and the warm rows with their
//! records, locally and at the published URL; a flipped byte, another
//! length and a missing object are each named; an unlisted `.warm` file is
//! not part of the package.

use std::fs;

use fixtures::servers::NginxOptions;

use super::{Packed, fails_with, flip, packed_with, passes, s, serve, verify};

/// A package whose embedding row files have warm objects of six rows.
fn packed_warm() -> Packed {
    let spec = fixtures::preset("qwen2-tiny-bf16").expect("preset");
    packed_with(&spec, |opts, tmp| {
        let ids = tmp.join("ids.txt");
        fs::write(&ids, "5 0 99 511 250 7").expect("ids");
        opts.dtypes = vec![gkq_format::DType::F32, gkq_format::DType::BF16];
        opts.warm.ids = Some(ids);
    })
}

#[test]
fn warm_objects_are_checked_byte_for_byte() {
    let p = packed_warm();
    let out = verify(&[s(&p.out)]);
    passes(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains(", 2 warm objects"));
    let warm = p.out.join("token_embd.bf16.rows.warm");
    let good = fs::read(&warm).expect("warm");
    // a row byte of the last entry (row 511)
    let knot = fs::read(p.out.join("model.knot")).expect("knot");
    let knot = gkq_format::Knot::parse(&knot).expect("knot");
    let d = knot
        .blocks()
        .iter()
        .flat_map(|b| &b.columnar)
        .find(|d| d.dtype == gkq_format::DType::BF16)
        .expect("bf16")
        .clone();
    let stride = gkq_format::warm::WarmLayout::of(&d, 6)
        .expect("layout")
        .stride() as usize;
    flip(&warm, good.len() - stride);
    fails_with(
        &verify(&[s(&p.out)]),
        &["token_embd.bf16.rows.warm", "row 511", "RowProof"],
    );
    fs::write(&warm, &good[..good.len() - 1]).expect("truncate");
    fails_with(
        &verify(&[s(&p.out)]),
        &[&format!(
            "warm object \"token_embd.bf16.rows.warm\" is {} bytes, expected {}",
            good.len() - 1,
            good.len()
        )],
    );
    fs::remove_file(&warm).expect("rm");
    fails_with(
        &verify(&[s(&p.out)]),
        &["\"token_embd.bf16.rows.warm\" named by the knot is missing (ObjectMissing)"],
    );
    fs::write(&warm, &good).expect("restore");
    // a .warm file the knot does not list is ignored
    fs::write(p.out.join("lm_head.bf16.rows.warm"), b"stray").expect("stray");
    passes(&verify(&[s(&p.out)]));
}

#[test]
fn remote_warm_objects_are_fetched_whole_and_checked() {
    let p = packed_warm();
    let (nginx, _www) = serve(&p, &NginxOptions::default(), |_| {});
    let url = format!("{}/v1", nginx.url());
    passes(&verify(&[s(&p.out), "--url", &url, "--sample-rows", "4"]));
    assert!(
        nginx
            .access_log()
            .contains("\"GET /v1/token_embd.bf16.rows.warm HTTP/1.1\" 206"),
        "{}",
        nginx.access_log()
    );
    let (nginx, _www) = serve(&p, &NginxOptions::default(), |d| {
        let f = d.join("token_embd.f32.rows.warm");
        let len = fs::metadata(&f).expect("warm").len() as usize;
        flip(&f, len - 1);
    });
    let url = format!("{}/v1", nginx.url());
    fails_with(
        &verify(&[s(&p.out), "--url", &url, "--sample-rows", "4"]),
        &["token_embd.f32.rows.warm", "fails its Merkle proof"],
    );
}
