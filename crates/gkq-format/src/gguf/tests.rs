//! A GGUF written here is read back; every hostile header of issue 30 is
//! refused with the key or tensor named, without allocating from a count.

#![allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::arithmetic_side_effects
)]

use super::*;
use crate::error::Error;

fn kv() -> Vec<(String, GgufValue)> {
    vec![
        (
            "general.architecture".into(),
            GgufValue::Str("llama".into()),
        ),
        ("llama.block_count".into(), GgufValue::U32(2)),
        (
            "tokenizer.ggml.tokens".into(),
            GgufValue::Array(GgufArray::Str(["a", "b"].into_iter().collect())),
        ),
        ("general.alignment".into(), GgufValue::U32(64)),
        ("x.f".into(), GgufValue::F32(0.5)),
        ("x.b".into(), GgufValue::Bool(true)),
    ]
}

/// A GGUF of two tensors (an f32 [2, 3] and a q8_0 [1, 32]) and `kv`.
fn file(kv: &[(String, GgufValue)]) -> Vec<u8> {
    let a = GgufTensorOut {
        name: "a.weight",
        shape: &[2, 3],
        dtype: DType::F32,
        len: 24,
    };
    let b = GgufTensorOut {
        name: "b.weight",
        shape: &[1, 32],
        dtype: DType::Q8_0,
        len: 34,
    };
    let align = kv
        .iter()
        .find(|(k, _)| k == "general.alignment")
        .and_then(|(_, v)| v.as_u64())
        .unwrap_or(32);
    let mut out = write_gguf(3, (kv.len() as u64, &encode_kv(kv)), &[a, b], align).unwrap();
    out.extend((0..24u8).collect::<Vec<_>>());
    out.resize(out.len() + padding(24, align), 0);
    out.extend([7u8; 34]);
    out.resize(out.len() + padding(34, align), 0);
    out
}

#[test]
fn a_written_gguf_reads_back() {
    let bytes = file(&kv());
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.kv, kv());
    assert_eq!(g.alignment, 64);
    assert_eq!(g.architecture(), Some("llama"));
    let a = g.tensor("a.weight").unwrap();
    assert_eq!(
        (a.shape.clone(), a.dtype, a.len),
        (vec![2, 3], DType::F32, 24)
    );
    assert_eq!(a.offset, g.data_offset);
    assert_eq!(
        &bytes[a.offset as usize..][..24],
        &(0..24u8).collect::<Vec<_>>()[..]
    );
    let b = g.tensor("b.weight").unwrap();
    assert_eq!(b.offset, g.data_offset + 64);
    assert_eq!(b.ggml_type, 8);
    // the key/value bytes are the encoding, verbatim
    let (s, e) = g.kv_bytes;
    assert_eq!(&bytes[s as usize..e as usize], &encode_kv(&kv())[..]);
}

fn parse_err(bytes: &[u8]) -> Error {
    Gguf::parse(bytes).expect_err("refused")
}

/// Offset of the first tensor info of `file(kv())` (after the key/values).
fn infos_at() -> usize {
    let g = Gguf::parse(&file(&kv())).unwrap();
    g.kv_bytes.1 as usize
}

#[test]
fn hostile_headers_are_refused_by_name() {
    let good = file(&kv());
    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(parse_err(&bad).to_string().contains("bad magic"));
    for v in [1u32, 4] {
        let mut bad = good.clone();
        bad[4..8].copy_from_slice(&v.to_le_bytes());
        assert!(
            parse_err(&bad)
                .to_string()
                .contains(&format!("unsupported GGUF version {v}"))
        );
    }
    // truncated in the header
    assert!(parse_err(&good[..12]).to_string().contains("truncated"));
    assert!(
        parse_err(&good[..infos_at() + 5])
            .to_string()
            .contains("truncated")
    );
    // absurd counts: refused before anything is allocated for them
    for at in [8, 16] {
        let mut bad = good.clone();
        bad[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = parse_err(&bad).to_string();
        assert!(e.contains("cannot fit"), "{e}");
    }
    // a string length past the end
    let mut bad = good.clone();
    bad[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(parse_err(&bad).to_string().contains("past the end"));
    // an array count past the end
    let mut kv2 = kv();
    kv2.truncate(3);
    let mut b2 = file(&kv2);
    let g = Gguf::parse(&b2).unwrap();
    let count_at = g.kv_bytes.1 as usize - (8 + 1) * 2 - 8;
    b2[count_at..count_at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let e = parse_err(&b2);
    assert!(
        matches!(&e, Error::GgufKey { key, .. } if key == "tokenizer.ggml.tokens"),
        "{e}"
    );
}

#[test]
fn hostile_keys_are_refused_by_name() {
    let mut twice = kv();
    twice.push(("llama.block_count".into(), GgufValue::U32(3)));
    let e = parse_err(&file(&twice));
    assert!(
        matches!(&e, Error::GgufKey { key, reason } if key == "llama.block_count" && reason.contains("twice")),
        "{e}"
    );
    let mut align = kv();
    align[3].1 = GgufValue::U32(48);
    let e = parse_err(&file(&align)).to_string();
    assert!(
        e.contains("general.alignment") && e.contains("power of two"),
        "{e}"
    );
    // an unknown value type
    let mut bytes = file(&kv());
    let g = Gguf::parse(&bytes).unwrap();
    let key_len = "general.architecture".len();
    let t_at = g.kv_bytes.0 as usize + 8 + key_len;
    bytes[t_at..t_at + 4].copy_from_slice(&77u32.to_le_bytes());
    let e = parse_err(&bytes).to_string();
    assert!(
        e.contains("general.architecture") && e.contains("unknown value type 77"),
        "{e}"
    );
}

/// `file(kv())` with tensor `a.weight`'s info edited: `at` is relative to
/// the start of that info (8 + 8 name bytes, then n_dims, dims, type, offset).
fn edit_info(edit: impl FnOnce(&mut Vec<u8>, usize)) -> Vec<u8> {
    let mut bytes = file(&kv());
    let at = infos_at();
    edit(&mut bytes, at);
    bytes
}

#[test]
fn hostile_tensor_infos_are_refused_by_name() {
    // a's info: name (8 + 8), n_dims at 16, dims at 20 and 28, type at 36, offset at 40
    let named = |e: Error, what: &str| {
        assert!(
            matches!(&e, Error::GgufTensor { tensor, reason } if tensor == "a.weight" && reason.contains(what)),
            "{what}: {e}"
        );
    };
    named(
        parse_err(&edit_info(|b, at| {
            b[at + 36..at + 40].copy_from_slice(&10u32.to_le_bytes())
        })),
        "Q2_K is not a type a knot holds",
    );
    named(
        parse_err(&edit_info(|b, at| {
            b[at + 36..at + 40].copy_from_slice(&99u32.to_le_bytes())
        })),
        "type 99",
    );
    named(
        parse_err(&edit_info(|b, at| {
            b[at + 40..at + 48].copy_from_slice(&3u64.to_le_bytes())
        })),
        "not a multiple of the alignment",
    );
    named(
        parse_err(&edit_info(|b, at| {
            b[at + 40..at + 48].copy_from_slice(&(1u64 << 30).to_le_bytes())
        })),
        "past the end",
    );
    named(
        parse_err(&edit_info(|b, at| {
            b[at + 16..at + 20].copy_from_slice(&9u32.to_le_bytes())
        })),
        "9 dimensions",
    );
    // dims whose product overflows
    named(
        parse_err(&edit_info(|b, at| {
            b[at + 20..at + 28].copy_from_slice(&(1u64 << 40).to_le_bytes());
            b[at + 28..at + 36].copy_from_slice(&(1u64 << 40).to_le_bytes());
        })),
        "overflows",
    );
    // overlapping: b placed on a
    let bytes = edit_info(|b, at| {
        let b_offset = at + 48 + 8 + 8 + 4 + 16 + 4;
        b[b_offset..b_offset + 8].copy_from_slice(&0u64.to_le_bytes());
    });
    let e = parse_err(&bytes);
    assert!(
        matches!(&e, Error::GgufTensor { reason, .. } if reason.contains("overlap")),
        "{e}"
    );
    // a duplicate name
    let bytes = edit_info(|b, at| {
        let name_b = at + 48 + 8;
        b[name_b..name_b + 1].copy_from_slice(b"a");
    });
    let e = parse_err(&bytes);
    assert!(
        matches!(&e, Error::GgufTensor { tensor, reason } if tensor == "a.weight" && reason.contains("twice")),
        "{e}"
    );
    // rows that are not whole blocks
    let bytes = edit_info(|b, at| {
        let b_dims = at + 48 + 8 + 8 + 4;
        b[b_dims..b_dims + 8].copy_from_slice(&33u64.to_le_bytes());
    });
    let e = parse_err(&bytes);
    assert!(
        matches!(&e, Error::GgufTensor { tensor, reason } if tensor == "b.weight" && reason.contains("whole q8_0 blocks")),
        "{e}"
    );
}

#[test]
fn type_codes_map_both_ways() {
    for code in [0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 24, 25, 26, 27, 28, 30] {
        let d = dtype_of_ggml(code).unwrap();
        assert_eq!(ggml_of_dtype(d), Some(code));
    }
    assert_eq!(dtype_of_ggml(10), None);
    assert_eq!(ggml_of_dtype(DType::U8), None);
    assert_eq!(ggml_type_name(11), "Q3_K");
}
