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

/// One token's activations for the 32-value types.
fn q8(a: Q8Token<'_>) -> Token<'_> {
    Token { q8: a, q8k: &[] }
}

/// `x` quantized as one token.
fn one_token(x: &[f32]) -> Q8Acts {
    let mut a = Q8Acts::default();
    assert!(quantize_activations(x, &mut a));
    a
}

/// This CPU's kernels of `dtype`: each SIMD one it has, and the portable
/// one last.
pub(crate) fn all(dtype: DType) -> Vec<RowDot> {
    [Isa::Avx512Vnni, Isa::Avx2, Isa::Portable]
        .into_iter()
        .filter_map(|isa| RowDot::with_isa(dtype, isa))
        .collect()
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

/// Each 32 as ggml's Q8_0 (the K types' codes; their scales through f16),
/// and the sums of each 4 codes.
#[test]
fn activations_have_a_scale_per_32_and_sums_of_4() {
    let mut x = noise(256 + 64, 7);
    x[40] = -3.0;
    let a = one_token(&x);
    let t = a.token(0, 10);
    assert_eq!((a.blocks(), t.blocks()), (10, 10));
    let f16 = |d: f32| f16::from_f32(d).to_f32();
    assert_eq!((t.qs[40], t.d[1]), (-127, f16(3.0 / 127.0)));
    let mut k = Vec::new();
    assert!(quantize_activations_k(&x[..256], &mut k));
    assert_eq!(&t.qs[..256], &k[0].qs[..]);
    assert_eq!(&t.d[..8], &k[0].d.map(f16)[..]);
    for (i, (&q, &v)) in t.qs.iter().zip(&x).take(256).enumerate() {
        // the code is of the f32 scale, the scale stored through f16
        let (d16, d) = (t.d[i / QK], k[0].d[i / QK]);
        let bound = 127.0 * (d16 - d).abs() + d * 0.51;
        assert!((f32::from(q) * d16 - v).abs() <= bound, "{q} {v}");
    }
    for (s, q) in t.sums.iter().zip(t.qs.chunks_exact(4)) {
        assert_eq!(*s, q.iter().map(|&q| f32::from(q)).sum::<f32>());
    }
    let mut b = Q8Acts::default();
    assert!(!quantize_activations(&x[..31], &mut b));
    assert_eq!(b.blocks(), 0);
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
    let a = one_token(&x);
    let t = a.token(0, 4096 / QK);
    for dtype in DOT_TYPES {
        let mut b = Vec::new();
        assert!(quantize(&w, dtype, &mut b));
        let (want, scale) =
            dequantized_dot(&b, dtype, |i| f64::from(t.qs[i]) * f64::from(t.d[i / QK]));
        for k in all(dtype) {
            let got = k.dot(&b, q8(t)).expect("lengths agree");
            assert!(
                (f64::from(got) - want).abs() <= scale * 1e-5,
                "{dtype} {:?}: {got} {want}",
                k.isa()
            );
        }
        let short = RowDot::of(dtype).expect("a kernel");
        assert_eq!(short.dot(&b[1..], q8(t)), None, "{dtype}");
    }
}

/// Any bytes: no panic, and every kernel of this CPU gives the portable
/// one's bits, one token and four, with an even and an odd number of
/// blocks.
#[test]
fn kernels_agree_on_arbitrary_bytes() {
    let x = noise(4 * 17 * 32, 3);
    let a = one_token(&x);
    let tokens: Vec<Q8Token<'_>> = (0..4).map(|t| a.token(t, 17)).collect();
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
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            assert_ne!(RowDot::of(dtype).map(|k| k.isa()), Some(Isa::Portable));
        }
        let slow = RowDot::portable(dtype).expect("a kernel");
        for blocks in [17, 16, 1] {
            let raw = &raw[..blocks * bytes];
            let t: Vec<Token<'_>> = tokens.iter().map(|&t| q8(t)).collect();
            let t: Vec<Token<'_>> = t
                .iter()
                .map(|t| Token {
                    q8: Q8Token {
                        qs: &t.q8.qs[..32 * blocks],
                        d: &t.q8.d[..blocks],
                        d8: &t.q8.d8[..8 * blocks],
                        sums: &t.q8.sums[..8 * blocks],
                        bsums: &t.q8.bsums[..blocks],
                    },
                    q8k: &[],
                })
                .collect();
            let four = [t[0], t[1], t[2], t[3]];
            let want = four.map(|t| slow.dot(raw, t).expect("a dot").to_bits());
            for k in all(dtype) {
                let got = k.dot4(raw, four).expect("a dot").map(f32::to_bits);
                assert_eq!(got, want, "{dtype} {:?} {blocks}", k.isa());
                let one = k.dot(raw, four[1]).expect("a dot").to_bits();
                assert_eq!(one, want[1], "{dtype} {:?} {blocks}", k.isa());
            }
        }
    }
}

/// Four tokens at once equal one at a time, bit for bit, in every kernel.
#[test]
fn four_token_dots_equal_single_ones() {
    let x = noise(4 * 256, 4);
    let a = one_token(&x);
    let four: [Token<'_>; 4] = std::array::from_fn(|t| q8(a.token(t, 8)));
    for dtype in DOT_TYPES {
        let mut b = Vec::new();
        assert!(quantize(&noise(256, 5), dtype, &mut b));
        for k in all(dtype) {
            let got = k.dot4(&b, four).expect("lengths agree");
            for (g, a) in got.iter().zip(four) {
                let one = k.dot(&b, a).expect("lengths agree");
                assert_eq!(g.to_bits(), one.to_bits(), "{dtype}: {g} {one}");
            }
            let short = q8(a.token(0, 7));
            assert_eq!(k.dot4(&b, [four[0], four[1], four[2], short]), None);
        }
    }
}

/// Rows and tokens in one call equal each row's dot product with each
/// token, bit for bit, in either order (rows apart by more than the tokens,
/// or tokens apart by more than the rows); lengths that do not fit and
/// places that overlap are refused with nothing written.
#[test]
fn rows_equal_each_rows_dot_products() {
    // 13 tokens: a tile of eight, one of four and one alone; 37 rows: two
    // packed groups of 16 and one of 5
    let (rows, blocks, tokens) = (37, 3, 13);
    let a = one_token(&noise(tokens * blocks * QK, 8));
    let t: Vec<Token<'_>> = (0..tokens).map(|t| q8(a.token(t, blocks))).collect();
    let orders = [
        Steps {
            row: tokens + 1,
            token: 1,
        },
        Steps {
            row: 1,
            token: rows + 1,
        },
    ];
    for dtype in DOT_TYPES {
        let mut w = Vec::new();
        assert!(quantize(&noise(rows * blocks * QK, 9), dtype, &mut w));
        let row_bytes = w.len() / rows;
        for (k, steps) in all(dtype).into_iter().flat_map(|k| orders.map(|s| (k, s))) {
            let len = rows * tokens + rows.max(tokens);
            let mut out = vec![-1f32; len];
            let stored = k.pack(&w, rows).unwrap_or_else(|| w.clone());
            assert_eq!(k.rows(&stored, rows, &t, &mut out, steps), Some(()));
            let mut seen = 0;
            for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                for (j, &tok) in t.iter().enumerate() {
                    let want = k.dot(row, tok).expect("a dot").to_bits();
                    let at = r * steps.row + j * steps.token;
                    assert_eq!(out[at].to_bits(), want, "{dtype} {r} {j} {steps:?}");
                    seen += 1;
                }
            }
            let untouched = out.iter().filter(|&&v| v == -1.0).count();
            assert_eq!(untouched, len - seen, "only the products' places written");
            let mut short = vec![-1f32; rows * tokens - 1];
            let tight = Steps {
                row: tokens,
                token: 1,
            };
            let overlap = Steps {
                row: tokens - 1,
                token: 1,
            };
            assert_eq!(k.rows(&stored, rows, &t, &mut short, tight), None);
            assert_eq!(k.rows(&stored, rows, &t, &mut out, overlap), None);
            assert_eq!(k.rows(&stored[1..], rows, &t, &mut out, steps), None);
            assert!(short.iter().all(|&v| v == -1.0), "nothing written");
        }
    }
}

/// Q4_0's, Q4_K's and Q6_K's kernels take their rows packed, in whole
/// groups of 16 (the last filled up), no more bytes than that, and each
/// row unpacks to its bytes; the other types' take them as they are; rows
/// that are not whole blocks are refused.
#[test]
fn packing_is_whole_groups_of_the_rows_bytes() {
    let types = [
        (DType::Q4_0, 64),
        (DType::Q4_K, 256),
        (DType::Q6_K, 256),
        (DType::Q8_0, 64),
    ];
    for (dtype, cols) in types {
        let Some(k) = RowDot::of(dtype) else { continue };
        let mut w = Vec::new();
        assert!(quantize(&noise(37 * cols, 4), dtype, &mut w));
        let row_bytes = w.len() / 37;
        match k.pack(&w, 37) {
            Some(p) => {
                assert!(k.packs() && dtype != DType::Q8_0, "{dtype}");
                assert_eq!(
                    (k.stored_rows(37), p.len()),
                    (48, 48 * row_bytes),
                    "{dtype}"
                );
                for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                    let back = k.unpack_row(&p, 37, row_bytes, r);
                    assert_eq!(back.as_deref(), Some(row), "{dtype} row {r}");
                }
                assert_eq!(k.unpack_row(&p, 37, row_bytes, 37), None, "{dtype}");
                assert_eq!(
                    k.pack(&w[..w.len() - 1], 37),
                    None,
                    "{dtype}: not whole rows"
                );
            }
            None => assert!(!k.packs() && k.stored_rows(37) == 37, "{dtype}"),
        }
    }
}
