//! Rules of the preamble, header encoding and metadata (section 9).

#![allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unwrap_used
)]

use super::*;

#[test]
fn rule_truncated() {
    let g = golden();
    assert!(matches!(err(&g[..50]), Error::Truncated { needed: 72, .. }));
    assert_eq!(
        parse_prefix(&g[..50]).unwrap(),
        Prefix::NeedBytes { total: 72 }
    );
    let Prefix::NeedBytes { total } = parse_prefix(&g[..72]).unwrap() else {
        panic!("72 bytes are not the whole header");
    };
    assert!(matches!(
        parse_prefix(&g[..total as usize]).unwrap(),
        Prefix::Complete(_)
    ));
    // shorter than 72 + header_len: its own variant
    assert!(matches!(
        err(&g[..total as usize - 1]),
        Error::HeaderTruncated { header_end, available } if header_end == total && available == total - 1
    ));
    // the whole header but not the whole file: the message names the real length
    let e = err(&g[..total as usize]);
    assert!(matches!(e, Error::FileSize { file_len: 4120, actual } if actual == total));
    assert_eq!(
        e.to_string(),
        format!("the file is {total} bytes long, but its preamble declares file_len 4120")
    );
    assert!(matches!(
        err(&g[..g.len() - 1]),
        Error::FileSize {
            file_len: 4120,
            actual: 4119
        }
    ));
}

#[test]
fn rule_payload_digest() {
    let mut g = golden();
    let knot = Knot::parse(&g).unwrap();
    knot.check_payload(0).unwrap();
    knot.check_payload(1).unwrap(); // the alias reads its target
    g[4096] ^= 0x80;
    let knot = Knot::parse(&g).unwrap();
    let e = knot.check_payload(0).unwrap_err();
    assert!(
        matches!(&e, Error::PayloadDigest { block, offset: 4096, end: 4120, .. } if block == "embed.weight"),
        "{e}"
    );
}

#[test]
fn rule_row_file_checks() {
    let (h, _) = golden_parts();
    let d = &h.blocks[0].columnar[0];
    check_row_file_len(d, 24).unwrap();
    let e = check_row_file_len(d, 12).unwrap_err();
    assert!(matches!(
        e,
        Error::RowFileLength {
            expected: 24,
            found: 12,
            rows: 2,
            row_bytes: 12,
            ..
        }
    ));
    assert!(e.to_string().ends_with("truncated"), "{e}");
    check_row_file_digest(d, [0; 32]).unwrap();
    assert!(matches!(
        check_row_file_digest(d, [1; 32]),
        Err(Error::RowFileDigest { .. })
    ));
}

#[test]
fn rule_same_dtype_row_file_digest_is_the_payload_digest() {
    let (mut h, _) = golden_parts();
    h.blocks[0].columnar[0].sha256 = [7; 32];
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::DescriptorField {
            field: "sha256",
            ..
        }
    ));
    // a descriptor in another dtype has its own digest
    let (mut h, _) = golden_parts();
    h.blocks[0].columnar[0] =
        ColumnarDescriptor::for_shape(2, 3, DType::BF16, "token_embd.bf16.rows".into()).unwrap();
    h.blocks[0].columnar[0].sha256 = [7; 32];
    Knot::parse(&raw_knot(&laid_out(h))).unwrap();
}

#[test]
fn rule_package_files() {
    let hash = "ab".repeat(32);
    let with = |files: &[&str], hashes: &[&str]| {
        let (mut h, _) = golden_parts();
        h.metadata.insert(
            keys::PACKAGE_FILES.into(),
            Value::StrList(files.iter().map(|s| (*s).to_owned()).collect()),
        );
        h.metadata.insert(
            keys::PACKAGE_SHA256.into(),
            Value::StrList(hashes.iter().map(|s| (*s).to_owned()).collect()),
        );
        raw_knot(&laid_out(h))
    };
    Knot::parse(&with(&["config.json", "tokenizer.json"], &[&hash, &hash])).unwrap();
    assert!(matches!(
        err(&with(&["config.json"], &[])),
        Error::PackageListMismatch {
            files: 1,
            hashes: 0
        }
    ));
    assert!(matches!(
        err(&with(&["tokenizer.json", "config.json"], &[&hash, &hash])),
        Error::BadPackageFile { reason, .. } if reason.contains("ascending")
    ));
    assert!(matches!(
        err(&with(&["../config.json"], &[&hash])),
        Error::BadPackageFile { .. }
    ));
    assert!(matches!(
        err(&with(&["token_embd.f32.rows"], &[&hash])),
        Error::BadPackageFile { reason, .. } if reason.contains("row file")
    ));
    assert!(matches!(
        err(&with(&["config.json"], &["AB"])),
        Error::BadPackageFile { reason, .. } if reason.contains("hex")
    ));
    let (mut h, _) = golden_parts();
    h.metadata
        .insert(keys::PACKAGE_FILES.into(), Value::StrList(vec![]));
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::ListIncomplete {
            present: "package.files",
            missing: "package.sha256"
        }
    ));
}

#[test]
fn rule_zero_element_shapes_do_not_overflow() {
    let mut h = Header::default();
    h.blocks
        .push(Block::dense("empty", DType::F32, vec![1 << 62, 0]).expect("0 elements"));
    h.blocks
        .push(Block::dense("empty2", DType::F64, vec![0, u64::MAX, u64::MAX]).expect("0 elements"));
    let g = write_knot(h, &[vec![], vec![]]).unwrap();
    let knot = Knot::parse(&g).unwrap();
    assert_eq!(knot.blocks()[0].elements(), Some(0));
    assert_eq!(knot.payload(0), Some(&[][..]));
    // non-zero shapes still overflow
    assert!(Block::dense("big", DType::F32, vec![1 << 62, 1]).is_none());
}

#[test]
fn rule_columnar_blocks_need_rows_and_columns() {
    for shape in [[2u64, 0], [0, 3]] {
        let (mut h, _) = golden_parts();
        h.blocks[0] = Block {
            shape: shape.to_vec(),
            encoding: Encoding::Dense(Payload {
                offset: 0,
                len: 0,
                sha256: [0; 32],
            }),
            ..h.blocks[0].clone()
        };
        h.blocks[0].columnar[0] = ColumnarDescriptor::for_shape(
            shape[0],
            shape[1],
            DType::F32,
            "token_embd.f32.rows".into(),
        )
        .unwrap();
        h.blocks[1].shape = shape.to_vec();
        assert!(
            matches!(
                err(&raw_knot(&laid_out(h))),
                Error::DescriptorPlacement { .. }
            ),
            "{shape:?}"
        );
    }
}

#[test]
fn rule_magic_and_version() {
    let mut g = golden();
    g[0] = b'X';
    assert!(matches!(err(&g), Error::BadMagic { .. }));
    let mut gguf = g.clone();
    gguf[..8].copy_from_slice(b"GGUF\x03\0\0\0");
    let m = err(&gguf).to_string();
    assert!(
        m.contains("it is a GGUF file") && m.contains("gkq-pack MODEL.gguf"),
        "{m}"
    );
    for v in [1u8, 6] {
        let mut g = golden();
        g[8] = v;
        let e = err(&g);
        assert!(matches!(e, Error::UnsupportedVersion { found } if found == u32::from(v)));
        assert!(e.to_string().contains("reads versions 2 to 5"), "{e}");
    }
}

/// The golden knot as a version 2 writer wrote it: descriptors without the
/// 34 bytes of flags, proof_height and merkle_root (section 9a).
fn golden_v2() -> Vec<u8> {
    let g = golden();
    let pre = crate::parse::parse_preamble(&g).unwrap();
    let mut head = g[72..72 + pre.header_len as usize].to_vec();
    let object = b"token_embd.f32.rows";
    let at = head
        .windows(object.len())
        .position(|w| w == object)
        .unwrap()
        + object.len();
    head.drain(at..at + 34);
    let mut out = g.clone();
    out[72..].fill(0);
    out[72 + 4096 - 72..].copy_from_slice(&g[4096..]);
    let v2 = Preamble {
        version: VERSION_2,
        header_len: head.len() as u64,
        ..pre
    };
    reseal(&mut out, &v2, &head);
    out
}

#[test]
fn version_2_knots_still_parse_without_proofs() {
    let v2 = golden_v2();
    let knot = Knot::parse(&v2).unwrap();
    assert_eq!(knot.header().preamble().version, 2);
    let d = &knot.blocks()[0].columnar[0];
    assert_eq!(d.proof, None, "a version 2 descriptor has no row proof");
    assert!(d.is_block_exact(), "same dtype as the block: the payload");
    assert!(!d.is_source_exact(), "unknown for a version 2 knot");
    assert_eq!(knot.verify_payload(0), Some(true));
    // the same bytes read as version 3 are rejected, not misread
    let mut as_v3 = v2.clone();
    as_v3[8] = 3;
    let pre = crate::parse::parse_preamble(&v2).unwrap();
    let head = v2[72..72 + pre.header_len as usize].to_vec();
    reseal(&mut as_v3, &Preamble { version: 3, ..pre }, &head);
    assert!(Knot::parse(&as_v3).is_err());
}

#[test]
fn rule_descriptor_version_3_fields() {
    // a row file of the block's dtype must claim BLOCK_EXACT
    let (mut h, _) = golden_parts();
    h.blocks[0].columnar[0].flags = SOURCE_EXACT;
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::DescriptorField { field: "flags", .. }
    ));
    let (mut h, _) = golden_parts();
    h.blocks[0].columnar[0].proof = Some(RowProof {
        height: crate::merkle::MAX_PROOF_HEIGHT + 1,
        root: [0; 32],
    });
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::DescriptorField {
            field: "proof_height",
            ..
        }
    ));
    // a package file may not take a proof object's name
    let (mut h, _) = golden_parts();
    h.metadata.insert(
        keys::PACKAGE_FILES.into(),
        Value::StrList(vec!["token_embd.f32.rows.proof".into()]),
    );
    h.metadata.insert(
        keys::PACKAGE_SHA256.into(),
        Value::StrList(vec!["0".repeat(64)]),
    );
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::BadPackageFile { .. }
    ));
}

#[test]
fn rule_header_too_large() {
    let mut g = golden();
    g[16..24].copy_from_slice(&(MAX_HEADER_LEN + 1).to_le_bytes());
    assert!(matches!(err(&g), Error::HeaderTooLarge { .. }));
    g[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(err(&g), Error::HeaderTooLarge { .. }));
}

#[test]
fn rule_data_offset() {
    let mut g = golden();
    g[24..32].copy_from_slice(&8192u64.to_le_bytes());
    assert!(matches!(
        err(&g),
        Error::BadDataOffset {
            expected: 4096,
            found: 8192
        }
    ));
}

#[test]
fn rule_header_checksum() {
    let mut g = golden();
    g[80] ^= 1;
    assert!(matches!(err(&g), Error::HeaderChecksum { .. }));
    let mut g = golden();
    g[32] ^= 1; // file_len is covered too
    assert!(matches!(err(&g), Error::HeaderChecksum { .. }));
}

#[test]
fn rule_header_eof_and_trailing() {
    let g = edit_header(&golden(), |h| {
        h.pop();
    });
    assert!(matches!(err(&g), Error::HeaderEof { .. }), "{:?}", err(&g));
    let g = edit_header(&empty_header_bytes(), |h| h.push(0));
    assert!(matches!(err(&g), Error::HeaderTrailingBytes { extra: 1 }));
    // a count that cannot fit in the remaining bytes is refused before allocating
    let g = edit_header(&empty_header_bytes(), |h| {
        h[4..8].copy_from_slice(&60_000u32.to_le_bytes())
    });
    assert!(matches!(
        err(&g),
        Error::HeaderEof {
            what: "block table",
            ..
        }
    ));
}

#[test]
fn rule_limits_utf8_empty() {
    let g = edit_header(&empty_header_bytes(), |h| {
        h[0..4].copy_from_slice(&u32::MAX.to_le_bytes())
    });
    assert!(matches!(
        err(&g),
        Error::LimitExceeded {
            what: "metadata entry count",
            ..
        }
    ));
    let g = edit_header(&empty_header_bytes(), |h| {
        h[4..8].copy_from_slice(&(MAX_BLOCKS + 1).to_le_bytes())
    });
    assert!(matches!(
        err(&g),
        Error::LimitExceeded {
            what: "block count",
            ..
        }
    ));
    // one metadata entry whose key is 0xff
    let entry = |key: &[u8], tag: u8, value: &[u8]| {
        let mut h = 1u32.to_le_bytes().to_vec();
        h.extend_from_slice(&(key.len() as u16).to_le_bytes());
        h.extend_from_slice(key);
        h.push(tag);
        h.extend_from_slice(value);
        h.extend_from_slice(&0u32.to_le_bytes());
        h
    };
    let g = edit_header(&empty_header_bytes(), |h| *h = entry(&[0xff], 1, &[0; 8]));
    assert!(matches!(
        err(&g),
        Error::InvalidUtf8 {
            what: "metadata key",
            ..
        }
    ));
    let g = edit_header(&empty_header_bytes(), |h| *h = entry(b"", 1, &[0; 8]));
    assert!(matches!(err(&g), Error::EmptyName { .. }));
    let long = vec![b'k'; MAX_KEY_LEN + 1];
    let g = edit_header(&empty_header_bytes(), |h| *h = entry(&long, 1, &[0; 8]));
    assert!(matches!(
        err(&g),
        Error::LimitExceeded {
            what: "metadata key",
            ..
        }
    ));
    let g = edit_header(&empty_header_bytes(), |h| *h = entry(b"k", 9, &[0; 8]));
    assert!(matches!(err(&g), Error::UnknownValueType { tag: 9, .. }));
    let g = edit_header(&empty_header_bytes(), |h| *h = entry(b"k", 2, &[2]));
    assert!(matches!(err(&g), Error::NonCanonicalBool { value: 2, .. }));
    let g = edit_header(&empty_header_bytes(), |h| {
        *h = entry(b"k", 3, &u32::MAX.to_le_bytes())
    });
    assert!(matches!(
        err(&g),
        Error::LimitExceeded {
            what: "STR value",
            ..
        }
    ));
    // ndim 9
    let (mut header, _) = golden_parts();
    header.blocks.truncate(1);
    header.metadata.clear();
    let g = raw_knot(&header);
    let ndim_at = 72 + 4 + 4 + 2 + "embed.weight".len() + 1 + 1 + 4;
    assert_eq!(g[ndim_at], 2);
    let g = edit_header(&g, |h| h[ndim_at - 72] = 9);
    assert!(matches!(err(&g), Error::LimitExceeded { what: "ndim", .. }));
}

#[test]
fn rule_metadata() {
    let two = |a: &[u8], b: &[u8]| {
        let mut h = 2u32.to_le_bytes().to_vec();
        for k in [a, b] {
            h.extend_from_slice(&(k.len() as u16).to_le_bytes());
            h.extend_from_slice(k);
            h.push(1);
            h.extend_from_slice(&[0; 8]);
        }
        h.extend_from_slice(&0u32.to_le_bytes());
        h
    };
    let g = edit_header(&empty_header_bytes(), |h| *h = two(b"b", b"a"));
    assert!(matches!(err(&g), Error::MetadataOrder { .. }));
    let g = edit_header(&empty_header_bytes(), |h| *h = two(b"a", b"a"));
    assert!(matches!(err(&g), Error::MetadataOrder { .. }));

    let (mut h, _) = golden_parts();
    h.metadata
        .insert(keys::VOCAB_SIZE.into(), Value::Str("2".into()));
    assert!(matches!(
        err(&raw_knot(&h)),
        Error::MetadataType {
            expected: "U64",
            ..
        }
    ));
    let (mut h, _) = golden_parts();
    h.metadata
        .insert(keys::SOURCE_FILES.into(), Value::StrList(vec!["a".into()]));
    h.metadata
        .insert(keys::SOURCE_SHA256.into(), Value::StrList(vec![]));
    assert!(matches!(
        err(&raw_knot(&h)),
        Error::SourceListMismatch {
            files: 1,
            hashes: 0
        }
    ));
    let (mut h, _) = golden_parts();
    h.metadata
        .insert(keys::ROLE_LM_HEAD.into(), Value::Str("nope".into()));
    assert!(matches!(err(&raw_knot(&h)), Error::UnknownRoleBlock { .. }));
    // any role.* key, not only the well-known ones
    let (mut h, _) = golden_parts();
    h.metadata
        .insert("role.foo".into(), Value::Str("nope".into()));
    assert!(
        matches!(err(&raw_knot(&laid_out(h))), Error::UnknownRoleBlock { ref role, .. } if role == "role.foo")
    );
    let (mut h, _) = golden_parts();
    h.metadata.insert("role.foo".into(), Value::U64(0));
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::MetadataType { ref key, expected: "STR", found: "U64" } if key == "role.foo"
    ));
    let (mut h, _) = golden_parts();
    h.metadata
        .insert("role.foo".into(), Value::Str("embed.weight".into()));
    Knot::parse(&raw_knot(&laid_out(h))).unwrap();
    // keys that only start like a role are not roles
    let (mut h, _) = golden_parts();
    h.metadata.insert("rolex".into(), Value::U64(0));
    Knot::parse(&raw_knot(&laid_out(h))).unwrap();
    // source.files without source.sha256, and the reverse
    let (mut h, _) = golden_parts();
    h.metadata
        .insert(keys::SOURCE_FILES.into(), Value::StrList(vec![]));
    let e = err(&raw_knot(&h));
    assert!(matches!(
        e,
        Error::ListIncomplete {
            present: "source.files",
            missing: "source.sha256"
        }
    ));
    let (mut h, _) = golden_parts();
    h.metadata
        .insert(keys::SOURCE_SHA256.into(), Value::StrList(vec![]));
    assert!(matches!(
        err(&raw_knot(&h)),
        Error::ListIncomplete {
            present: "source.sha256",
            ..
        }
    ));
}

#[test]
fn golden_parts_lay_out_validly() {
    let (h, _) = golden_parts();
    Knot::parse(&raw_knot(&laid_out(h))).unwrap();
}
