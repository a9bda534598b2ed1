//! The kernels against the dequantized dot product, against each other
//! (this CPU's and the portable one), one token against four.

use gkq_format::DType;
use gkq_format::quant::{QK, dequantize, quantize};
use half::f16;

use super::*;

/// Values in [-1, 1) from a fixed linear congruential sequence.
pub(crate) fn noise(n: usize, seed: u64) -> Vec<f32> {
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

/// One token's blocks of 32.
fn q8(a: &[Q8Block]) -> Token<'_> {
    Token { q8: a, q8k: &[] }
}

/// The table: every 32-value block type has kernels, and Q4_K and Q6_K
/// (Q5_K none: candle multiplies it), each entry its own type's; a K type
/// is multiplied here only where the CPU has its SIMD kernel.
#[test]
fn the_table_has_the_32_value_types_q4_k_and_q6_k() {
    for dtype in gkq_format::QUANTIZED {
        let (values, _) = dtype.block().expect("a block type");
        let small = values == QK as u64;
        let want = small || matches!(dtype, DType::Q4_K | DType::Q6_K);
        let has = KERNELS.iter().filter(|k| k.dtype == dtype).count();
        assert_eq!(has, usize::from(want), "{dtype}");
        let simd = KERNELS
            .iter()
            .find(|k| k.dtype == dtype)
            .is_some_and(|k| k.simd.iter().flatten().any(|(isa, _)| isa.available()));
        assert_eq!(RowDot::of(dtype).is_some(), small || (want && simd));
        assert_eq!(RowDot::portable(dtype).is_some(), want, "{dtype}");
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

/// The f64 dot product of row `b` of `dtype`, dequantized, with the
/// activations `av(i)`, and the sum of the products' magnitudes.
pub(crate) fn dequantized_dot(b: &[u8], dtype: DType, av: impl Fn(usize) -> f64) -> (f64, f64) {
    let mut wd = Vec::new();
    assert!(dequantize(b, dtype, &mut wd));
    let (mut want, mut scale) = (0f64, 0f64);
    for (i, &v) in wd.iter().enumerate() {
        want += f64::from(v) * av(i);
        scale += (f64::from(v) * av(i)).abs();
    }
    (want, scale)
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
        let (want, scale) = dequantized_dot(&b, dtype, |i| {
            f64::from(a[i / QK].qs[i % QK]) * f64::from(a[i / QK].d)
        });
        for k in [RowDot::of(dtype), RowDot::portable(dtype)] {
            let got = k.expect("a kernel").dot(&b, q8(&a)).expect("lengths agree");
            // the minimum's term uses ggml's f16 `s`: a relative 2^-11
            assert!(
                (f64::from(got) - want).abs() <= scale * 1e-3,
                "{dtype}: {got} {want}"
            );
        }
        let short = RowDot::of(dtype).expect("a kernel");
        assert_eq!(short.dot(&b[1..], q8(&a)), None, "{dtype}");
    }
}

/// Any bytes: no panic, and this CPU's kernel agrees with the portable one.
#[test]
fn kernels_agree_on_arbitrary_bytes() {
    let x = noise(17 * 32, 3);
    let mut a = Vec::new();
    assert!(quantize_activations(&x, &mut a));
    for (seed, dtype) in DOT_TYPES.into_iter().enumerate() {
        let bytes = dtype.block().expect("a block type").1 as usize;
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
            assert_eq!(k.isa(), Isa::Avx2, "{dtype}");
        }
        let fast = k.dot(&raw, q8(&a));
        let slow = RowDot::portable(dtype).and_then(|k| k.dot(&raw, q8(&a)));
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
    let four = [q8(t[0]), q8(t[1]), q8(t[2]), q8(t[3])];
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
            assert_eq!(
                k.dot4(&b, [four[0], four[1], four[2], q8(&t[3][1..])]),
                None
            );
        }
    }
}
