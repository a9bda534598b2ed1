//! Row proofs: RFC 9162 roots, records and the proof height.

#![allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unwrap_used
)]

use super::*;
use proptest::prelude::*;

/// A descriptor for `rows` rows of `row_bytes` bytes with the given proof.
fn proof_desc(rows: u64, row_bytes: u64, height: u8, root: [u8; 32]) -> ColumnarDescriptor {
    let mut d = ColumnarDescriptor::for_shape(rows, row_bytes, DType::U8, "t.u8.rows".into())
        .expect("small shape");
    d.proof = Some(RowProof { height, root });
    d
}

#[test]
fn merkle_root_is_rfc9162_over_rows() {
    // RFC 9162 section 2.1.1 written out for five leaves:
    // MTH(d0..d4) = H(1 || H(1 || H(1||L0||L1) || H(1||L2||L3)) || L4)
    let rows: Vec<[u8; 1]> = (0..5u8).map(|i| [i]).collect();
    let l: Vec<_> = rows.iter().map(|r| merkle::leaf_hash(r)).collect();
    let n = merkle::node_hash;
    let expect = n(&n(&n(&l[0], &l[1]), &n(&l[2], &l[3])), &l[4]);
    for height in 0..=4 {
        let (root, object) = merkle::build_proof(&l, height).unwrap();
        assert_eq!(root, expect, "height {height}");
        let layout = merkle::ProofLayout::new(5, height).unwrap();
        assert_eq!(object.len() as u64, layout.object_len().unwrap());
        assert_eq!(
            layout.object_len(),
            Some(32 * (5u64.div_ceil(1 << height) + 5 * u64::from(height)))
        );
    }
    // leaf and node hashes are domain-separated: a node is never a leaf
    assert_ne!(merkle::leaf_hash(&[1; 64]), n(&[1; 32], &[1; 32]));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// For random row files and heights, every row verifies with its record,
    /// and any single-bit change in a row, its record or the table is caught.
    #[test]
    fn prop_row_proofs_verify_and_catch_every_bit(
        rows in 1usize..70,
        row_bytes in 1usize..6,
        height in 0u8..7,
        seed in any::<u64>(),
        pick in any::<prop::sample::Index>(),
        bit in any::<prop::sample::Index>(),
    ) {
        let data: Vec<u8> = (0..rows * row_bytes)
            .map(|i| (seed.wrapping_mul(6364136223846793005).wrapping_add((i as u64).wrapping_mul(1442695040888963407)) >> 33) as u8)
            .collect();
        let leaves: Vec<_> = data.chunks(row_bytes).map(merkle::leaf_hash).collect();
        let (root, object) = merkle::build_proof(&leaves, height).unwrap();
        prop_assert_eq!(Some(root), merkle::tree_hash(&leaves));
        let d = proof_desc(rows as u64, row_bytes as u64, height, root);
        let layout = merkle::layout_of(&d).unwrap();
        let table_len = layout.table_len() as usize;
        let roots = merkle::check_table(&d, &object[..table_len]).unwrap();
        let record = |i: usize| {
            let (a, b) = layout.records_range(i as u64, 1).unwrap();
            object[a as usize..b as usize].to_vec()
        };
        for i in 0..rows {
            let row = &data[i * row_bytes..(i + 1) * row_bytes];
            prop_assert!(merkle::check_row(&d, &roots, i as u64, row, &record(i)).is_ok());
        }
        let i = pick.index(rows);
        let row = data[i * row_bytes..(i + 1) * row_bytes].to_vec();
        // a flipped bit in the row
        let mut bad = row.clone();
        let b = bit.index(bad.len() * 8);
        bad[b / 8] ^= 1 << (b % 8);
        prop_assert!(merkle::check_row(&d, &roots, i as u64, &bad, &record(i)).is_err());
        // a flipped bit in its record (if it has one)
        let rec = record(i);
        if !rec.is_empty() {
            let mut bad = rec.clone();
            let b = bit.index(bad.len() * 8);
            bad[b / 8] ^= 1 << (b % 8);
            prop_assert!(merkle::check_row(&d, &roots, i as u64, &row, &bad).is_err());
        }
        // another row's bytes under this index
        if rows > 1 {
            let j = (i + 1) % rows;
            let other = &data[j * row_bytes..(j + 1) * row_bytes];
            if other != row.as_slice() {
                prop_assert!(merkle::check_row(&d, &roots, i as u64, other, &rec).is_err());
            }
        }
        // a flipped bit in the table, and a truncated table
        let mut table = object[..table_len].to_vec();
        let b = bit.index(table.len() * 8);
        table[b / 8] ^= 1 << (b % 8);
        prop_assert!(merkle::check_table(&d, &table).is_err());
        prop_assert!(merkle::check_table(&d, &object[..table_len - 1]).is_err());
    }
}

#[test]
fn default_proof_height_keeps_records_within_twelve_percent_and_the_table_within_64_kib() {
    // Qwen2.5-0.5B: 151,936 rows of 896 values
    assert_eq!(merkle::default_proof_height(151_936, 3584), 13); // f32: 416 B, 11.6 %
    // bf16 (12 % would be h = 6, a 75,968-byte table): h = 7, 224 B per
    // row and 1,187 roots; q8_0 (952-byte rows) and q4_0 (504) the same
    for row_bytes in [1792, 952, 504] {
        assert_eq!(merkle::default_proof_height(151_936, row_bytes), 7);
    }
    assert_eq!(151_936u64.div_ceil(1 << 7), 1187);
    // a small vocabulary keeps the 12 % rule
    assert_eq!(merkle::default_proof_height(1024, 256), 0);
    assert_eq!(merkle::default_proof_height(2, 12), 0);
    assert_eq!(merkle::default_proof_height(1, 1 << 20), 0); // one row: no path
    assert_eq!(merkle::default_proof_height(100, 1 << 20), 7); // ceil(log2 100)
}

#[test]
fn first_inexact_finds_values_that_do_not_cast_back() {
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let bf16s = |v: &[f32]| {
        v.iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    // bf16 values widened to f32 narrow back exactly
    let src = bf16s(&[1.0, -0.078125, 3.5e10]);
    let mut wide = Vec::new();
    cast_row(&src, DType::BF16, DType::F32, &mut wide).unwrap();
    assert_eq!(first_inexact(&wide, DType::F32, &src, DType::BF16), None);
    // f32 values narrowed to bf16 do not widen back, at the first lossy one
    let src = f32s(&[1.0, 0.1, 2.0]);
    let mut narrow = Vec::new();
    cast_row(&src, DType::F32, DType::BF16, &mut narrow).unwrap();
    assert_eq!(
        first_inexact(&narrow, DType::BF16, &src, DType::F32),
        Some(1)
    );
    assert_eq!(
        first_inexact(&src, DType::F32, &src[..8], DType::F32),
        Some(2)
    );
}

/// FORMAT.md 7b's golden vector: the runs object of three 2-byte rows at
/// proof height 1, written and checked by this crate.
#[test]
fn runs_object_golden_vector() {
    use crate::runs::{RunsLayout, check_runs, write_runs};
    let rows = [1u8, 2, 3, 4, 5, 6];
    let leaves: Vec<_> = rows.chunks(2).map(merkle::leaf_hash).collect();
    let (root, proof) = merkle::build_proof(&leaves, 1).unwrap();
    assert_eq!(
        crate::hex(&root),
        "404decb30b7393262416216bd997ef8b929067e16f6e62166545d8771744eeba"
    );
    let mut d = ColumnarDescriptor::for_shape(3, 2, DType::U8, "g.rows".into()).unwrap();
    d.proof = Some(RowProof { height: 1, root });
    let layout = RunsLayout::of(&d).unwrap();
    assert_eq!((layout.stride(), layout.object_len()), (34, Some(102)));
    let table = merkle::layout_of(&d).unwrap().table_len() as usize;
    let mut runs = Vec::new();
    write_runs(&layout, &mut &rows[..], &mut &proof[table..], &mut runs).unwrap();
    let golden = "0102ed2139a910c69105ce3628d7aae9c530ad4cbb6aa45a683a0eb02f85a2807287\
                  0304ae4b3280e56e2faf83f414a6e3dabe9d5fbe18976544c05fed121accb85b53fc\
                  05060000000000000000000000000000000000000000000000000000000000000000";
    assert_eq!(crate::hex(&runs), golden);
    let roots = merkle::check_table(&d, &proof[..table]).unwrap();
    // any range of whole strides verifies, and gives the rows back
    assert_eq!(check_runs(&d, &roots, 0, &runs).unwrap(), rows);
    assert_eq!(check_runs(&d, &roots, 1, &runs[34..68]).unwrap(), [3, 4]);
    // a changed byte anywhere in a stride fails it
    for at in [0usize, 5, 40, 100] {
        let mut bad = runs.clone();
        bad[at] ^= 1;
        assert!(check_runs(&d, &roots, 0, &bad).is_err(), "byte {at}");
    }
    // a stride of another row fails at that row's position
    assert!(check_runs(&d, &roots, 0, &runs[34..68]).is_err());
}

#[test]
fn row_ranges_end_after_the_last_row_and_never_overflow() {
    let d = ColumnarDescriptor::for_shape(10, 3, DType::F32, "x".into()).expect("desc");
    assert_eq!(d.row_range(2, 3), Some((24, 60)));
    assert_eq!(d.row_range(9, 1), Some((108, 120)));
    assert_eq!(d.row_range(9, 2), None, "past the last row");
    let mut far = d.clone();
    far.rows = u64::MAX;
    let overflow = far.row_range(u64::MAX / 2, 1);
    assert_eq!(overflow, None, "an overflow, not a 1-byte range");
}
