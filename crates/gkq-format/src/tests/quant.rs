//! The block types in knots (section 3.5 and rules 9, 12): version 4
//! exactly when a block type is used, their shapes and lengths, the
//! exactness flags of their row files, and the `quant.*` figures.

#![allow(clippy::indexing_slicing, clippy::unwrap_used)]

use super::*;

/// The golden header with its embedding stored as `dtype`: a 2 × 64 block
/// (two whole blocks of the 32-value types per row) with one row file in
/// its own type.
fn quantized(dtype: DType) -> Header {
    let (mut h, _) = golden_parts();
    let mut b = Block::dense("embed.weight", dtype, vec![2, 64]).unwrap();
    b.flags = COLUMNAR_ELIGIBLE;
    let mut d = ColumnarDescriptor::for_shape(2, 64, dtype, "token_embd.q.rows".into()).unwrap();
    d.flags = BLOCK_EXACT;
    b.columnar.push(d);
    h.blocks[0] = b;
    h.blocks[1].dtype = dtype;
    h.blocks[1].shape = vec![2, 64];
    h
}

/// `raw_knot` of `h` as version `v`.
fn raw_version(h: &Header, v: u32) -> Vec<u8> {
    let mut bytes = raw_knot(&laid_out(h.clone()));
    let mut pre = crate::parse::parse_preamble(&bytes).unwrap();
    pre.version = v;
    let head = bytes[72..72 + pre.header_len as usize].to_vec();
    reseal(&mut bytes, &pre, &head);
    bytes
}

#[test]
fn writers_write_version_4_exactly_for_block_types() {
    let h = quantized(DType::Q8_0);
    let payload = vec![0u8; 2 * 2 * 34];
    let bytes = write_knot(h, &[payload]).unwrap();
    let knot = Knot::parse(&bytes).unwrap();
    assert_eq!(knot.header().preamble().version, 4);
    assert_eq!(knot.blocks()[0].columnar[0].row_bytes, 68);
    let (h, payloads) = golden_parts();
    let bytes = write_knot(h, &payloads).unwrap();
    assert_eq!(Knot::parse(&bytes).unwrap().header().preamble().version, 3);
}

#[test]
fn versions_2_and_3_refuse_block_types() {
    let h = quantized(DType::Q4_0);
    for v in [2, 3] {
        let e = err(&raw_version(&h, v));
        assert!(
            matches!(&e, Error::DtypeVersion { version, .. } if *version == v),
            "version {v}: {e}"
        );
    }
    Knot::parse(&raw_version(&quantized(DType::Q4_0), 4)).unwrap();
}

#[test]
fn rows_must_be_whole_blocks() {
    // 64 values per row are not a whole Q4_K super-block of 256
    let mut h = quantized(DType::Q4_0);
    h.blocks[0].dtype = DType::Q4_K;
    h.blocks[1].dtype = DType::Q4_K;
    let e = err(&raw_version(&h, 4));
    assert!(
        matches!(
            &e,
            Error::BlockShape {
                cols: 64,
                per: 256,
                ..
            }
        ),
        "{e}"
    );
    // and a dtype constructor says so too
    assert!(Block::dense("x", DType::Q4_K, vec![2, 64]).is_none());
    assert!(DType::Q4_K.row_bytes(64).is_none());
    assert_eq!(DType::Q4_K.row_bytes(512), Some(288));
}

#[test]
fn a_quantized_block_is_rows_times_row_bytes_long() {
    let mut h = quantized(DType::Q4_0);
    if let Some(p) = h.blocks[0].encoding.payload_mut() {
        p.len += 1;
    }
    let e = err(&raw_version(&h, 4));
    assert!(
        matches!(
            &e,
            Error::PayloadLength {
                expected: 72,
                found: 73,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn exactness_flags_of_block_type_rows() {
    // a block type's values are never SOURCE_EXACT
    let mut h = quantized(DType::Q8_0);
    h.blocks[0].columnar[0].flags = BLOCK_EXACT | SOURCE_EXACT;
    let e = err(&raw_version(&h, 4));
    assert!(
        matches!(&e, Error::DescriptorField { field: "flags", .. }),
        "{e}"
    );
    // rows of a float block in a block type are lossy: never BLOCK_EXACT
    let (mut h, _) = golden_parts();
    h.blocks[0].shape = vec![2, 64];
    h.blocks[1].shape = vec![2, 64];
    if let Some(p) = h.blocks[0].encoding.payload_mut() {
        p.len = 2 * 64 * 4;
    }
    let f32_rows = ColumnarDescriptor::for_shape(2, 64, DType::F32, "e.f32.rows".into()).unwrap();
    let mut q = ColumnarDescriptor::for_shape(2, 64, DType::Q4_0, "e.q4_0.rows".into()).unwrap();
    h.blocks[0].columnar = vec![
        ColumnarDescriptor {
            flags: BLOCK_EXACT,
            ..f32_rows
        },
        q.clone(),
    ];
    Knot::parse(&raw_version(&h, 4)).unwrap();
    q.flags = BLOCK_EXACT;
    h.blocks[0].columnar[1] = q;
    let e = err(&raw_version(&h, 4));
    assert!(
        matches!(&e, Error::DescriptorField { field: "flags", .. }),
        "{e}"
    );
    // a quantized block has rows of its own type only
    let mut h = quantized(DType::Q8_0);
    let f = ColumnarDescriptor::for_shape(2, 64, DType::F32, "e.f32.rows".into()).unwrap();
    h.blocks[0].columnar.push(f);
    let e = err(&raw_version(&h, 4));
    assert!(
        matches!(&e, Error::DescriptorField { field: "dtype", .. }),
        "{e}"
    );
    // issue 42 (9b, round 5): rows of 64 columns in a type of 256-value
    // blocks are refused saying so (it said "row_bytes is overflow")
    let (mut h, _) = golden_parts();
    h.blocks[0].shape = vec![2, 64];
    h.blocks[1].shape = vec![2, 64];
    if let Some(p) = h.blocks[0].encoding.payload_mut() {
        p.len = 2 * 64 * 4;
    }
    let mut k = ColumnarDescriptor::for_shape(2, 256, DType::Q4_K, "e.q4_k.rows".into()).unwrap();
    k.row_bytes = 0;
    k.byte_len = 0;
    h.blocks[0].columnar = vec![k];
    let e = err(&raw_version(&h, 4));
    assert!(
        matches!(&e, Error::DescriptorField { field: "dtype", .. })
            && e.to_string().contains("64 columns are not whole blocks"),
        "{e}"
    );
}

#[test]
fn quant_figures_name_quantized_dense_blocks_in_order() {
    let with = |blocks: &[&str], rmse: &[&str], max: &[&str]| {
        let mut h = quantized(DType::Q4_0);
        let list = |v: &[&str]| Value::StrList(v.iter().map(|s| (*s).to_owned()).collect());
        h.metadata.insert(keys::QUANT_BLOCKS.into(), list(blocks));
        h.metadata.insert(keys::QUANT_RMSE.into(), list(rmse));
        h.metadata
            .insert(keys::QUANT_MAX_ABS_ERROR.into(), list(max));
        raw_version(&h, 4)
    };
    let ok = with(&["embed.weight"], &["0.0012"], &["0.0040"]);
    let knot = Knot::parse(&ok).unwrap();
    let f = knot.header().header().quant_figures();
    assert_eq!(
        (f[0].block, f[0].rmse, f[0].max_abs_error),
        ("embed.weight", 0.0012, 0.004)
    );
    for (blocks, rmse, max, why) in [
        (
            &["lm_head.weight"][..],
            &["0.1"][..],
            &["0.1"][..],
            "not a quantized dense block",
        ),
        (&["embed.weight"], &["1e-3"], &["0.1"], "not a decimal"),
        (
            &["embed.weight"],
            &["0.1", "0.2"],
            &["0.1"],
            "1 blocks but 2 and 1 figures",
        ),
    ] {
        let e = err(&with(blocks, rmse, max));
        assert!(
            matches!(&e, Error::QuantMetadata { reason, .. } if reason.contains(why)),
            "{why}: {e}"
        );
    }
    let mut h = quantized(DType::Q4_0);
    h.metadata.insert(
        keys::QUANT_BLOCKS.into(),
        Value::StrList(vec!["embed.weight".into()]),
    );
    assert!(matches!(
        err(&raw_version(&h, 4)),
        Error::ListIncomplete { .. }
    ));
}
