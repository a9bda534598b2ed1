//! The spec decisions of issue 22 (FORMAT.md "Changes", version 3, round 3):
//! object-name lengths, knots in `package.files`, the order and decimals of
//! the spectral figures, and the scope of the proof-name rule.

#![allow(clippy::indexing_slicing, clippy::unwrap_used)]

use super::*;

/// The golden knot with its row file renamed to `name`.
fn golden_with_object(name: &str) -> Header {
    let (mut h, _) = golden_parts();
    h.blocks[0].columnar[0].object = name.to_owned();
    h
}

#[test]
fn object_names_fit_a_file_name_with_their_proof_suffix() {
    let longest = format!("{}.rows", "a".repeat(MAX_OBJECT_NAME_LEN - 5));
    assert_eq!(longest.len(), 249);
    assert_eq!(format!("{longest}.proof").len(), 255);
    Knot::parse(&raw_knot(&laid_out(golden_with_object(&longest)))).unwrap();
    let over = format!("a{longest}");
    assert!(matches!(
        err(&raw_knot(&laid_out(golden_with_object(&over)))),
        Error::BadObjectName { reason, .. } if reason.contains("249 bytes")
    ));
    // a writer refuses it before writing anything
    let (_, payloads) = golden_parts();
    let e = write_knot(golden_with_object(&over), &payloads).unwrap_err();
    assert!(matches!(e, Error::BadObjectName { .. }), "{e}");
    // a companion file name too
    let (mut h, _) = golden_parts();
    h.metadata.insert(
        keys::PACKAGE_FILES.into(),
        Value::StrList(vec![format!("{}.json", "c".repeat(245))]),
    );
    h.metadata.insert(
        keys::PACKAGE_SHA256.into(),
        Value::StrList(vec!["ab".repeat(32)]),
    );
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::BadPackageFile { .. }
    ));
}

#[test]
fn package_files_never_name_a_knot() {
    let (mut h, _) = golden_parts();
    h.metadata.insert(
        keys::PACKAGE_FILES.into(),
        Value::StrList(vec!["config.json".into(), "model.knot".into()]),
    );
    h.metadata.insert(
        keys::PACKAGE_SHA256.into(),
        Value::StrList(vec!["ab".repeat(32), "cd".repeat(32)]),
    );
    assert!(matches!(
        err(&raw_knot(&laid_out(h))),
        Error::BadPackageFile { name, reason } if name == "model.knot" && reason.contains("knot")
    ));
}

fn two_spectral(blocks: &[&str], errors: &[&str], energy: &[&str]) -> Vec<u8> {
    let mut a = spectral_block(2, DType::F32, Quant::None);
    let mut b = a.clone();
    a.name = "a".into();
    b.name = "b".into();
    let mut h = Header {
        metadata: Metadata::new(),
        blocks: vec![a, b],
    };
    for (k, v) in [
        (keys::SPECTRAL_BLOCKS, blocks),
        (keys::SPECTRAL_REL_ERROR, errors),
        (keys::SPECTRAL_ENERGY, energy),
    ] {
        let v = v.iter().map(|s| (*s).to_owned()).collect();
        h.metadata.insert(k.into(), Value::StrList(v));
    }
    raw_knot(&laid_out(h))
}

#[test]
fn spectral_figures_are_in_table_order() {
    Knot::parse(&two_spectral(&["a", "b"], &["0.1", "0.2"], &["0.5", "0.6"])).unwrap();
    Knot::parse(&two_spectral(&["b"], &["0.1"], &["0.5"])).unwrap();
    assert!(matches!(
        err(&two_spectral(&["b", "a"], &["0.1", "0.2"], &["0.5", "0.6"])),
        Error::SpectralMetadata { reason, .. } if reason.contains("table order")
    ));
}

#[test]
fn figures_are_finite_and_shares_at_most_one_exactly() {
    let huge = format!("1{}", "0".repeat(400));
    let just_over_one = "1.00000000000000001";
    assert_eq!(
        just_over_one.parse::<f64>().unwrap(),
        1.0,
        "it reads as 1.0"
    );
    for (error, energy) in [
        (huge.as_str(), "0.5"),
        ("0.1", just_over_one),
        ("0.1", "2"),
        ("0.1", "01.5"),
    ] {
        assert!(
            matches!(
                err(&two_spectral(&["a"], &[error], &[energy])),
                Error::SpectralMetadata { .. }
            ),
            "{} {energy}",
            &error[..error.len().min(12)]
        );
    }
    for (error, energy) in [("0.1", "1"), ("0.1", "1.000"), ("3.5", "0"), ("0", "00.25")] {
        Knot::parse(&two_spectral(&["a"], &[error], &[energy]))
            .unwrap_or_else(|e| panic!("{error} {energy}: {e}"));
    }
}

#[test]
fn proof_names_are_reserved_in_version_3_only() {
    // version 3: `a.rows` has a proof object `a.rows.proof`, so no other
    // object may have that name
    let (mut h, mut payloads) = golden_parts();
    let mut second = h.blocks[0].clone();
    second.name = "other.weight".into();
    second.columnar[0].object = "token_embd.f32.rows.proof".into();
    h.blocks.push(second);
    payloads.push(payloads[0].clone());
    let e = write_knot(h, &payloads).unwrap_err();
    assert!(
        matches!(e, Error::BadObjectName { reason, .. } if reason.contains("proof")
            || reason.contains("used by another")),
        "{e}"
    );
    // version 2 has no proof objects: the same two names are two row files
    let (mut h, _) = golden_parts();
    let mut second = h.blocks[0].clone();
    second.name = "other.weight".into();
    second.columnar[0].object = "token_embd.f32.rows.proof".into();
    h.blocks.push(second);
    let v3 = raw_knot(&laid_out(h));
    let v2 = to_version_2(&v3, &["token_embd.f32.rows", "token_embd.f32.rows.proof"]);
    let knot = Knot::parse(&v2).unwrap();
    assert_eq!(knot.header().preamble().version, VERSION_2);
    assert_eq!(
        knot.blocks()[2].columnar[0].object,
        "token_embd.f32.rows.proof"
    );
}

/// A version 3 knot rewritten as version 2: the 34 bytes of flags, proof
/// height and root after each descriptor's object name dropped, payloads
/// where they were (the data offset stays aligned).
pub(super) fn to_version_2(v3: &[u8], objects: &[&str]) -> Vec<u8> {
    let pre = crate::parse::parse_preamble(v3).unwrap();
    let start = PREAMBLE_LEN as usize;
    let mut head = v3[start..start + pre.header_len as usize].to_vec();
    for object in objects.iter().rev() {
        let at = head
            .windows(object.len() + 2)
            .rposition(|w| {
                w[2..] == *object.as_bytes() && w[..2] == (object.len() as u16).to_le_bytes()
            })
            .unwrap()
            + 2
            + object.len();
        head.drain(at..at + 34);
    }
    let mut out = v3.to_vec();
    out[start..pre.data_offset as usize].fill(0);
    let v2 = Preamble {
        version: VERSION_2,
        header_len: head.len() as u64,
        ..pre
    };
    reseal(&mut out, &v2, &head);
    out
}

#[test]
fn columnar_runs_names_row_files_with_records() {
    let with = |list: &[&str], height: u8| {
        let (mut h, _) = golden_parts();
        if let Some(p) = h.blocks[0].columnar[0].proof.as_mut() {
            p.height = height;
        }
        h.metadata.insert(
            keys::COLUMNAR_RUNS.into(),
            Value::StrList(list.iter().map(|s| (*s).to_owned()).collect()),
        );
        raw_knot(&laid_out(h))
    };
    Knot::parse(&with(&["token_embd.f32.rows"], 1)).unwrap();
    for (list, height, says) in [
        (&["token_embd.f32.rows"][..], 0, "height 0"),
        (&["nope.rows"][..], 1, "not a row file"),
        (
            &["token_embd.f32.rows", "token_embd.f32.rows"][..],
            1,
            "ascending",
        ),
    ] {
        assert!(
            matches!(err(&with(list, height)), Error::RunsMetadata(r) if r.contains(says)),
            "{list:?}"
        );
    }
}
