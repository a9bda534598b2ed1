//! Round trips and error bounds of every block type (the bytes against
//! gguf-py are `tests/gguf_py.rs`; the golden vectors are in FORMAT.md 3.5).

use super::QUANTIZED;
use super::*;
use half::f16;

fn ramp(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
        .collect()
}

#[test]
fn every_type_round_trips_within_its_step() {
    let x = ramp(512);
    for dtype in QUANTIZED {
        let (n, size) = layout(dtype).expect("a block type");
        let mut b = Vec::new();
        assert!(quantize(&x, dtype, &mut b), "{dtype}");
        assert_eq!(b.len(), x.len() / n * size, "{dtype}");
        let mut y = Vec::new();
        assert!(dequantize(&b, dtype, &mut y), "{dtype}");
        assert_eq!(y.len(), x.len());
        let max_err = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        // half a step of the coarsest type (4 bits over [-0.8, 0.8]), and a margin
        assert!(max_err < 0.12, "{dtype}: {max_err}");
    }
}

#[test]
fn wrong_lengths_and_other_dtypes_are_refused() {
    let mut v = Vec::new();
    assert!(!dequantize(&[0u8; 33], DType::Q8_0, &mut v));
    assert!(!dequantize(&[0u8; 8], DType::F32, &mut v));
    let mut b = Vec::new();
    assert!(!quantize(&[0.0; 31], DType::Q4_0, &mut b));
    assert!(!quantize(&[0.0; 32], DType::Q4_K, &mut b));
    assert!(!quantize(&[0.0; 32], DType::BF16, &mut b));
}

#[test]
fn any_bytes_dequantize_without_panicking() {
    let mut state = 7u32;
    for dtype in QUANTIZED {
        let (_, size) = layout(dtype).expect("block");
        let bytes: Vec<u8> = (0..size * 3)
            .map(|_| {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                (state >> 16) as u8
            })
            .collect();
        let mut y = Vec::new();
        assert!(dequantize(&bytes, dtype, &mut y), "{dtype}");
    }
}

/// The golden vectors of FORMAT.md 3.5, read from the document: for each
/// type, the blocks of the ramp `x[i] = ((37·i mod 101) − 50) / 64`,
/// `i < 256` (their SHA-256, and the first block in hex), and the
/// dequantized values' SHA-256 (little-endian f32).
#[test]
fn golden_vectors_are_the_documents() {
    use sha2::{Digest, Sha256};
    let doc = include_str!("../../../../docs/FORMAT.md");
    let start = doc.find("QUANT-GOLDEN-BEGIN").expect("marker") + "QUANT-GOLDEN-BEGIN".len();
    let end = doc.find("QUANT-GOLDEN-END").expect("marker");
    let lines: Vec<&str> = doc[start..end]
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    let x = ramp(256);
    let mut seen = 0;
    for line in lines {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [name, blocks_sha, values_sha, first] = f[..] else {
            panic!("a golden line is `type blocks-sha256 values-sha256 first-block-hex`: {line}");
        };
        let dtype: DType = name.parse().expect("a type");
        let mut b = Vec::new();
        assert!(quantize(&x, dtype, &mut b));
        let mut y = Vec::new();
        assert!(dequantize(&b, dtype, &mut y));
        let yb: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
        let size = layout(dtype).expect("block").1;
        assert_eq!(
            crate::hex(&Sha256::digest(&b)),
            blocks_sha,
            "{dtype} blocks"
        );
        assert_eq!(
            crate::hex(&Sha256::digest(&yb)),
            values_sha,
            "{dtype} values"
        );
        assert_eq!(crate::hex(&b[..size]), first, "{dtype} first block");
        seen += 1;
    }
    assert_eq!(seen, QUANTIZED.len());
}

/// Every dtype is a scalar type (an item size) or a block type of the
/// table, with its kernels: a quantized `DType` added without an entry
/// fails here (it would otherwise have no layout, and no kernel).
#[test]
fn every_dtype_is_scalar_or_a_block_type_with_kernels() {
    for d in DType::ALL {
        let scalar = d.itemsize() > 0;
        let block = super::BLOCK_TYPES.iter().filter(|t| t.dtype == d).count();
        assert!(
            scalar != (block == 1) && block <= 1,
            "{d}: item size {}, {block} block-type entries",
            d.itemsize()
        );
    }
    for (t, d) in super::BLOCK_TYPES.iter().zip(QUANTIZED) {
        assert_eq!(t.dtype, d);
        let mut out = Vec::new();
        assert!(super::quantize(&vec![0.5; t.values], d, &mut out), "{d}");
        assert_eq!(out.len(), t.bytes, "{d}");
    }
}

/// Values in [-1, 1) from a fixed linear congruential sequence.
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

const DOT_TYPES: [DType; 5] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
];

#[test]
fn the_32_value_types_have_a_dot_product_and_the_k_types_none() {
    for t in &BLOCK_TYPES {
        assert_eq!(t.dot.is_some(), t.values == QK, "{}", t.dtype);
        assert_eq!(RowDot::of(t.dtype).is_some(), t.values == QK);
    }
}

#[test]
fn activations_are_ggml_q8_1_blocks() {
    let x = noise(256, 7);
    let mut a = Vec::new();
    assert!(quantize_activations(&x, &mut a));
    assert_eq!(a.len(), 8);
    for (b, c) in a.iter().zip(x.chunks_exact(QK)) {
        let amax = c.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(b.d, f16::from_f32(amax / 127.0).to_f32());
        assert_eq!(b.qs.iter().map(|&q| i32::from(q).abs()).max(), Some(127));
        let sum: i32 = b.qs.iter().map(|&q| i32::from(q)).sum();
        let d = f16::from_f32(amax / 127.0);
        assert_eq!(
            b.s,
            (f16::from_f32(sum as f32) * d).to_f32(),
            "candle's rounding"
        );
        for (&q, &v) in b.qs.iter().zip(c) {
            assert!(
                (f32::from(q) * b.d - v).abs() <= b.d * 0.51 + 1e-3,
                "{q} {v}"
            );
        }
    }
    assert!(!quantize_activations(&x[..31], &mut a));
}

/// Every kernel (this CPU's and the portable one) against the f64 dot
/// product of the dequantized row with the dequantized activations.
#[test]
fn row_dots_equal_the_dequantized_dot_product() {
    let (w, x) = (noise(4096, 1), noise(4096, 2));
    let mut a = Vec::new();
    assert!(quantize_activations(&x, &mut a));
    for dtype in DOT_TYPES {
        let mut b = Vec::new();
        assert!(quantize(&w, dtype, &mut b));
        let mut wd = Vec::new();
        assert!(dequantize(&b, dtype, &mut wd));
        let (mut want, mut scale) = (0f64, 0f64);
        for (i, &v) in wd.iter().enumerate() {
            let y = &a[i / QK];
            let av = f64::from(y.qs[i % QK]) * f64::from(y.d);
            want += f64::from(v) * av;
            scale += f64::from(v).abs() * av.abs();
        }
        for k in [RowDot::of(dtype), RowDot::portable(dtype)] {
            let got = k.expect("a kernel").dot(&b, &a).expect("lengths agree");
            // the minimum's term uses ggml's f16 `s`: a relative 2^-11
            assert!(
                (f64::from(got) - want).abs() <= scale * 1e-3,
                "{dtype}: {got} {want}"
            );
        }
        let short = RowDot::of(dtype).expect("a kernel");
        assert_eq!(short.dot(&b[1..], &a), None, "{dtype}");
    }
}

/// Any bytes: no panic, and this CPU's kernel agrees with the portable one.
#[test]
fn kernels_agree_on_arbitrary_bytes() {
    let x = noise(17 * 32, 3);
    let mut a = Vec::new();
    assert!(quantize_activations(&x, &mut a));
    for (seed, dtype) in DOT_TYPES.into_iter().enumerate() {
        let (_, bytes) = layout(dtype).expect("a block type");
        let mut raw: Vec<u8> = noise(bytes * 17, 10 + seed as u64)
            .iter()
            .map(|v| (v * 127.0 + 128.0) as u8)
            .collect();
        // finite scales and minima, any codes
        for blk in raw.chunks_exact_mut(bytes) {
            blk[..2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
            if matches!(dtype, DType::Q4_1 | DType::Q5_1) {
                blk[2..4].copy_from_slice(&f16::from_f32(-0.3).to_le_bytes());
            }
        }
        let k = RowDot::of(dtype).expect("a kernel");
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            assert_eq!(k.isa(), "avx2", "{dtype}");
        }
        let fast = k.dot(&raw, &a);
        let slow = RowDot::portable(dtype).and_then(|k| k.dot(&raw, &a));
        let (f, s) = (fast.expect("a dot"), slow.expect("a dot"));
        assert!((f - s).abs() <= 1e-4 * s.abs().max(1.0), "{dtype}: {f} {s}");
    }
}

/// Four tokens at once equal one at a time, bit for bit, in every kernel.
#[test]
fn four_token_dots_equal_single_ones() {
    let x = noise(4 * 256, 4);
    let mut a = Vec::new();
    assert!(quantize_activations(&x, &mut a));
    let t: Vec<&[Q8Block]> = a.chunks_exact(8).collect();
    let four = [t[0], t[1], t[2], t[3]];
    for dtype in DOT_TYPES {
        let mut b = Vec::new();
        assert!(quantize(&noise(256, 5), dtype, &mut b));
        for k in [RowDot::of(dtype), RowDot::portable(dtype)] {
            let k = k.expect("a kernel");
            let got = k.dot4(&b, four).expect("lengths agree");
            for (g, a) in got.iter().zip(four) {
                let one = k.dot(&b, a).expect("lengths agree");
                assert_eq!(g.to_bits(), one.to_bits(), "{dtype}: {g} {one}");
            }
            assert_eq!(k.dot4(&b, [t[0], t[1], t[2], &t[3][1..]]), None);
        }
    }
}

/// Issue 57: a Q8_0 block holding NaN takes ggml's scale, whose
/// `MAX(a, b)` (`a > b ? a : b`) lets a NaN replace the maximum and a
/// later value replace the NaN: `[1.0, NaN, 0.5, 0.25, …]` has d = 0.5/127
/// (0x1c08, not f32::max's 1/127, 0x2008) and an all-NaN block d = NaN
/// (0x7e00, not 0), its codes 0 (ggml's conversion of NaN on x86).
#[test]
fn a_q8_0_block_with_nan_takes_ggmls_scale() {
    let mut x = vec![0.25f32; QK];
    x[0] = 1.0;
    x[1] = f32::NAN;
    x[2] = 0.5;
    let mut b = Vec::new();
    assert!(quantize(&x, DType::Q8_0, &mut b));
    assert_eq!([b[0], b[1]], 0x1c08u16.to_le_bytes());
    // 1.0 and 0.5 at d = 0.5/127: 1.0 rounds to 254, past i8: saturated
    assert_eq!(&b[2..6], &[127, 0, 127, 64]);
    let mut b = Vec::new();
    assert!(quantize(&[f32::NAN; QK], DType::Q8_0, &mut b));
    assert_eq!([b[0], b[1]], 0x7e00u16.to_le_bytes());
    assert!(b[2..].iter().all(|&q| q == 0));
}
