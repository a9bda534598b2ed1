//! Quantized packages through the gate (issue 29): a package of block types
//! passes every check, `--source` re-quantizes and compares the bytes and
//! recomputes the recorded figures, and quantized row files get every
//! check float ones get.

use std::fs;

use gkq_format::{DType, Value, keys};

use super::{Packed, fails_with, flip, packed_with, passes, rewrite_knot, s, verify};

/// `llama-tiny-k` (rows of 256 and 512 values) packed with `--quant q4_k`,
/// the embedding in q8_0 and the lm_head in q6_k (llama-quantize's default).
fn packed_quantized() -> Packed {
    let spec = fixtures::preset("llama-tiny-k").expect("preset");
    packed_with(&spec, |opts, _| {
        opts.quant.weights = Some(DType::Q4_K);
        opts.quant.token_embedding = Some(DType::Q8_0);
    })
}

#[test]
fn a_quantized_package_passes_and_its_figures_are_as_recorded() {
    let p = packed_quantized();
    // every NOTE line (without --verbose a check shows 8)
    let out = verify(&[s(&p.out), "--source", s(&p.src), "--verbose"]);
    passes(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    // 2 layers x 7 matrices in q4_k, the embedding in q8_0, the lm_head in q6_k
    assert_eq!(text.matches("q4_k block").count(), 14, "{text}");
    assert_eq!(text.matches("as recorded").count(), 16, "{text}");
    assert!(
        text.contains("q8_0 block \"model.embed_tokens.weight\""),
        "{text}"
    );
    assert!(text.contains("q6_k block \"lm_head.weight\""), "{text}");
}

#[test]
fn bytes_that_are_not_the_reference_quantization_fail() {
    let p = packed_quantized();
    let knot = p.out.join("model.knot");
    let name = "model.layers.1.mlp.up_proj.weight";
    // one 4-bit code of row 3 changed: a well-formed knot with other bytes
    rewrite_knot(&knot, |h, payloads| {
        let k = h
            .blocks
            .iter()
            .filter(|b| b.encoding.payload().is_some())
            .position(|b| b.name == name)
            .expect("block");
        // rows of 256 values are one 144-byte super-block; codes start at 16
        payloads[k][3 * 144 + 40] ^= 0x03;
    });
    // the knot itself is sound
    passes(&verify(&[s(&p.out)]));
    fails_with(
        &verify(&[s(&p.out), "--source", s(&p.src)]),
        &[name, "row 3"],
    );
}

#[test]
fn a_recorded_figure_the_block_does_not_give_fails() {
    let p = packed_quantized();
    rewrite_knot(&p.out.join("model.knot"), |h, _| {
        if let Some(Value::StrList(v)) = h.metadata.get_mut(keys::QUANT_RMSE) {
            v[2] = "0.5".into();
        }
    });
    let out = verify(&[s(&p.out), "--source", s(&p.src)]);
    // issue 57: the message calls the block what it is (it said "spectral")
    fails_with(
        &out,
        &["quantized block", "the knot records 0.5 in quant.rmse"],
    );
    passes(&verify(&[s(&p.out)]));
}

#[test]
fn quantized_row_files_get_every_check() {
    let p = packed_quantized();
    let rows = p.out.join("token_embd.q8_0.rows");
    // a flipped scale byte of row 5: the row, the digest and the proof
    flip(&rows, 5 * 272 + 1);
    fails_with(&verify(&[s(&p.out)]), &["token_embd.q8_0.rows", "row 5"]);
    let p = packed_quantized();
    let rows = p.out.join("token_embd.q8_0.rows");
    let len = fs::metadata(&rows).expect("rows").len();
    fs::OpenOptions::new()
        .write(true)
        .open(&rows)
        .and_then(|f| f.set_len(len - 272))
        .expect("truncate");
    fails_with(&verify(&[s(&p.out)]), &["token_embd.q8_0.rows"]);
}
