//! ggml's block types against gguf-py (`gguf.quants`, PyPI `gguf`), the
//! independent reference: our Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 bytes equal
//! its quantize, and our dequantization of every type, K types included,
//! equals its dequantize bit for bit. The inputs are edge cases (zeros,
//! ties, one large value, signs) and seeded values of a weight's scale;
//! the test models and MiniLM's real weights are compared in gkq-pack's
//! tests.

use std::path::Path;
use std::process::Command;

use gkq_format::{DType, QUANTIZED, quant};

/// Runs scripts/gguf_quants.py; fails with the install command if gguf-py is missing.
fn gguf_py(op: &str, dtype: DType, input: &[u8], dir: &Path) -> Vec<u8> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gguf_quants.py");
    let (i, o) = (dir.join("in"), dir.join("out"));
    std::fs::write(&i, input).expect("input");
    let out = Command::new("python3")
        .arg(&script)
        .args([op, &dtype.name().to_ascii_uppercase()])
        .arg(&i)
        .arg(&o)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "gguf-py failed (bash scripts/install-test-deps.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&o).expect("output")
}

/// Values of every shape the quantizers branch on, 512 per case (a whole
/// number of blocks of every type).
fn cases() -> Vec<Vec<f32>> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let weights: Vec<f32> = (0..512).map(|_| next() * 0.05).collect();
    let mut spiky = weights.clone();
    spiky[7] = 3.5;
    spiky[300] = -4.25;
    let positive: Vec<f32> = weights.iter().map(|v| v.abs() + 0.01).collect();
    let ties: Vec<f32> = (0..512).map(|i| ((i % 17) as f32 - 8.0) * 0.125).collect();
    let mut zeros = vec![0.0f32; 512];
    zeros[260] = 1e-3;
    vec![weights, spiky, positive, ties, zeros, vec![0.0; 512]]
}

fn le(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Every case, one after the other (blocks are independent, so the
/// blocks of the whole are the blocks of each case in turn).
fn all_cases() -> Vec<f32> {
    cases().concat()
}

/// The first of `a` and `b`'s `size`-byte units that differ, if any.
fn first_diff(a: &[u8], b: &[u8], size: usize) -> Option<usize> {
    (a.len() != b.len())
        .then_some(0)
        .or_else(|| a.chunks(size).zip(b.chunks(size)).position(|(x, y)| x != y))
}

#[test]
fn our_quantize_equals_gguf_py() {
    let tmp = tempfile::tempdir().expect("tmp");
    let x = all_cases();
    for dtype in [
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
    ] {
        let mut ours = Vec::new();
        assert!(quant::quantize(&x, dtype, &mut ours));
        let theirs = gguf_py("quantize", dtype, &le(&x), tmp.path());
        let size = dtype.block().expect("block").1 as usize;
        assert_eq!(
            first_diff(&ours, &theirs, size),
            None,
            "{dtype}: block differs"
        );
    }
}

#[test]
fn our_dequantize_equals_gguf_py_for_every_type() {
    let tmp = tempfile::tempdir().expect("tmp");
    let x = all_cases();
    for dtype in QUANTIZED {
        let mut blocks = Vec::new();
        assert!(quant::quantize(&x, dtype, &mut blocks));
        let mut ours = Vec::new();
        assert!(quant::dequantize(&blocks, dtype, &mut ours));
        let theirs = gguf_py("dequantize", dtype, &blocks, tmp.path());
        assert_eq!(
            first_diff(&le(&ours), &theirs, 4),
            None,
            "{dtype}: value differs"
        );
    }
}
