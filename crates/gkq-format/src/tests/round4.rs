//! The spec decisions of issue 35 (FORMAT.md "Changes", round 4): runs
//! object names in `package.files` and among the objects, derived names
//! past 249 bytes, leading zeros in figures, an empty `columnar.runs`.

#![allow(clippy::indexing_slicing, clippy::unwrap_used)]

use super::decisions::to_version_2;
use super::*;

fn with_package_file(mut h: Header, name: &str) -> Header {
    h.metadata.insert(
        keys::PACKAGE_FILES.into(),
        Value::StrList(vec![name.to_owned()]),
    );
    h.metadata.insert(
        keys::PACKAGE_SHA256.into(),
        Value::StrList(vec!["ab".repeat(32)]),
    );
    h
}

/// 3.1: a companion file may not take the name of a version 3 row file's
/// runs object, whether `columnar.runs` lists it or not.
#[test]
fn package_files_never_name_a_runs_object() {
    let (h, _) = golden_parts();
    assert!(h.meta_list(keys::COLUMNAR_RUNS).is_none(), "not listed");
    let h = with_package_file(h, "token_embd.f32.rows.runs");
    assert!(matches!(
        err(&raw_knot(&laid_out(h.clone()))),
        Error::BadPackageFile { name, .. } if name == "token_embd.f32.rows.runs"
    ));
    // version 2 has no runs objects: the name is an ordinary companion
    let v2 = to_version_2(&raw_knot(&laid_out(h)), &["token_embd.f32.rows"]);
    Knot::parse(&v2).unwrap();
}

/// 3.4 and rule 12: a descriptor named like another row file's runs
/// object is `BadObjectName` in version 3 (in either table order), and two
/// ordinary row files in version 2.
#[test]
fn no_object_takes_a_runs_object_name() {
    for runs_first in [false, true] {
        let (mut h, _) = golden_parts();
        let mut second = h.blocks[0].clone();
        second.name = "other.weight".into();
        second.columnar[0].object = "token_embd.f32.rows.runs".into();
        if runs_first {
            h.blocks.insert(0, second);
        } else {
            h.blocks.push(second);
        }
        let v3 = raw_knot(&laid_out(h));
        assert!(
            matches!(err(&v3), Error::BadObjectName { reason, .. } if reason.contains("used by another")),
            "runs first: {runs_first}"
        );
        let v2 = to_version_2(&v3, &["token_embd.f32.rows", "token_embd.f32.rows.runs"]);
        Knot::parse(&v2).unwrap();
    }
}

/// 3.4: the 249-byte limit is on the names a writer chooses; the derived
/// `.proof` and `.runs` names are then at most 255 bytes.
#[test]
fn derived_names_may_pass_249_bytes() {
    let name = format!("{}.rows", "a".repeat(240));
    assert_eq!(name.len(), 245);
    let (mut h, _) = golden_parts();
    h.blocks[0].columnar[0].object = name.clone();
    h.blocks[0].columnar[0].proof.as_mut().unwrap().height = 1;
    h.metadata.insert(
        keys::COLUMNAR_RUNS.into(),
        Value::StrList(vec![name.clone()]),
    );
    Knot::parse(&raw_knot(&laid_out(h))).unwrap();
    assert_eq!(crate::merkle::proof_object_name(&name).len(), 251);
    assert_eq!(crate::runs::runs_object_name(&name).len(), 250);
}

/// 3.1: figures may have leading zeros; `01` is 1, a share at most 1.
#[test]
fn figures_may_have_leading_zeros() {
    for energy in ["01", "01.000", "001", "00"] {
        assert!(crate::spectral::is_figure(energy, true), "{energy}");
    }
    for energy in ["01.5", "010", "1.01", ""] {
        assert!(!crate::spectral::is_figure(energy, true), "{energy}");
    }
}

/// 7b: an empty `columnar.runs` lists nothing and is valid in both versions.
#[test]
fn an_empty_runs_list_is_valid_in_both_versions() {
    let (mut h, _) = golden_parts();
    h.metadata
        .insert(keys::COLUMNAR_RUNS.into(), Value::StrList(Vec::new()));
    let v3 = raw_knot(&laid_out(h));
    Knot::parse(&v3).unwrap();
    Knot::parse(&to_version_2(&v3, &["token_embd.f32.rows"])).unwrap();
}
