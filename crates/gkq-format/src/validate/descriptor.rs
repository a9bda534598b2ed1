//! Section 7's columnar descriptors of a block: names, dtypes, flags,
//! lengths, proof heights.

use std::collections::HashSet;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::merkle::{MAX_PROOF_HEIGHT, ProofLayout, proof_object_name};
use crate::model::*;

use crate::layout::valid_object_name;

/// A descriptor where none is allowed, or none where one is required.
pub(super) fn placement(b: &Block, reason: &'static str) -> Error {
    Error::DescriptorPlacement {
        block: b.name.clone(),
        reason,
    }
}

/// Descriptors only on COLUMNAR_ELIGIBLE dense 2-D blocks with rows and
/// columns; each one checked against the block.
pub(super) fn validate_descriptors(b: &Block, objects: &mut HashSet<String>) -> Result<()> {
    if b.columnar.is_empty() {
        return Ok(());
    }
    if !matches!(b.encoding, Encoding::Dense(_)) || !b.is_columnar_eligible() {
        return Err(placement(
            b,
            "columnar descriptors are only allowed on COLUMNAR_ELIGIBLE dense blocks",
        ));
    }
    let [rows, cols] = *b.shape.as_slice() else {
        return Err(placement(b, "columnar descriptors need a 2-D block"));
    };
    if rows == 0 || cols == 0 {
        return Err(placement(
            b,
            "columnar descriptors need a block with at least one row and one column",
        ));
    }
    let mut dtypes = HashSet::new();
    for d in &b.columnar {
        validate_names(b, d, objects)?;
        validate_descriptor(b, d, (rows, cols), &mut dtypes)?;
    }
    Ok(())
}

/// The row file's name and, with a proof (version 3), its proof object's
/// name: valid, and used by no other object of the knot.
fn validate_names(b: &Block, d: &ColumnarDescriptor, objects: &mut HashSet<String>) -> Result<()> {
    let bad = |reason| Error::BadObjectName {
        block: b.name.clone(),
        object: d.object.clone(),
        reason,
    };
    valid_object_name(&d.object).map_err(bad)?;
    if !objects.insert(d.object.clone()) {
        return Err(bad("used by another descriptor"));
    }
    for (name, clash) in derived_names(d) {
        if !objects.insert(name) {
            return Err(bad(clash));
        }
    }
    Ok(())
}

/// The names a version 3 row file reserves beside it, listed or not: its
/// proof object (section 7a), runs object (7b) and warm object (7d); none
/// for a version 2 descriptor, which has no proof.
pub(super) fn derived_names(d: &ColumnarDescriptor) -> Vec<(String, &'static str)> {
    if d.proof.is_none() {
        return Vec::new();
    }
    vec![
        (
            proof_object_name(&d.object),
            "its proof object name is used by another object",
        ),
        (
            crate::runs::runs_object_name(&d.object),
            "its runs object name is used by another object",
        ),
        (
            crate::warm::warm_object_name(&d.object),
            "its warm object name is used by another object",
        ),
    ]
}

/// The error of descriptor `d` of block `b` whose `field` is not `expected`.
fn descriptor_field<'a>(
    b: &'a Block,
    d: &'a ColumnarDescriptor,
) -> impl Fn(&'static str, String, String) -> Error + 'a {
    move |field, expected, found| Error::DescriptorField {
        block: b.name.clone(),
        object: d.object.clone(),
        field,
        expected,
        found,
    }
}

/// Section 7a's proof height (at least 1 with an inline proof, 7e) and
/// sections 3.4/3.5's exactness flags.
fn descriptor_proof_and_flags(b: &Block, d: &ColumnarDescriptor) -> Result<()> {
    let field = descriptor_field(b, d);
    if let Some(proof) = &d.proof
        && ProofLayout::new(d.rows, proof.height).is_none()
    {
        let expected = format!("0..={MAX_PROOF_HEIGHT}");
        return Err(field("proof_height", expected, proof.height.to_string()));
    }
    if d.inline_proof() && d.proof.is_none_or(|p| p.height == 0) {
        let found = d.proof.map_or(0, |p| p.height).to_string();
        let expected = "1 or more (INLINE_PROOF: a record after each row)".into();
        return Err(field("proof_height", expected, found));
    }
    if d.dtype == b.dtype && !d.is_block_exact() {
        return Err(field(
            "flags",
            "BLOCK_EXACT set (a row file of the block's dtype is the payload)".into(),
            format!("{:#04x}", d.flags),
        ));
    }
    // section 3.5: block-type values are never SOURCE_EXACT, and rows of a
    // block type are BLOCK_EXACT only as the block's own
    if d.dtype.is_quantized() && (d.is_source_exact() || (d.dtype != b.dtype && d.is_block_exact()))
    {
        let expected = if d.dtype == b.dtype {
            "BLOCK_EXACT only (block-type values are never SOURCE_EXACT)"
        } else {
            "neither flag (rows of a block type of a float block are lossy)"
        };
        return Err(field("flags", expected.into(), format!("{:#04x}", d.flags)));
    }
    Ok(())
}

fn validate_descriptor(
    b: &Block,
    d: &ColumnarDescriptor,
    (rows, cols): (u64, u64),
    dtypes: &mut HashSet<DType>,
) -> Result<()> {
    descriptor_proof_and_flags(b, d)?;
    let field = descriptor_field(b, d);
    // section 3.4: rows of a float block in a float dtype or a block type
    // (3.5); of any other block, in its own dtype
    let dtype_ok = if b.dtype.is_castable_float() {
        d.dtype.is_castable_float() || d.dtype.is_quantized()
    } else {
        d.dtype == b.dtype
    };
    if !dtype_ok || !dtypes.insert(d.dtype) {
        return Err(field(
            "dtype",
            format!("a distinct dtype castable from {}", b.dtype),
            d.dtype.to_string(),
        ));
    }
    if d.rows != rows {
        return Err(field("rows", rows.to_string(), d.rows.to_string()));
    }
    let row_bytes = d
        .dtype
        .row_bytes(cols)
        .ok_or_else(|| match d.dtype.block() {
            Some((n, _)) if !cols.is_multiple_of(n) => field(
                "dtype",
                format!("a dtype whose blocks fit the {cols} columns"),
                format!(
                    "{} (blocks of {n} values: {cols} columns are not whole blocks)",
                    d.dtype
                ),
            ),
            _ => field("row_bytes", "no overflow".into(), "overflow".into()),
        })?;
    if d.row_bytes != row_bytes {
        let found = d.row_bytes.to_string();
        return Err(field("row_bytes", row_bytes.to_string(), found));
    }
    let overflow = || field("byte_len", "no overflow".into(), "overflow".into());
    // section 7e: with an inline proof, each row is followed by its record
    let stride = d.stride();
    let byte_len = rows.checked_mul(stride).ok_or_else(overflow)?;
    if d.byte_len != byte_len {
        let found = d.byte_len.to_string();
        return Err(field("byte_len", byte_len.to_string(), found));
    }
    // Section 7: a row file in the block's own dtype is the payload (its
    // rows are, with an inline proof: 7e).
    if let Encoding::Dense(p) = &b.encoding
        && d.dtype == b.dtype
        && !d.inline_proof()
        && d.sha256 != p.sha256
    {
        let expected = format!(
            "{} (the payload's: same dtype, same bytes)",
            crate::hex(&p.sha256)
        );
        return Err(field("sha256", expected, crate::hex(&d.sha256)));
    }
    Ok(())
}
