//! Helpers shared by this crate's unit tests and by other crates' tests.
#![allow(
    missing_docs,
    unreachable_pub,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)]

use crate::dtype::DType;
use crate::layout::{PREAMBLE_LEN, align_up};
use crate::model::*;

/// The golden knot of docs/FORMAT.md section 10, as a header plus payloads.
pub fn golden_parts() -> (Header, Vec<Vec<u8>>) {
    let mut md = Metadata::new();
    md.insert(keys::VOCAB_SIZE.into(), Value::U64(2));
    md.insert(
        keys::ROLE_TOKEN_EMBD.into(),
        Value::Str("embed.weight".into()),
    );
    md.insert(
        keys::ROLE_LM_HEAD.into(),
        Value::Str("lm_head.weight".into()),
    );
    let mut embed = Block::dense("embed.weight", DType::F32, vec![2, 3]).expect("small shape");
    embed.flags = COLUMNAR_ELIGIBLE;
    embed.columnar.push(
        ColumnarDescriptor::for_shape(
            2,
            3,
            DType::F32,
            rows_object_name(crate::Role::TokenEmbd, DType::F32),
        )
        .expect("small shape"),
    );
    let payload: Vec<u8> = [1.0f32, 2.0, 3.0, -1.0, 0.5, 0.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    // the rows are the payload: their values are the source's (SOURCE_EXACT),
    // and their Merkle root is RFC 9162's over the two 12-byte rows
    let leaves: Vec<_> = payload.chunks(12).map(crate::merkle::leaf_hash).collect();
    let d = &mut embed.columnar[0];
    d.flags = SOURCE_EXACT | BLOCK_EXACT;
    d.proof = Some(RowProof {
        height: 0,
        root: crate::merkle::tree_hash(&leaves).expect("two rows"),
    });
    let alias = Block {
        name: "lm_head.weight".into(),
        dtype: DType::F32,
        flags: COLUMNAR_ELIGIBLE,
        shape: vec![2, 3],
        encoding: Encoding::Alias { target: 0 },
        columnar: Vec::new(),
    };
    (
        Header {
            metadata: md,
            blocks: vec![embed, alias],
        },
        vec![payload],
    )
}

/// Encodes `header` as given (offsets and lengths untouched, no validation)
/// into a knot whose payload bytes are zero and whose checksum is right.
/// `file_len` is the end of the furthest payload, or `data_offset`.
pub fn raw_knot(header: &Header) -> Vec<u8> {
    let head = crate::write::encode_header(header).expect("encodable header");
    let header_len = head.len() as u64;
    let data_offset = align_up(PREAMBLE_LEN + header_len).expect("small");
    let file_len = header
        .blocks
        .iter()
        .filter_map(|b| b.encoding.payload())
        .map(|p| p.offset.saturating_add(p.len))
        .fold(data_offset, u64::max);
    let mut bytes = vec![0u8; usize::try_from(file_len).expect("test knot fits in memory")];
    let pre = Preamble {
        version: crate::layout::VERSION,
        header_len,
        data_offset,
        file_len,
        header_sha256: [0; 32],
    };
    reseal(&mut bytes, &pre, &head);
    bytes
}

/// Writes `pre` and `head` at the start of `bytes` with a correct checksum.
pub fn reseal(bytes: &mut [u8], pre: &Preamble, head: &[u8]) {
    let mut p = crate::write::encode_preamble(pre);
    let digest = crate::parse::header_digest(&p, head);
    p.truncate(40);
    p.extend_from_slice(&digest);
    p.extend_from_slice(head);
    bytes[..p.len()].copy_from_slice(&p);
}
