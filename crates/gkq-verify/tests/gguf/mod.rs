//! `gkq-verify --source MODEL.gguf` (issue 30): every block against the
//! GGUF's tensor bytes, every file's digest (its padding included); a
//! changed tensor in the GGUF is named.

use std::fs;

use super::{fails_with, passes, s, verify};

#[test]
fn a_gguf_born_package_checks_against_its_gguf() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    fixtures::write_model(&src, &fixtures::preset("llama-tiny-f32").expect("preset"))
        .expect("fixture");
    for (kind, split) in [("q4_0", None), ("f16", Some(7))] {
        let dir = tmp.path().join(format!("gguf-{kind}"));
        fs::create_dir_all(&dir).expect("dir");
        let files =
            fixtures::gguf::write(&src, &dir.join("model.gguf"), kind, split).expect("gguf-py");
        let arg = if split.is_some() {
            dir.clone()
        } else {
            files[0].clone()
        };
        let out = tmp.path().join(format!("out-{kind}"));
        gkq_pack::pack(
            &gkq_pack::PackOptions::new(&arg, &out),
            &gkq_pack::NoProgress,
        )
        .expect("pack");
        passes(&verify(&[s(&out), "--source", s(&arg)]));
        // one byte of a tensor changed after packing: the tensor, and the file
        let g = gkq_format::gguf::Gguf::parse(&fs::read(&files[0]).expect("gguf")).expect("parse");
        let t = g
            .tensor("blk.0.ffn_up.weight")
            .or_else(|| g.tensors.first())
            .expect("a tensor");
        let mut bytes = fs::read(&files[0]).expect("gguf");
        bytes[t.offset as usize + 3] ^= 0x01;
        fs::write(&files[0], bytes).expect("write");
        fails_with(
            &verify(&[s(&out), "--source", s(&arg)]),
            &[&t.name, "sha256"],
        );
    }
}

/// Issue 42 (FORMAT.md 9b, round 5: 3.6 from the verifier's side): a
/// package whose metadata.gguf is not the source's key/values is named
/// (a package packed from another GGUF with the same tensors: each file's
/// digest differs, and the metadata is named on its own).
#[test]
fn another_metadata_gguf_is_named_against_the_source() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("model");
    fixtures::write_model(&src, &fixtures::preset("llama-tiny-f32").expect("preset"))
        .expect("fixture");
    let a = tmp.path().join("a.gguf");
    fixtures::gguf::write(&src, &a, "q8_0", None).expect("gguf-py");
    let edited = fixtures::gguf::with_kv(&fs::read(&a).expect("gguf"), |kv| {
        kv.push((
            "x.another".into(),
            gkq_format::gguf::GgufValue::Str("another".into()),
        ));
    })
    .expect("edit");
    let b = tmp.path().join("b.gguf");
    fs::write(&b, edited).expect("write");
    let out = tmp.path().join("out");
    gkq_pack::pack(&gkq_pack::PackOptions::new(&b, &out), &gkq_pack::NoProgress).expect("pack");
    passes(&verify(&[s(&out), "--source", s(&b)]));
    fails_with(
        &verify(&[s(&out), "--source", s(&a)]),
        &["metadata.gguf is not the source GGUF's metadata"],
    );
}

/// Issue 44 item 5: a package requantized from a q8_0 GGUF (gkq-pack
/// --quant q4_0 --allow-requantize) checks against its GGUF: every block
/// re-quantized from the dequantized source, as the packer did.
#[test]
fn a_requantized_gguf_package_checks_against_its_gguf() {
    let tmp = tempfile::tempdir().expect("tmp");
    let gguf = tmp.path().join("tiny-q8_0.gguf");
    fixtures::gguf::write(&fixtures::committed_tiny(), &gguf, "q8_0", None).expect("gguf-py");
    let out = tmp.path().join("out");
    let mut opts = gkq_pack::PackOptions::new(&gguf, &out);
    opts.quant.weights = Some(gkq_format::DType::Q4_0);
    opts.quant.allow_requantize = true;
    gkq_pack::pack(&opts, &gkq_pack::NoProgress).expect("pack");
    passes(&verify(&[s(&out), "--source", s(&gguf)]));
}
