//! Property tests: random knots round-trip through the writer and parser.

#![allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unwrap_used
)]

use super::*;
use proptest::prelude::*;

fn arb_block(i: usize) -> impl Strategy<Value = (Block, Vec<u8>)> {
    let dtypes = proptest::sample::select(DType::ALL.to_vec());
    (
        dtypes,
        proptest::collection::vec(0u64..5, 0..4),
        any::<u32>(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(move |(dtype, mut shape, flags, columnar, seed)| {
            if let Some((per, _)) = dtype.block() {
                // a block type: rows of whole blocks (section 3.5)
                if shape.is_empty() {
                    shape.push(1);
                }
                if let Some(last) = shape.last_mut() {
                    *last *= per;
                }
            }
            let mut b = Block::dense(format!("blk{i}.weight"), dtype, shape.clone()).unwrap();
            b.flags = flags & !(COLUMNAR_ELIGIBLE | IN_ROW_FILE);
            if columnar && shape.len() == 2 && shape[0] > 0 && shape[1] > 0 {
                b.flags |= COLUMNAR_ELIGIBLE;
                let d = if dtype.is_castable_float() {
                    DType::BF16
                } else {
                    dtype
                };
                b.columnar.push(
                    ColumnarDescriptor::for_shape(shape[0], shape[1], d, format!("b{i}.{d}.rows"))
                        .unwrap(),
                );
            }
            let len = b.encoding.payload().unwrap().len as usize;
            let bytes = (0..len)
                .map(|j| (seed.wrapping_mul(j as u64 + 1) >> 7) as u8)
                .collect();
            (b, bytes)
        })
}

fn arb_knot() -> impl Strategy<Value = (Header, Vec<Vec<u8>>)> {
    (
        0usize..6,
        proptest::collection::btree_map("[a-z.]{1,12}", any::<u64>(), 0..5),
    )
        .prop_flat_map(|(n, md)| {
            let blocks: Vec<_> = (0..n).map(arb_block).collect();
            (blocks, Just(md)).prop_map(|(blocks, md)| {
                let (blocks, payloads): (Vec<_>, Vec<_>) = blocks.into_iter().unzip();
                let metadata = md
                    .into_iter()
                    .filter(|(k, _)| {
                        !k.starts_with("model.")
                            && !k.starts_with("role.")
                            && !k.starts_with("source.")
                            && k != keys::TOOL
                    })
                    .map(|(k, v)| (k, Value::U64(v)))
                    .collect();
                (Header { metadata, blocks }, payloads)
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn prop_round_trip((header, payloads) in arb_knot()) {
        let bytes = write_knot(header.clone(), &payloads).unwrap();
        let knot = Knot::parse(&bytes).unwrap();
        let got = knot.header().header();
        prop_assert_eq!(&got.metadata, &header.metadata);
        prop_assert_eq!(got.blocks.len(), header.blocks.len());
        for (i, (a, b)) in got.blocks.iter().zip(&header.blocks).enumerate() {
            prop_assert_eq!(&a.name, &b.name);
            prop_assert_eq!(a.shape.clone(), b.shape.clone());
            prop_assert_eq!(a.flags, b.flags);
            prop_assert_eq!(knot.payload(i).unwrap(), payloads[i].as_slice());
            prop_assert_eq!(knot.verify_payload(i), Some(true));
        }
        // deterministic
        prop_assert_eq!(write_knot(header, &payloads).unwrap(), bytes);
    }

    #[test]
    fn prop_mutations_never_panic((header, payloads) in arb_knot(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8), cut in any::<usize>()) {
        let mut bytes = write_knot(header, &payloads).unwrap();
        for (at, v) in flips {
            let i = at % bytes.len();
            bytes[i] ^= v.max(1);
        }
        let _ = Knot::parse(&bytes);
        let _ = parse_prefix(&bytes);
        let _ = Knot::parse(&bytes[..cut % (bytes.len() + 1)]);
    }

    #[test]
    fn prop_arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Knot::parse(&bytes);
        let mut with_magic = MAGIC.to_vec();
        with_magic.extend_from_slice(&2u32.to_le_bytes());
        with_magic.extend_from_slice(&bytes);
        let _ = Knot::parse(&with_magic);
    }
}
