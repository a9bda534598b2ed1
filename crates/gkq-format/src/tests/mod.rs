//! One test per validation rule of docs/FORMAT.md section 9, the golden
//! vector, writer round trips and property tests.
#![allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unwrap_used
)]

use std::io::Cursor;

use crate::layout::*;
use crate::model::*;
use crate::testutil::*;
use crate::*;

mod blocks;
mod decisions;
mod header;
mod one_copy;
mod proofs;
mod props;
mod quant;
mod round4;
mod spectral;
mod warm;

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
