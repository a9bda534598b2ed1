//! One test per validation rule of docs/FORMAT.md section 9, the golden
//! vector, writer round trips and property tests.
#![allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unwrap_used
)]

use std::io::Cursor;

use proptest::prelude::*;

use crate::layout::*;
use crate::model::*;
use crate::testutil::*;
use crate::*;

fn write_knot(header: Header, payloads: &[Vec<u8>]) -> Result<Vec<u8>> {
    let mut w = KnotWriter::new(Cursor::new(Vec::new()), header)?;
    let indices: Vec<usize> = w
        .header()
        .blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| b.encoding.payload().is_some())
        .map(|(i, _)| i)
        .collect();
    for (i, p) in indices.into_iter().zip(payloads) {
        w.write_payload(i, p.as_slice())?;
    }
    Ok(w.finish()?.0.into_inner())
}

fn golden() -> Vec<u8> {
    let (header, payloads) = golden_parts();
    let mut w = KnotWriter::new(Cursor::new(Vec::new()), header).unwrap();
    w.write_payload(0, payloads[0].as_slice()).unwrap();
    // The row file of an f32 block in f32 is the payload itself.
    let sha: [u8; 32] = {
        use sha2::Digest;
        sha2::Sha256::digest(&payloads[0]).into()
    };
    w.set_columnar_sha256(0, DType::F32, sha).unwrap();
    w.finish().unwrap().0.into_inner()
}

/// `hexdump -C` output.
fn hexdump(bytes: &[u8]) -> String {
    let mut out = String::new();
    let mut prev: Option<&[u8]> = None;
    let mut starred = false;
    for (i, line) in bytes.chunks(16).enumerate() {
        if prev == Some(line) && line.len() == 16 {
            if !starred {
                out.push_str("*\n");
                starred = true;
            }
            continue;
        }
        starred = false;
        prev = Some(line);
        let mut hex = String::new();
        for (j, b) in line.iter().enumerate() {
            if j == 8 {
                hex.push(' ');
            }
            hex.push_str(&format!("{b:02x} "));
        }
        let ascii: String = line
            .iter()
            .map(|&b| {
                if (0x20..0x7f).contains(&b) {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!("{:08x}  {hex:<49} |{ascii}|\n", i * 16));
    }
    out.push_str(&format!("{:08x}\n", bytes.len()));
    out
}

/// Reads `hexdump -C` output back into bytes.
fn parse_hexdump(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut last: Vec<u8> = Vec::new();
    let mut star = false;
    for line in text.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
        if line == "*" {
            star = true;
            continue;
        }
        let (off, rest) = line.split_at(8.min(line.len()));
        let off = usize::from_str_radix(off, 16).expect("hexdump offset");
        if star {
            while out.len() < off {
                out.extend_from_slice(&last);
            }
            star = false;
        }
        assert_eq!(out.len(), off, "hexdump offsets are contiguous");
        let hex = rest.split('|').next().unwrap_or("");
        last = hex
            .split_whitespace()
            .map(|h| u8::from_str_radix(h, 16).expect("hex byte"))
            .collect();
        out.extend_from_slice(&last);
    }
    out
}

#[test]
fn golden_vector() {
    let bytes = golden();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = dir.join("tests/golden/tiny.knot");
    if std::env::var_os("GKQ_BLESS").is_some() {
        std::fs::write(&path, &bytes).unwrap();
        println!("{}", hexdump(&bytes));
    }
    let stored = std::fs::read(&path).expect("tests/golden/tiny.knot (GKQ_BLESS=1 writes it)");
    assert!(
        stored == bytes,
        "writer output differs from tests/golden/tiny.knot"
    );
    let doc = std::fs::read_to_string(dir.join("../../docs/FORMAT.md")).unwrap();
    let start = doc.find("GOLDEN-HEXDUMP-BEGIN\n").expect("begin marker") + 21;
    let end = doc.find("GOLDEN-HEXDUMP-END").expect("end marker");
    let from_doc = parse_hexdump(&doc[start..end]);
    assert!(
        from_doc == bytes,
        "docs/FORMAT.md dump differs from the writer's output"
    );
    assert_eq!(&doc[start..end], hexdump(&bytes), "dump formatting");
    let knot = Knot::parse(&stored).unwrap();
    assert_eq!(knot.verify_payload(0), Some(true));
    assert_eq!(knot.verify_payload(1), Some(true), "alias reads its target");
    assert_eq!(knot.payload(1), knot.payload(0));
}

fn err(bytes: &[u8]) -> Error {
    Knot::parse(bytes).expect_err("knot must be rejected")
}

/// Re-encodes the header region of `bytes` after `edit` and fixes the checksum.
fn edit_header(bytes: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let pre = crate::parse::parse_preamble(bytes).unwrap();
    let mut head = bytes[72..72 + pre.header_len as usize].to_vec();
    edit(&mut head);
    let header_len = head.len() as u64;
    let data_offset = align_up(72 + header_len).unwrap();
    let mut out = vec![0u8; data_offset as usize];
    let new_pre = Preamble {
        version: VERSION,
        header_len,
        data_offset,
        file_len: data_offset,
        header_sha256: [0; 32],
    };
    reseal(&mut out, &new_pre, &head);
    out
}

fn empty_header_bytes() -> Vec<u8> {
    raw_knot(&Header::default())
}

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
    for v in [1u8, 4] {
        let mut g = golden();
        g[8] = v;
        assert!(matches!(err(&g), Error::UnsupportedVersion { found } if found == u32::from(v)));
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

fn laid_out(mut h: Header) -> Header {
    let head_len = crate::write::encode_header(&h).unwrap().len() as u64;
    let mut cursor = align_up(72 + head_len).unwrap();
    for b in &mut h.blocks {
        if let Some(p) = b.encoding.payload_mut() {
            p.offset = align_up(cursor).unwrap();
            cursor = p.offset + p.len;
        }
    }
    h
}

#[test]
fn golden_parts_lay_out_validly() {
    let (h, _) = golden_parts();
    Knot::parse(&raw_knot(&laid_out(h))).unwrap();
}

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

fn spectral_block(rank: u32, factor: DType, quant: Quant) -> Block {
    let (m, n, k) = (3u64, 4u64, u64::from(rank));
    let len = match quant {
        Quant::None => (m * k + k * n) * factor.itemsize() + 4 * k,
        Quant::U8Affine => m * k + 8 * m + 4 * k + k * n + 8 * k,
    };
    Block {
        name: "attn.q".into(),
        dtype: DType::F32,
        flags: 0,
        shape: vec![m, n],
        encoding: Encoding::Spectral {
            rank,
            factor_dtype: factor,
            quant,
            payload: Payload {
                offset: 0,
                len,
                sha256: [0; 32],
            },
        },
        columnar: vec![],
    }
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

fn arb_block(i: usize) -> impl Strategy<Value = (Block, Vec<u8>)> {
    let dtypes = proptest::sample::select(DType::ALL.to_vec());
    (
        dtypes,
        proptest::collection::vec(0u64..5, 0..4),
        any::<u32>(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(move |(dtype, shape, flags, columnar, seed)| {
            let mut b = Block::dense(format!("blk{i}.weight"), dtype, shape.clone()).unwrap();
            b.flags = flags & !COLUMNAR_ELIGIBLE;
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
fn default_proof_height_keeps_records_within_twelve_percent() {
    // Qwen2.5-0.5B: 151,936 rows of 896 values
    assert_eq!(merkle::default_proof_height(151_936, 1792), 6); // bf16: 192 B per row, 10.7 %
    assert_eq!(merkle::default_proof_height(151_936, 3584), 13); // f32: 416 B, 11.6 %
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
