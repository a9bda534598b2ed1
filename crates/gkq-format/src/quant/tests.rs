//! Round trips and error bounds of every block type (the bytes against
//! gguf-py are `tests/gguf_py.rs`; the golden vectors are in FORMAT.md 3.5).

use super::QUANTIZED;
use super::*;

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

/// `round_i8` and the truncating code are `f32::round` and `f32::trunc`
/// then `as`, on the halves and their neighbours, the ends of the int8
/// range, NaN, the infinities, subnormals and one f32 in 4,099 of every
/// bit pattern (all 2^32 agreed when it was written).
#[test]
fn rounding_without_libm_equals_round_and_trunc() {
    let mut xs: Vec<f32> = (0..=u32::MAX).step_by(4_099).map(f32::from_bits).collect();
    for k in -260i32..=260 {
        let h = k as f32 + 0.5;
        xs.extend([k as f32, h, h.next_up(), h.next_down()]);
    }
    xs.extend([
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE / 2.0,
    ]);
    xs.extend([0.499_999_97, -0.499_999_97, 8_388_608.5, f32::MAX, f32::MIN]);
    for x in xs {
        assert_eq!(
            simple::round_i8(x),
            x.round() as i8,
            "{x:e} ({:#x})",
            x.to_bits()
        );
        assert_eq!(x as u8, x.trunc() as u8, "{x:e}");
    }
}

/// `quantize_seen` writes `quantize`'s blocks and hands over every value
/// once, in order, with what its block dequantizes to.
#[test]
fn quantize_seen_hands_over_each_value_with_its_dequantized_value() {
    let x = ramp(2048 + 256);
    for dtype in QUANTIZED {
        let (mut plain, mut seen_bytes) = (Vec::new(), Vec::new());
        assert!(quantize(&x, dtype, &mut plain));
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        assert!(quantize_seen(&x, dtype, &mut seen_bytes, |a, b| {
            xs.extend_from_slice(a);
            ys.extend_from_slice(b);
        }));
        assert_eq!(seen_bytes, plain, "{dtype}");
        assert_eq!(xs, x, "{dtype}");
        let mut y = Vec::new();
        assert!(dequantize(&plain, dtype, &mut y));
        assert_eq!(ys, y, "{dtype}");
    }
}
