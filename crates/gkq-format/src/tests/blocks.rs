//! Rules of blocks, payloads, aliases, spectral blocks and descriptors.

#![allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unwrap_used
)]

use super::*;

#[test]
fn rule_blocks() {
    let (mut h, _) = golden_parts();
    h.blocks[1].name = "embed.weight".into();
    h.metadata.remove(keys::ROLE_LM_HEAD);
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::DuplicateBlockName { .. }
    ));

    let (h, _) = golden_parts();
    let g = raw_knot(&laid_out(h));
    let needle = b"\x0c\x00embed.weight";
    let enc_at = g.windows(needle.len()).position(|w| w == needle).unwrap() + needle.len();
    assert_eq!(&g[enc_at - 12..enc_at], b"embed.weight");
    let bad_enc = edit_header(&g, |x| x[enc_at - 72] = 7);
    assert!(matches!(
        err(&bad_enc),
        Error::UnknownEncoding { tag: 7, .. }
    ));
    let bad_dtype = edit_header(&g, |x| x[enc_at + 1 - 72] = 99);
    assert!(matches!(
        err(&bad_dtype),
        Error::UnknownDtype { code: 99, .. }
    ));

    let (mut h, _) = golden_parts();
    h.blocks[0].shape = vec![u64::MAX, 3];
    h.blocks[1].shape = vec![u64::MAX, 3];
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::ShapeOverflow { .. }
    ));
}

#[test]
fn rule_payload_layout() {
    let (mut h, _) = golden_parts();
    if let Encoding::Dense(p) = &mut h.blocks[0].encoding {
        p.len = 20;
    }
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::PayloadLength {
            expected: 24,
            found: 20,
            ..
        }
    ));

    // overlapping payloads: a second block placed on top of the first
    let (mut h, _) = golden_parts();
    let mut other = Block::dense("other", DType::F32, vec![6]).unwrap();
    other.flags = 0;
    h.blocks.push(other);
    let mut h = laid_out(h);
    let first = h.blocks[0].encoding.payload().unwrap().offset;
    h.blocks[2].encoding.payload_mut().unwrap().offset = first;
    assert!(matches!(err(&raw_knot(&h)), Error::PayloadOffset { .. }));
    // a hole: one page further than canonical
    h.blocks[2].encoding.payload_mut().unwrap().offset = first + 8192;
    assert!(matches!(err(&raw_knot(&h)), Error::PayloadOffset { .. }));
    // offset past the end of the file
    let mut g = golden();
    let pre = crate::parse::parse_preamble(&g).unwrap();
    let head = g[72..72 + pre.header_len as usize].to_vec();
    let short = Preamble {
        file_len: pre.file_len - 4,
        ..pre
    };
    reseal(&mut g, &short, &head);
    assert!(matches!(
        err(&g),
        Error::FileLength {
            expected: 4120,
            found: 4116
        }
    ));
}

#[test]
fn rule_non_zero_padding() {
    let mut g = golden();
    g[4000] = 1;
    assert!(matches!(err(&g), Error::NonZeroPadding { offset: 4000 }));
}

#[test]
fn rule_alias() {
    let (mut h, _) = golden_parts();
    h.blocks[1].encoding = Encoding::Alias { target: 5 };
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::BadAlias { .. }
    ));
    let (mut h, _) = golden_parts();
    h.blocks[1].encoding = Encoding::Alias { target: 1 };
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::BadAlias { .. }
    ));
    let (mut h, _) = golden_parts();
    h.blocks[1].dtype = DType::F16;
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::BadAlias { .. }
    ));
    let (mut h, _) = golden_parts();
    h.blocks[1].flags = 0;
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::BadAlias { .. }
    ));
}

#[test]
fn rule_spectral() {
    for (block, ok) in [
        (spectral_block(2, DType::F32, Quant::None), true),
        (spectral_block(2, DType::U8, Quant::U8Affine), true),
        (spectral_block(0, DType::F32, Quant::None), false),
        (spectral_block(MAX_RANK + 1, DType::F32, Quant::None), false),
        (spectral_block(2, DType::U8, Quant::None), false),
        (spectral_block(2, DType::F16, Quant::U8Affine), false),
    ] {
        let h = laid_out(Header {
            metadata: Metadata::new(),
            blocks: vec![block],
        });
        let bytes = raw_knot(&h);
        let r = Knot::parse(&bytes);
        assert_eq!(r.is_ok(), ok, "{r:?}");
        if !ok {
            assert!(matches!(r, Err(Error::BadSpectral { .. })));
        }
    }
    let mut b = spectral_block(2, DType::F32, Quant::None);
    b.encoding.payload_mut().unwrap().len += 4;
    let h = laid_out(Header {
        metadata: Metadata::new(),
        blocks: vec![b],
    });
    assert!(matches!(err(&raw_knot(&h)), Error::PayloadLength { .. }));
}

#[test]
fn rule_descriptors() {
    let (mut h, _) = golden_parts();
    h.blocks[0].columnar.clear();
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::DescriptorPlacement { .. }
    ));
    let (mut h, _) = golden_parts();
    h.blocks[0].flags = 0;
    h.blocks[1].flags = 0;
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::DescriptorPlacement { .. }
    ));
    let (mut h, _) = golden_parts();
    h.blocks[0].columnar[0].row_bytes = 8;
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::DescriptorField {
            field: "row_bytes",
            ..
        }
    ));
    let (mut h, _) = golden_parts();
    h.blocks[0].columnar[0].rows = 3;
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::DescriptorField { field: "rows", .. }
    ));
    let (mut h, _) = golden_parts();
    h.blocks[0].columnar[0].byte_len = 25;
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::DescriptorField {
            field: "byte_len",
            ..
        }
    ));
    let (mut h, _) = golden_parts();
    let dup = h.blocks[0].columnar[0].clone();
    h.blocks[0].columnar.push(ColumnarDescriptor {
        object: "other.rows".into(),
        ..dup
    });
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::DescriptorField { field: "dtype", .. }
    ));
    for name in ["../etc/passwd", ".hidden", "a/b", ""] {
        let (mut h, _) = golden_parts();
        h.blocks[0].columnar[0].object = name.into();
        assert!(
            matches!(err(&raw_knot(&laid_out(h))), Error::BadObjectName { .. }),
            "{name}"
        );
    }
}

#[test]
fn unknown_flag_bits_and_reserved_are_ignored() {
    let (mut h, payloads) = golden_parts();
    h.blocks[0].flags |= 0x8000_0020;
    h.blocks[1].flags |= 0x10;
    let mut g = write_knot(h, &payloads).unwrap();
    let knot = Knot::parse(&g).unwrap();
    assert!(knot.blocks()[0].is_columnar_eligible());
    assert_eq!(knot.blocks()[0].flags, 0x8000_0021);
    // reserved preamble field: not checksummed-trusted, ignored
    let pre = crate::parse::parse_preamble(&g).unwrap();
    let head = g[72..72 + pre.header_len as usize].to_vec();
    g[12] = 0xAA;
    let mut p = crate::write::encode_preamble(&pre);
    p[12] = 0xAA;
    let digest = crate::parse::header_digest(&p, &head);
    g[40..72].copy_from_slice(&digest);
    Knot::parse(&g).unwrap();
}

#[test]
fn writer_checks_lengths_and_order() {
    let (mut h, _) = golden_parts();
    h.blocks
        .push(Block::dense("b2", DType::U8, vec![3]).unwrap());
    let mut w = KnotWriter::new(Cursor::new(Vec::new()), h.clone()).unwrap();
    assert!(
        matches!(w.write_chunk(2, &[1, 2, 3]), Err(Error::Writer(_))),
        "out of order"
    );
    assert!(
        matches!(w.write_payload(0, &[0u8; 25][..]), Err(Error::Writer(_))),
        "too long"
    );
    let mut w = KnotWriter::new(Cursor::new(Vec::new()), h.clone()).unwrap();
    assert!(
        matches!(w.write_payload(0, &[0u8; 23][..]), Err(Error::Writer(_))),
        "too short"
    );
    let mut w = KnotWriter::new(Cursor::new(Vec::new()), h).unwrap();
    w.write_payload(0, &[0u8; 24][..]).unwrap();
    assert!(
        matches!(w.finish(), Err(Error::Writer(_))),
        "missing payload"
    );
}
