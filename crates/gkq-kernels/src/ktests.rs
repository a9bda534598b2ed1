//! The K types' kernels against the dequantized dot product, this CPU's
//! against the portable one bit for bit, four tokens against one.

use gkq_format::DType;
use gkq_format::quant::{QK_K, quantize};
use half::f16;

use super::tests::{all, dequantized_dot, noise};
use super::*;

const K_TYPES: [DType; 2] = [DType::Q4_K, DType::Q6_K];

fn q8k(a: &[Q8KBlock]) -> Token<'_> {
    Token {
        q8: Q8Token::default(),
        q8k: a,
    }
}

#[test]
fn k_activations_have_a_scale_per_32() {
    let mut x = noise(2 * QK_K, 7);
    x[300] = -3.0;
    let mut a = Vec::new();
    assert!(quantize_activations_k(&x, &mut a));
    assert_eq!(a.len(), 2);
    // the value of largest magnitude of its 32 is ±127
    assert_eq!(a[1].qs[300 - QK_K], -127);
    assert_eq!(a[1].d[(300 - QK_K) / 32], 3.0 / 127.0);
    for (b, c) in a.iter().zip(x.chunks_exact(QK_K)) {
        for (s, q) in b.bsums.iter().zip(b.qs.chunks_exact(16)) {
            assert_eq!(*s, q.iter().map(|&q| i16::from(q)).sum::<i16>());
        }
        for (p, q) in b.psums.iter().zip(b.qs.chunks_exact(32)) {
            assert_eq!(*p, q.iter().map(|&q| i16::from(q)).sum::<i16>());
        }
        for (i, (&q, &v)) in b.qs.iter().zip(c).enumerate() {
            let d = b.d[i / 32];
            assert!((f32::from(q) * d - v).abs() <= d * 0.51, "{q} {v}");
        }
    }
    assert!(quantize_activations_k(&[0.0; QK_K], &mut a));
    assert_eq!(
        (a[0].d, a[0].qs, a[0].bsums),
        ([0.0; 8], [0; QK_K], [0; 16])
    );
    assert!(!quantize_activations_k(&x[..255], &mut a));
}

/// Every K kernel against the f64 dot product of the dequantized row with
/// the dequantized activations.
#[test]
fn k_row_dots_equal_the_dequantized_dot_product() {
    let (w, x) = (noise(4096, 1), noise(4096, 2));
    let mut a = Vec::new();
    assert!(quantize_activations_k(&x, &mut a));
    for dtype in K_TYPES {
        let mut b = Vec::new();
        assert!(quantize(&w, dtype, &mut b));
        let (want, scale) = dequantized_dot(&b, dtype, |i| {
            let y = &a[i / QK_K];
            f64::from(y.qs[i % QK_K]) * f64::from(y.d[i % QK_K / 32])
        });
        for k in all(dtype) {
            let got = k.dot(&b, q8k(&a)).expect("lengths agree");
            assert!(
                (f64::from(got) - want).abs() <= scale * 1e-5,
                "{dtype} {:?}: {got} {want}",
                k.isa()
            );
            assert_eq!(k.dot(&b[1..], q8k(&a)), None, "{dtype}");
            assert_eq!(k.dot(&b, q8k(&a[1..])), None, "{dtype}");
        }
    }
}

/// Blocks of any bytes (finite scales, every code and scale bit pattern),
/// and activations up to ±127: this CPU's kernels give the portable
/// ones' bits, one token and four.
#[test]
fn k_kernels_equal_the_portable_ones_bit_for_bit() {
    let blocks = 24;
    let x: Vec<f32> = noise(4 * blocks * QK_K, 3)
        .iter()
        .enumerate()
        .map(|(i, v)| if i % 97 == 0 { 50.0 } else { v * 40.0 })
        .collect();
    let mut a = Vec::new();
    assert!(quantize_activations_k(&x, &mut a));
    let t: Vec<Token<'_>> = a.chunks_exact(blocks).map(q8k).collect();
    let four = [t[0], t[1], t[2], t[3]];
    for (seed, dtype) in K_TYPES.into_iter().enumerate() {
        let bytes = dtype.block().expect("a block type").1 as usize;
        let mut raw: Vec<u8> = noise(bytes * blocks, 20 + seed as u64)
            .iter()
            .map(|v| (v * 127.5 + 128.0) as u8)
            .collect();
        for (i, blk) in raw.chunks_exact_mut(bytes).enumerate() {
            let (d, m) = (f16::from_f32(0.01 + i as f32 * 1e-3), f16::from_f32(-0.02));
            match dtype {
                DType::Q4_K => {
                    blk[..2].copy_from_slice(&d.to_le_bytes());
                    blk[2..4].copy_from_slice(&m.to_le_bytes());
                }
                _ => blk[208..].copy_from_slice(&d.to_le_bytes()),
            }
            if i == 0 {
                // the extremes: every code and scale at its largest
                let end = if dtype == DType::Q4_K { bytes } else { 208 };
                blk[4.min(end)..end].fill(0xFF);
            }
        }
        let kernels = all(dtype);
        // each of the type's SIMD kernels runs where the CPU has it
        let entry = KERNELS.iter().find(|k| k.dtype == dtype).expect("entry");
        for &(isa, _) in entry.simd.iter().flatten() {
            let has = kernels.iter().any(|k| k.isa() == isa);
            assert_eq!(has, isa.available(), "{dtype} {isa:?}");
        }
        let slow = RowDot::portable(dtype).expect("portable");
        for fast in kernels {
            let want4 = slow.dot4(&raw, four).expect("lengths agree");
            let got4 = fast.dot4(&raw, four).expect("lengths agree");
            for i in 0..4 {
                let one = fast.dot(&raw, four[i]).expect("lengths agree");
                let want = slow.dot(&raw, four[i]).expect("lengths agree");
                let isa = fast.isa();
                assert_eq!(
                    one.to_bits(),
                    want.to_bits(),
                    "{dtype} {isa:?}: {one} {want}"
                );
                assert_eq!(got4[i].to_bits(), want.to_bits(), "{dtype} {isa:?} of four");
                assert_eq!(want4[i].to_bits(), want.to_bits(), "{dtype} of four");
            }
            let short = [four[0], four[1], four[2], q8k(&a[1..blocks])];
            assert_eq!(fast.dot4(&raw, short), None);
        }
    }
}

/// The matmul of K matrices with 32-value ones (Q4_0's packed), on
/// activations each form is quantized from, equals each row's dot
/// product, on two threads: 21 tokens (tiles of eight, four and one) and
/// 75, 111 rows in chunks of 16 gathered into place, a part's rows in more
/// than one tile of 16 and packed parts' last groups partial.
#[test]
fn matmul_quantizes_each_form_its_parts_take() {
    let cols = 512;
    let kinds = [
        (DType::Q4_K, 23),
        (DType::Q8_0, 37),
        (DType::Q6_K, 5),
        (DType::Q4_0, 46),
    ];
    let parts: Vec<(Vec<u8>, Vec<u8>, RowDot, usize)> = kinds
        .into_iter()
        .map(|(dtype, rows)| {
            let mut b = Vec::new();
            assert!(quantize(&noise(rows * cols, rows as u64), dtype, &mut b));
            let dot = RowDot::of(dtype)
                .or(RowDot::portable(dtype))
                .expect("kernel");
            let stored = dot.pack(&b, rows).unwrap_or_else(|| b.clone());
            (b, stored, dot, rows)
        })
        .collect();
    let mp: Vec<MatPart<'_>> = parts
        .iter()
        .map(|(_, stored, dot, rows)| MatPart {
            w: stored,
            dot: *dot,
            rows: *rows,
        })
        .collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("pool");
    for tokens in [21, 75] {
        let x = noise(tokens * cols, 8);
        let out = pool.install(|| matmul(&mp, &x, tokens));
        let (mut a8, mut a8k) = (Q8Acts::default(), Vec::new());
        assert!(quantize_activations(&x, &mut a8) && quantize_activations_k(&x, &mut a8k));
        for ((p, o), (w, ..)) in mp.iter().zip(&out).zip(&parts) {
            assert_eq!(o.len(), tokens * p.rows);
            let row_bytes = w.len() / p.rows;
            for t in 0..tokens {
                let tok = Token {
                    q8: a8.token(t, cols / 32),
                    q8k: &a8k[t * cols / QK_K..(t + 1) * cols / QK_K],
                };
                for r in 0..p.rows {
                    let want = p.dot.dot(&w[r * row_bytes..(r + 1) * row_bytes], tok);
                    let got = Some(o[t * p.rows + r]);
                    assert_eq!(got, want, "{} row {r} token {t} of {tokens}", p.dot.dtype());
                }
            }
        }
    }
}

/// Activations wider than the matrix's rows: every product is NaN, for a
/// prompt (written token after token, then gathered) as for one token.
#[test]
fn a_row_whose_length_disagrees_gives_nan() {
    let (cols, rows) = (512, 100);
    let mut w = Vec::new();
    assert!(quantize(&noise(rows * cols, 5), DType::Q8_0, &mut w));
    let dot = RowDot::of(DType::Q8_0).expect("kernel");
    let part = MatPart { w: &w, dot, rows };
    for tokens in [1, 21] {
        let x = noise(tokens * (cols + 32), 6);
        let out = matmul(&[part], &x, tokens).remove(0);
        assert_eq!(out.len(), rows * tokens);
        assert!(out.iter().all(|v| v.is_nan()), "{tokens} tokens");
    }
}

#[test]
fn nearest_rounds_ties_to_even() {
    for (x, want) in [
        (2.5, 2),
        (-2.5, -2),
        (3.5, 4),
        (0.49, 0),
        (-127.0, -127),
        (126.6, 127),
    ] {
        assert_eq!(kquant::nearest(x), want, "{x}");
        assert_eq!(kquant::nearest(x), x.round_ties_even() as i32, "{x}");
    }
}
