//! Spectral blocks: round trips and the reconstruction of section 5.

#![allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unwrap_used
)]

use super::*;

#[test]
fn spectral_round_trip_and_reconstruction() {
    // U (3x2), S (2), Vt (2x4) in f32
    let u = [1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0];
    let s = [2.0f32, 0.5];
    let vt = [1.0f32, 2.0, 3.0, 4.0, -1.0, 0.0, 1.0, 2.0];
    let payload: Vec<u8> = u
        .iter()
        .chain(&s)
        .chain(&vt)
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let h = Header {
        metadata: Metadata::new(),
        blocks: vec![spectral_block(2, DType::F32, Quant::None)],
    };
    let g = write_knot(h, &[payload]).unwrap();
    let knot = Knot::parse(&g).unwrap();
    let w = reconstruct_spectral(&knot.blocks()[0], knot.payload(0).unwrap()).unwrap();
    let w: Vec<f32> = w
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(
        w,
        [2.0, 4.0, 6.0, 8.0, -0.5, 0.0, 0.5, 1.0, 1.5, 4.0, 6.5, 9.0]
    );

    // u8 quantised: q=zero+1 with scale 1 gives 1.0 everywhere
    let mut p = Vec::new();
    p.extend([3u8; 6]); // U_q 3x2
    p.extend([1.0f32; 3].iter().flat_map(|x| x.to_le_bytes())); // U_scale
    p.extend([2.0f32; 3].iter().flat_map(|x| x.to_le_bytes())); // U_zero -> (3-2)*1 = 1
    p.extend([1.0f32, 1.0].iter().flat_map(|x| x.to_le_bytes())); // S
    p.extend([4u8; 8]); // Vt_q 2x4
    p.extend([0.5f32; 2].iter().flat_map(|x| x.to_le_bytes())); // Vt_scale
    p.extend([0.0f32; 2].iter().flat_map(|x| x.to_le_bytes())); // Vt_zero -> 2.0
    let h = Header {
        metadata: Metadata::new(),
        blocks: vec![spectral_block(2, DType::U8, Quant::U8Affine)],
    };
    let g = write_knot(h, &[p]).unwrap();
    let knot = Knot::parse(&g).unwrap();
    let parts = SpectralParts::decode(&knot.blocks()[0], knot.payload(0).unwrap()).unwrap();
    assert!(parts.reconstruct().iter().all(|&x| x == 4.0));
}

fn random_parts(m: usize, n: usize, k: usize, seed: u64) -> SpectralParts {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
    };
    SpectralParts {
        m,
        n,
        k,
        u: (0..m * k).map(|_| next()).collect(),
        s: (0..k).map(|_| next().abs() * 10.0 + 0.1).collect(),
        vt: (0..k * n).map(|_| next()).collect(),
    }
}

/// Section 5's reconstruction, written out again from the spec's words:
/// one f32 accumulator per element from +0.0, k increasing, `U[i][k]·S[k]`
/// rounded first, then `·Vt[k][j]`, then the add; no fused multiply-add.
fn spec_reconstruction(p: &SpectralParts) -> Vec<f32> {
    let mut w = Vec::with_capacity(p.m * p.n);
    for i in 0..p.m {
        for j in 0..p.n {
            let mut acc = 0.0f32;
            for k in 0..p.k {
                let us: f32 = p.u[i * p.k + k] * p.s[k];
                let term: f32 = us * p.vt[k * p.n + j];
                acc += term;
            }
            w.push(acc);
        }
    }
    w
}

#[test]
fn spectral_reconstruction_is_bit_exact_with_the_spec() {
    let mut fma_differs = false;
    let mut order_differs = false;
    for seed in 1..=20u64 {
        let p = random_parts(9, 11, 7, seed * 0x9e37_79b9);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let ours = p.reconstruct();
        assert_eq!(bits(&ours), bits(&spec_reconstruction(&p)), "seed {seed}");
        // a streamed window gives the same bits
        assert_eq!(bits(&p.rows(3, 4)), bits(&ours[3 * 11..7 * 11]));
        // the test can tell: a fused multiply-add, or S folded into Vt
        // first, changes some bits
        for i in 0..p.m {
            for j in 0..p.n {
                let (mut fma, mut svt) = (0.0f32, 0.0f32);
                for k in 0..p.k {
                    let (u, s, v) = (p.u[i * p.k + k], p.s[k], p.vt[k * p.n + j]);
                    fma = (u * s).mul_add(v, fma);
                    svt += u * (s * v);
                }
                fma_differs |= fma.to_bits() != ours[i * p.n + j].to_bits();
                order_differs |= svt.to_bits() != ours[i * p.n + j].to_bits();
            }
        }
    }
    assert!(fma_differs && order_differs);
}

#[test]
fn spectral_encode_round_trips() {
    let p = random_parts(7, 5, 3, 42);
    let block = |factor: DType, quant: Quant, len: usize| Block {
        name: "w".into(),
        dtype: DType::F32,
        flags: 0,
        shape: vec![7, 5],
        encoding: Encoding::Spectral {
            rank: 3,
            factor_dtype: factor,
            quant,
            payload: Payload {
                offset: 0,
                len: len as u64,
                sha256: [0; 32],
            },
        },
        columnar: vec![],
    };
    // f32 factors: exact
    let bytes = p.encode(DType::F32, Quant::None).unwrap();
    let back = SpectralParts::decode(&block(DType::F32, Quant::None, bytes.len()), &bytes).unwrap();
    assert_eq!(back, p);
    // bf16 factors: each value is its bf16 rounding; S stays f32
    let bytes = p.encode(DType::BF16, Quant::None).unwrap();
    assert_eq!(bytes.len(), 2 * (7 * 3 + 3 * 5) + 4 * 3);
    let back =
        SpectralParts::decode(&block(DType::BF16, Quant::None, bytes.len()), &bytes).unwrap();
    assert_eq!(back.s, p.s);
    for (a, b) in back.u.iter().zip(&p.u) {
        assert_eq!(*a, half::bf16::from_f32(*b).to_f32());
    }
    // u8: within half a step of each row's range
    let bytes = p.encode(DType::U8, Quant::U8Affine).unwrap();
    assert_eq!(bytes.len(), 7 * 3 + 8 * 7 + 4 * 3 + 3 * 5 + 8 * 3);
    let back =
        SpectralParts::decode(&block(DType::U8, Quant::U8Affine, bytes.len()), &bytes).unwrap();
    assert_eq!(back.s, p.s);
    for (rows, orig, cols) in [(&back.u, &p.u, 3), (&back.vt, &p.vt, 5)] {
        for (r, o) in rows.chunks(cols).zip(orig.chunks(cols)) {
            let lo = o.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = o.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for (a, b) in r.iter().zip(o) {
                assert!(
                    (a - b).abs() <= (hi - lo) / 255.0 * 0.5001 + 1e-6,
                    "{a} vs {b}"
                );
            }
        }
    }
    // a constant row keeps its value
    let c = SpectralParts {
        m: 1,
        n: 2,
        k: 1,
        u: vec![0.25],
        s: vec![1.0],
        vt: vec![-3.0, -3.0],
    };
    let bytes = c.encode(DType::U8, Quant::U8Affine).unwrap();
    let mut b = block(DType::U8, Quant::U8Affine, bytes.len());
    b.shape = vec![1, 2];
    b.encoding = match b.encoding {
        Encoding::Spectral { payload, .. } => Encoding::Spectral {
            rank: 1,
            factor_dtype: DType::U8,
            quant: Quant::U8Affine,
            payload,
        },
        e => e,
    };
    assert_eq!(SpectralParts::decode(&b, &bytes).unwrap(), c);
    assert!(p.encode(DType::F32, Quant::U8Affine).is_err());
    assert!(p.encode(DType::U8, Quant::None).is_err());
}

#[test]
fn rule_spectral_figures() {
    let with = |lists: &[(&str, Vec<&str>)]| {
        let mut h = Header {
            metadata: Metadata::new(),
            blocks: vec![
                spectral_block(2, DType::F32, Quant::None),
                Block::dense("dense", DType::F32, vec![2]).unwrap(),
            ],
        };
        for (k, v) in lists {
            h.metadata.insert(
                (*k).into(),
                Value::StrList(v.iter().map(|s| (*s).to_owned()).collect()),
            );
        }
        raw_knot(&laid_out(h))
    };
    let good = [
        (keys::SPECTRAL_BLOCKS, vec!["attn.q"]),
        (keys::SPECTRAL_REL_ERROR, vec!["0.0123"]),
        (keys::SPECTRAL_ENERGY, vec!["0.99985"]),
    ];
    let bytes = with(&good);
    let knot = Knot::parse(&bytes).unwrap();
    assert_eq!(
        knot.header().header().spectral_figures(),
        [SpectralFigure {
            block: "attn.q",
            rel_frobenius_error: 0.0123,
            energy_kept: 0.99985
        }]
    );
    assert!(matches!(
        err(&with(&good[..2])),
        Error::ListIncomplete { .. }
    ));
    for (i, bad) in [vec!["attn.q", "attn.q"], vec!["dense"], vec!["nope"]]
        .into_iter()
        .enumerate()
    {
        let n = bad.len();
        let e = with(&[
            (keys::SPECTRAL_BLOCKS, bad),
            (keys::SPECTRAL_REL_ERROR, vec!["0.1"; n]),
            (keys::SPECTRAL_ENERGY, vec!["0.5"; n]),
        ]);
        assert!(
            matches!(err(&e), Error::SpectralMetadata { .. }),
            "case {i}"
        );
    }
    for (error, energy) in [
        ("1e-5", "0.5"),
        ("0.1", "1.5"),
        ("-0.1", "0.5"),
        ("0.1", ""),
        ("NaN", "0.5"),
    ] {
        let e = with(&[
            (keys::SPECTRAL_BLOCKS, vec!["attn.q"]),
            (keys::SPECTRAL_REL_ERROR, vec![error]),
            (keys::SPECTRAL_ENERGY, vec![energy]),
        ]);
        assert!(
            matches!(err(&e), Error::SpectralMetadata { .. }),
            "{error} {energy}"
        );
    }
    let e = with(&[
        (keys::SPECTRAL_BLOCKS, vec!["attn.q"]),
        (keys::SPECTRAL_REL_ERROR, vec!["0.1", "0.2"]),
        (keys::SPECTRAL_ENERGY, vec!["0.5"]),
    ]);
    assert!(matches!(err(&e), Error::SpectralMetadata { .. }));
    assert_eq!(decimal(1e-7), "0.0000001");
    assert_eq!(decimal(0.5), "0.5");
}
