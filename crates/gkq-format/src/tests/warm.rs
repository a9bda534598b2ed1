//! Warm objects (FORMAT.md 7d): the golden vector, the checks a node runs
//! on a fetched object, and one test per metadata rule.

#![allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::unwrap_used
)]

use super::*;
use crate::warm::{WarmLayout, WarmPart, check_warm, write_warm};

/// The three 2-byte rows of 7b's golden vector at proof height 1.
/// The warm object of `ids` from in-memory rows and proof object.
fn warm_of(d: &ColumnarDescriptor, ids: &[u64], rows: &[u8], proof: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let read = |part, at: u64, buf: &mut [u8]| {
        let src = if part == WarmPart::Rows { rows } else { proof };
        buf.copy_from_slice(&src[at as usize..at as usize + buf.len()]);
        Ok(())
    };
    write_warm(d, ids, read, &mut out).unwrap();
    out
}

fn three_rows() -> ([u8; 6], ColumnarDescriptor, Vec<u8>) {
    let rows = [1u8, 2, 3, 4, 5, 6];
    let leaves: Vec<_> = rows.chunks(2).map(merkle::leaf_hash).collect();
    let (root, proof) = merkle::build_proof(&leaves, 1).unwrap();
    let mut d = ColumnarDescriptor::for_shape(3, 2, DType::U8, "g.rows".into()).unwrap();
    d.proof = Some(RowProof { height: 1, root });
    (rows, d, proof)
}

/// FORMAT.md 7d's golden vector: the warm object of rows 0 and 2.
#[test]
fn warm_object_golden_vector() {
    let (rows, d, proof) = three_rows();
    let layout = WarmLayout::of(&d, 2).unwrap();
    assert_eq!(
        (layout.table_len(), layout.stride(), layout.object_len()),
        (64, 34, Some(132))
    );
    let warm = warm_of(&d, &[0, 2], &rows, &proof);
    let golden = "5564155a2da076daa766119fb3863b56b463fde2b5ca5f644ced5fd47a8488da\
                  87dea70e0fde5a5d7a30aa1a9a062246c27dad6d5b360030b46b76a722bd5ee7\
                  0102ed2139a910c69105ce3628d7aae9c530ad4cbb6aa45a683a0eb02f85a2807287\
                  05060000000000000000000000000000000000000000000000000000000000000000";
    assert_eq!(crate::hex(&warm), golden);
    use sha2::Digest;
    assert_eq!(
        crate::hex(&sha2::Sha256::digest(&warm)),
        "342f2bbd50c3d192a7729de778ecdf87e8249fa799c1bc35097cb01980697e89"
    );
    let checked = check_warm(&d, &[0, 2], &warm, None).unwrap();
    assert!(checked.failed.is_empty());
    let got: Vec<(u64, &[u8])> = checked.rows.iter().map(|(i, r, _)| (*i, *r)).collect();
    assert_eq!(got, [(0, &[1u8, 2][..]), (2, &[5u8, 6][..])]);
    // the entries alone, against roots checked before
    let entries = check_warm(&d, &[0, 2], &warm[64..], Some(&checked.roots)).unwrap();
    assert_eq!(entries.rows.len(), 2);
}

#[test]
fn a_warm_object_is_checked_row_by_row() {
    let (rows, d, proof) = three_rows();
    let warm = warm_of(&d, &[0, 2], &rows, &proof);
    // a changed row byte fails that row only
    let mut bad = warm.clone();
    bad[64] ^= 1;
    let c = check_warm(&d, &[0, 2], &bad, None).unwrap();
    assert_eq!(c.rows.len(), 1);
    assert!(matches!(
        c.failed[..],
        [(0, Error::RowProof { row: 0, .. })]
    ));
    // listed under another id, a row fails its proof
    let c = check_warm(&d, &[1, 2], &warm, None).unwrap();
    assert!(matches!(c.failed[..], [(1, Error::RowProof { .. })]));
    // a changed table fails the whole object
    let mut bad = warm.clone();
    bad[3] ^= 1;
    assert!(matches!(
        check_warm(&d, &[0, 2], &bad, None),
        Err(Error::ProofTable { .. })
    ));
    // another length is WarmLength, named after the warm object
    for len in [0, 131, 133] {
        let mut b = warm.clone();
        b.resize(len, 0);
        assert!(matches!(
            check_warm(&d, &[0, 2], &b, None),
            Err(Error::WarmLength { ref object, expected: 132, .. }) if object == "g.rows.warm"
        ));
    }
}

/// The golden knot with a proof of height 0 and the warm keys set.
fn with_warm(objects: &[&str], rows: &[&str]) -> Vec<u8> {
    let (mut h, _) = golden_parts();
    let list = |l: &[&str]| Value::StrList(l.iter().map(|s| (*s).to_owned()).collect());
    h.metadata.insert(keys::COLUMNAR_WARM.into(), list(objects));
    h.metadata
        .insert(keys::COLUMNAR_WARM_ROWS.into(), list(rows));
    raw_knot(&laid_out(h))
}

#[test]
fn columnar_warm_names_row_files_and_rows_in_range() {
    let ok = with_warm(&["token_embd.f32.rows"], &["0", "1"]);
    let k = Knot::parse(&ok).unwrap();
    assert_eq!(k.header().header().warm_rows(), [0, 1]);
    assert!(k.header().header().has_warm("token_embd.f32.rows"));
    let warm = k
        .header()
        .header()
        .objects()
        .into_iter()
        .find(|o| o.kind == ObjectKind::Warm)
        .unwrap();
    // a 2-row table (height 0) and two 12-byte rows without records
    assert_eq!(
        (warm.name.as_str(), warm.len),
        ("token_embd.f32.rows.warm", Some(88))
    );
    for (objects, rows, says) in [
        (&["nope.rows"][..], &["0"][..], "not a row file"),
        (&["token_embd.f32.rows"], &["2"], "past the end"),
        (&["token_embd.f32.rows"], &[], "entries"),
        (&["token_embd.f32.rows"], &["1", "0"], "ascending"),
        (&["token_embd.f32.rows"], &["1", "1"], "ascending"),
        (&["token_embd.f32.rows"], &["01"], "canonical"),
        // issue 42 (9b, round 5): warm rows with no row file to hold them
        (&[], &["0"], "lists no row file"),
        (&["token_embd.f32.rows"], &["+1"], "canonical"),
        (&["token_embd.f32.rows"], &[""], "canonical"),
        (
            &["token_embd.f32.rows"],
            &["99999999999999999999999"],
            "canonical",
        ),
        (
            &["token_embd.f32.rows", "token_embd.f32.rows"],
            &["0"],
            "ascending",
        ),
    ] {
        assert!(
            matches!(err(&with_warm(objects, rows)), Error::WarmMetadata(r) if r.contains(says)),
            "{objects:?} {rows:?}: {}",
            err(&with_warm(objects, rows))
        );
    }
    // one key without the other
    for key in [keys::COLUMNAR_WARM, keys::COLUMNAR_WARM_ROWS] {
        let (mut h, _) = golden_parts();
        h.metadata
            .insert(key.into(), Value::StrList(vec!["0".into()]));
        assert!(matches!(
            err(&raw_knot(&laid_out(h))),
            Error::ListIncomplete { present, .. } if present == key
        ));
    }
}

#[test]
fn the_warm_object_name_is_reserved() {
    let (mut h, _) = golden_parts();
    h.metadata.insert(
        keys::PACKAGE_FILES.into(),
        Value::StrList(vec!["token_embd.f32.rows.warm".into()]),
    );
    h.metadata.insert(
        keys::PACKAGE_SHA256.into(),
        Value::StrList(vec!["0".repeat(64)]),
    );
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::BadPackageFile { reason, .. } if reason.contains("warm")
    ));
}
