//! Version 5 (docs/FORMAT.md 7e): a block stored once, in its row file,
//! with each row's proof record inline; the golden vector of 7e, and one
//! test per rule it adds.

#![allow(clippy::indexing_slicing, clippy::unwrap_used)]

use sha2::Digest;

use super::*;
use crate::merkle::{build_proof, leaf_hash};
use crate::runs::{RunsLayout, write_runs};

/// Section 10's knot with block 0 stored once (7e's golden vector): the
/// knot, its row file and its proof object (the chunk table alone).
fn one_copy() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let (mut header, payloads) = golden_parts();
    let payload = &payloads[0];
    let leaves: Vec<_> = payload.chunks(12).map(leaf_hash).collect();
    let (root, proof) = build_proof(&leaves, 1).unwrap();
    let embed = &mut header.blocks[0];
    embed.flags |= IN_ROW_FILE;
    let d = &mut embed.columnar[0];
    d.flags = SOURCE_EXACT | BLOCK_EXACT | INLINE_PROOF;
    d.proof = Some(RowProof { height: 1, root });
    d.byte_len = 2 * (12 + 32);
    let layout = RunsLayout::of(d).unwrap();
    let mut file = Vec::new();
    write_runs(
        &layout,
        &mut payload.as_slice(),
        &mut &proof[32..],
        &mut file,
    )
    .unwrap();
    let mut w = KnotWriter::new(Cursor::new(Vec::new()), header).unwrap();
    w.write_payload(0, payload.as_slice()).unwrap();
    let sha: [u8; 32] = sha2::Sha256::digest(&file).into();
    w.set_columnar_sha256(0, DType::F32, sha).unwrap();
    let knot = w.finish().unwrap().0.into_inner();
    (knot, file, proof[..32].to_vec())
}

/// The `key hex` lines between 7e's markers, a key's lines joined.
fn golden_lines() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(dir.join("../../docs/FORMAT.md")).unwrap();
    let start = doc.find("GOLDEN-V5-BEGIN\n").expect("begin marker") + 16;
    let end = doc.find("GOLDEN-V5-END").expect("end marker");
    let mut out: Vec<(String, String)> = Vec::new();
    for line in doc[start..end].lines() {
        let (key, value) = line.split_once(' ').expect("key value");
        match out.last_mut() {
            Some((k, v)) if k == key => v.push_str(value),
            _ => out.push((key.to_owned(), value.to_owned())),
        }
    }
    out
}

#[test]
fn golden_vector_v5() {
    let (knot, file, table) = one_copy();
    let k = Knot::parse(&knot).unwrap();
    let derived = vec![
        ("knot_len", knot.len().to_string()),
        ("knot_id", k.header().id().to_string()),
        ("knot_sha256", hex(&sha2::Sha256::digest(&knot))),
        ("row_file", hex(&file[..44])),
        ("row_file", hex(&file[44..])),
        ("row_file_sha256", hex(&sha2::Sha256::digest(&file))),
        ("proof_object", hex(&table)),
    ];
    let mut joined: Vec<(String, String)> = Vec::new();
    for (key, value) in &derived {
        match joined.last_mut() {
            Some((k, v)) if k == key => v.push_str(value),
            _ => joined.push(((*key).to_owned(), value.clone())),
        }
    }
    if std::env::var_os("GKQ_BLESS").is_some() {
        for (key, value) in &derived {
            println!("{key} {value}");
        }
    }
    assert_eq!(golden_lines(), joined, "docs/FORMAT.md 7e's golden vector");
    assert_eq!(k.header().preamble().version, VERSION_5);
    assert_eq!(knot.len(), 4096, "header and padding alone");
}

#[test]
fn a_block_in_its_row_file_reads_from_there_alone() {
    let (knot, file, _) = one_copy();
    let (_, payloads) = golden_parts();
    let k = Knot::parse(&knot).unwrap();
    let h = k.header();
    assert_eq!(h.payload_of(0), None, "not in the knot");
    assert_eq!(k.payload(0), None);
    assert_eq!(h.payload_of(1), None, "the alias follows its target");
    let (p, home) = h.home_of(1).unwrap();
    assert_eq!((p.offset, p.len), (0, 24));
    assert!(home.inline_proof());
    assert_eq!(home.stride(), 44);
    let rows = into_rows(file.clone(), home.row_bytes, home.stride());
    assert_eq!(rows, payloads[0]);
    let sha: [u8; 32] = sha2::Sha256::digest(&rows).into();
    assert_eq!(sha, p.sha256, "the payload's digest is over the rows");
    assert_eq!(home.sha256, <[u8; 32]>::from(sha2::Sha256::digest(&file)));
}

/// The rows taken piece by piece as a file is read are the rows of the
/// whole file, whatever the pieces (a row or a record cut between two, a
/// piece of one byte, the file at once), and a trailing part of a row is
/// dropped as [`into_rows`] drops it.
#[test]
fn rows_taken_piece_by_piece_are_the_files_rows() {
    let (_, file, _) = one_copy();
    let k = one_copy().0;
    let k = Knot::parse(&k).unwrap();
    let (_, home) = k.header().home_of(1).unwrap();
    let want = into_rows(file.clone(), home.row_bytes, home.stride());
    let mut longer = file.clone();
    longer.extend_from_slice(&[7; 30]);
    for f in [&file, &longer] {
        for piece in [1, 3, 19, 24, 44, 45, 88, f.len()] {
            let mut r = crate::RowsOf::new(f.len() as u64, home.row_bytes, home.stride());
            for p in f.chunks(piece) {
                r.push(p);
            }
            assert_eq!(
                r.finish(),
                want,
                "pieces of {piece} bytes, a file of {}",
                f.len()
            );
        }
    }
    let mut plain = crate::RowsOf::new(10, 5, 5);
    plain.push(b"abcdefghij");
    assert_eq!(plain.finish(), b"abcdefghij", "a file of rows alone");
}

/// The version field of `bytes` set to `version`, resealed.
fn with_version(bytes: &[u8], version: u32) -> Vec<u8> {
    let mut pre = crate::parse::parse_preamble(bytes).unwrap();
    pre.version = version;
    let mut out = bytes.to_vec();
    let head = bytes[72..72 + pre.header_len as usize].to_vec();
    reseal(&mut out, &pre, &head);
    out
}

/// The golden v5 header with `edit` applied, as a version 5 knot.
fn v5_with(edit: impl FnOnce(&mut Header)) -> Vec<u8> {
    let (knot, _, _) = one_copy();
    let mut h = Knot::parse(&knot).unwrap().header().header().clone();
    edit(&mut h);
    with_version(&raw_knot(&h), VERSION_5)
}

#[test]
fn in_row_file_needs_a_row_file_of_the_blocks_dtype() {
    let e = err(&v5_with(|h| {
        let d = &mut h.blocks[0].columnar[0];
        d.dtype = DType::BF16;
        d.row_bytes = 6;
        d.flags = SOURCE_EXACT | INLINE_PROOF;
        d.byte_len = 2 * (6 + 32);
    }));
    assert!(
        matches!(&e, Error::DescriptorPlacement { reason, .. } if reason.contains("IN_ROW_FILE")),
        "{e}"
    );
}

#[test]
fn in_row_file_payload_has_offset_zero() {
    let e = err(&v5_with(|h| {
        if let Encoding::Dense(p) = &mut h.blocks[0].encoding {
            p.offset = 4096;
        }
    }));
    assert!(
        matches!(
            e,
            Error::PayloadOffset {
                expected: 0,
                found: 4096,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn inline_proof_needs_a_height_and_its_records_in_byte_len() {
    let e = err(&v5_with(|h| {
        let d = &mut h.blocks[0].columnar[0];
        d.proof = Some(RowProof {
            height: 0,
            ..d.proof.unwrap()
        });
    }));
    assert!(
        matches!(
            &e,
            Error::DescriptorField {
                field: "proof_height",
                ..
            }
        ),
        "{e}"
    );
    let e = err(&v5_with(|h| h.blocks[0].columnar[0].byte_len = 24));
    assert!(
        matches!(&e, Error::DescriptorField { field: "byte_len", expected, .. } if expected == "88"),
        "{e}"
    );
}

#[test]
fn an_inline_row_file_is_its_own_runs_object() {
    let e = err(&v5_with(|h| {
        let list = vec!["token_embd.f32.rows".to_owned()];
        h.metadata
            .insert(keys::COLUMNAR_RUNS.into(), Value::StrList(list));
    }));
    assert!(
        matches!(&e, Error::RunsMetadata(r) if r.contains("INLINE_PROOF")),
        "{e}"
    );
}

/// 9a: in versions 2 to 4 the two bits are reserved and ignored: a
/// version 3 knot with them set reads its payload from the knot.
#[test]
fn the_bits_are_reserved_before_version_5() {
    let (header, payloads) = golden_parts();
    let mut h = header;
    h.blocks[0].flags |= IN_ROW_FILE;
    h.blocks[0].columnar[0].flags |= INLINE_PROOF;
    let mut h = laid_out(h);
    let sha: [u8; 32] = sha2::Sha256::digest(&payloads[0]).into();
    if let Encoding::Dense(p) = &mut h.blocks[0].encoding {
        p.sha256 = sha;
    }
    h.blocks[0].columnar[0].sha256 = sha;
    let mut bytes = raw_knot(&h);
    bytes[4096..4096 + 24].copy_from_slice(&payloads[0]);
    let k = Knot::parse(&bytes).unwrap();
    assert_eq!(k.header().preamble().version, VERSION);
    assert_eq!(k.payload(0), Some(payloads[0].as_slice()));
    assert_eq!(k.header().home_of(0), None);
    assert!(!k.blocks()[0].columnar[0].inline_proof(), "cleared as read");
    assert!(!k.blocks()[0].in_row_file());
    assert_eq!(k.verify_payload(0), Some(true));
}

#[test]
fn a_spectral_block_is_never_in_a_row_file() {
    let mut h = Header::default();
    let mut b = spectral_block(2, DType::F32, Quant::None);
    b.flags = IN_ROW_FILE;
    h.blocks.push(b);
    let e = err(&with_version(&raw_knot(&laid_out(h)), VERSION_5));
    assert!(
        matches!(&e, Error::DescriptorPlacement { reason, .. } if reason.contains("IN_ROW_FILE")),
        "{e}"
    );
}
