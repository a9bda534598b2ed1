//! Every rule of docs/FORMAT.md that the header alone decides.

use std::collections::HashSet;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::*;
use crate::model::*;

mod descriptor;
mod warm_list;
use descriptor::{derived_names, placement, validate_descriptors};

fn expect_type(md: &Metadata, key: &str, tag: u8) -> Result<()> {
    match md.get(key) {
        Some(v) if v.tag() != tag => Err(Error::MetadataType {
            key: key.to_owned(),
            expected: Value::type_name(tag),
            found: Value::type_name(v.tag()),
        }),
        _ => Ok(()),
    }
}

fn validate_metadata(h: &Header) -> Result<()> {
    let md = &h.metadata;
    for key in [
        keys::TOOL,
        keys::ARCHITECTURE,
        keys::MODEL_TYPE,
        keys::ROLE_TOKEN_EMBD,
        keys::ROLE_LM_HEAD,
        keys::SOURCE_MODEL_ID,
        keys::SOURCE_REVISION,
    ] {
        expect_type(md, key, 3)?;
    }
    for key in [keys::VOCAB_SIZE, keys::HIDDEN_SIZE] {
        expect_type(md, key, 1)?;
    }
    expect_type(md, keys::TIE_WORD_EMBEDDINGS, 2)?;
    for key in [
        keys::SOURCE_FILES,
        keys::SOURCE_SHA256,
        keys::PACKAGE_FILES,
        keys::PACKAGE_SHA256,
        keys::SPECTRAL_BLOCKS,
        keys::SPECTRAL_REL_ERROR,
        keys::SPECTRAL_ENERGY,
        keys::COLUMNAR_RUNS,
        keys::COLUMNAR_WARM,
        keys::COLUMNAR_WARM_ROWS,
    ] {
        expect_type(md, key, 4)?;
    }
    for (files_key, hashes_key) in [
        (keys::SOURCE_FILES, keys::SOURCE_SHA256),
        (keys::PACKAGE_FILES, keys::PACKAGE_SHA256),
    ] {
        match (h.meta_list(files_key), h.meta_list(hashes_key)) {
            (Some(_), None) => {
                return Err(Error::ListIncomplete {
                    present: files_key,
                    missing: hashes_key,
                });
            }
            (None, Some(_)) => {
                return Err(Error::ListIncomplete {
                    present: hashes_key,
                    missing: files_key,
                });
            }
            (Some(files), Some(hashes)) if files.len() != hashes.len() => {
                let (files, hashes) = (files.len(), hashes.len());
                return Err(if files_key == keys::SOURCE_FILES {
                    Error::SourceListMismatch { files, hashes }
                } else {
                    Error::PackageListMismatch { files, hashes }
                });
            }
            _ => {}
        }
    }
    validate_package_files(h)?;
    crate::figures::validate_figures(h)?;
    validate_runs(h)?;
    warm_list::validate_warm(h)?;
    validate_roles(h)
}

/// The row files a `columnar.*` list names (7b, 7d), in order: the list
/// must be strictly ascending and name only descriptor objects; else the
/// first entry that does not, in words.
pub(crate) fn listed_row_files<'h>(
    h: &'h Header,
    list: &'h [String],
) -> std::result::Result<Vec<&'h ColumnarDescriptor>, String> {
    let mut previous: Option<&str> = None;
    let mut out = Vec::with_capacity(list.len());
    for name in list {
        if previous.is_some_and(|p| p.as_bytes() >= name.as_bytes()) {
            return Err(format!("{name:?}: the list must be strictly ascending"));
        }
        previous = Some(name);
        let d = h
            .blocks
            .iter()
            .flat_map(|b| &b.columnar)
            .find(|d| d.object == *name);
        out.push(d.ok_or_else(|| format!("{name:?} is not a row file of the knot"))?);
    }
    Ok(out)
}

/// `columnar.runs` (section 7b): strictly ascending names of row files
/// that carry a proof of height 1 or more.
fn validate_runs(h: &Header) -> Result<()> {
    let Some(list) = h.meta_list(keys::COLUMNAR_RUNS) else {
        return Ok(());
    };
    let bad = Error::RunsMetadata;
    for d in listed_row_files(h, list).map_err(bad)? {
        if d.inline_proof() {
            return Err(bad(format!(
                "{:?} has INLINE_PROOF: it is its own runs object",
                d.object
            )));
        }
        match d.proof {
            Some(p) if p.height > 0 => {}
            Some(_) => {
                return Err(bad(format!(
                    "{:?} has proof height 0: it is its own runs object",
                    d.object
                )));
            }
            None => {
                return Err(bad(format!(
                    "{:?} is not a row file with a row proof",
                    d.object
                )));
            }
        }
    }
    Ok(())
}

/// Every `role.*` key, known or not, is a STR naming a block.
fn validate_roles(h: &Header) -> Result<()> {
    for (key, value) in h.metadata.range::<str, _>((
        std::ops::Bound::Included(keys::ROLE_PREFIX),
        std::ops::Bound::Unbounded,
    )) {
        if !key.starts_with(keys::ROLE_PREFIX) {
            break;
        }
        let Value::Str(name) = value else {
            return Err(Error::MetadataType {
                key: key.clone(),
                expected: Value::type_name(3),
                found: Value::type_name(value.tag()),
            });
        };
        if h.block(name).is_none() {
            return Err(Error::UnknownRoleBlock {
                role: key.clone(),
                name: name.clone(),
            });
        }
    }
    Ok(())
}

/// `package.files`: valid object names, strictly ascending, none of them a
/// row file of the knot; `package.sha256`: 64 lowercase hex digits each.
fn validate_package_files(h: &Header) -> Result<()> {
    let files = h.package_file_names();
    let bad = |name: &str, reason| Error::BadPackageFile {
        name: name.to_owned(),
        reason,
    };
    let mut previous: Option<&str> = None;
    for name in files {
        valid_object_name(name).map_err(|reason| bad(name, reason))?;
        if name.ends_with(".knot") {
            // the knot cannot record its own digest, nor is a knot a companion
            return Err(bad(
                name,
                "names a knot (*.knot), which is never a companion file",
            ));
        }
        if previous.is_some_and(|p| p.as_bytes() >= name.as_bytes()) {
            return Err(bad(name, "package.files must be strictly ascending"));
        }
        previous = Some(name);
        if h.blocks
            .iter()
            .flat_map(|b| &b.columnar)
            .any(|d| d.object == *name || derived_names(d).iter().any(|(n, _)| n == name))
        {
            return Err(bad(
                name,
                "is also a row file, proof, runs or warm object of the knot",
            ));
        }
    }
    let hashes = h.meta_list(keys::PACKAGE_SHA256).unwrap_or_default();
    for (name, hash) in files.iter().zip(hashes) {
        let hex_ok = hash.len() == 64
            && hash
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex_ok {
            return Err(bad(
                name,
                "its package.sha256 entry is not 64 lowercase hex digits",
            ));
        }
    }
    Ok(())
}

fn spectral_len(m: u64, n: u64, k: u64, factor: DType, quant: Quant) -> Option<u64> {
    let f = factor.itemsize();
    let mk = m.checked_mul(k)?;
    let kn = k.checked_mul(n)?;
    let s = k.checked_mul(4)?;
    match quant {
        Quant::None => mk.checked_add(kn)?.checked_mul(f)?.checked_add(s),
        // U_q + U_scale/zero (8 per row of U) + S + Vt_q + Vt_scale/zero (8 per row of Vt)
        Quant::U8Affine => mk
            .checked_add(m.checked_mul(8)?)?
            .checked_add(s)?
            .checked_add(kn)?
            .checked_add(k.checked_mul(8)?),
    }
}

fn validate_block(h: &Header, b: &Block, objects: &mut HashSet<String>) -> Result<()> {
    if let Some((per, _)) = b.dtype.block() {
        // section 3.5: rows of whole blocks (a scalar has no row)
        let cols = b.shape.last().copied().unwrap_or(0);
        if b.shape.is_empty() || (cols != 0 && !cols.is_multiple_of(per)) {
            return Err(Error::BlockShape {
                block: b.name.clone(),
                dtype: b.dtype,
                cols,
                per,
            });
        }
    }
    let bytes = shape_bytes(&b.shape, b.dtype).ok_or_else(|| Error::ShapeOverflow {
        block: b.name.clone(),
        shape: b.shape.clone(),
    })?;
    match &b.encoding {
        Encoding::Dense(p) => validate_dense(b, p, bytes)?,
        Encoding::Spectral { .. } => validate_spectral(b)?,
        Encoding::Alias { target } => validate_alias(h, b, *target)?,
    }
    validate_descriptors(b, objects)
}

/// A dense payload holds the whole tensor; COLUMNAR_ELIGIBLE only on a 2-D
/// block, which then has at least one descriptor (section 3.4); in version
/// 5, IN_ROW_FILE only on such a block with a row file of its own dtype
/// (section 7e).
fn validate_dense(b: &Block, p: &Payload, bytes: u64) -> Result<()> {
    if p.len != bytes {
        return Err(Error::PayloadLength {
            block: b.name.clone(),
            expected: bytes,
            found: p.len,
        });
    }
    let flagged = b.is_columnar_eligible();
    if flagged && b.shape.len() != 2 {
        return Err(placement(
            b,
            "COLUMNAR_ELIGIBLE is set on a block that is not 2-D",
        ));
    }
    if flagged && b.columnar.is_empty() {
        return Err(placement(
            b,
            "COLUMNAR_ELIGIBLE is set but the block has no columnar descriptor",
        ));
    }
    if b.in_row_file() && (!flagged || b.home().is_none()) {
        return Err(placement(
            b,
            "IN_ROW_FILE is set but the block has no row file of its own dtype",
        ));
    }
    Ok(())
}

fn validate_spectral(b: &Block) -> Result<()> {
    let Encoding::Spectral {
        rank,
        factor_dtype,
        quant,
        payload,
    } = &b.encoding
    else {
        return Ok(());
    };
    let bad = |reason: String| Error::BadSpectral {
        block: b.name.clone(),
        reason,
    };
    let [m, n] = b.shape.as_slice() else {
        return Err(bad(format!("shape {:?} is not 2-D", b.shape)));
    };
    if !b.dtype.is_castable_float() {
        return Err(bad(format!("dtype {} is not f32/f16/bf16", b.dtype)));
    }
    if *rank == 0 || *rank > MAX_RANK {
        return Err(bad(format!("rank {rank} is outside 1..={MAX_RANK}")));
    }
    let ok_factor = match quant {
        Quant::None => factor_dtype.is_castable_float(),
        Quant::U8Affine => *factor_dtype == DType::U8,
    };
    if !ok_factor {
        return Err(bad(format!(
            "factor dtype {factor_dtype} does not go with quant {quant:?}"
        )));
    }
    let expected = spectral_len(*m, *n, u64::from(*rank), *factor_dtype, *quant)
        .ok_or_else(|| bad("factor sizes overflow".into()))?;
    if payload.len != expected {
        return Err(Error::PayloadLength {
            block: b.name.clone(),
            expected,
            found: payload.len,
        });
    }
    if b.is_columnar_eligible() || b.in_row_file() {
        return Err(placement(
            b,
            "spectral blocks are never COLUMNAR_ELIGIBLE nor IN_ROW_FILE",
        ));
    }
    Ok(())
}

fn validate_alias(h: &Header, b: &Block, target: u32) -> Result<()> {
    let bad = |reason: String| Error::BadAlias {
        block: b.name.clone(),
        reason,
    };
    let t = usize::try_from(target)
        .ok()
        .and_then(|t| h.blocks.get(t))
        .ok_or_else(|| bad(format!("target {target} is not a block index")))?;
    if matches!(t.encoding, Encoding::Alias { .. }) {
        return Err(bad(format!("target {:?} is itself an alias", t.name)));
    }
    if t.dtype != b.dtype || t.shape != b.shape {
        return Err(bad(format!(
            "dtype/shape {} {:?} differ from target {:?} ({} {:?})",
            b.dtype, b.shape, t.name, t.dtype, t.shape
        )));
    }
    if t.is_columnar_eligible() != b.is_columnar_eligible() {
        return Err(bad(format!(
            "COLUMNAR_ELIGIBLE differs from target {:?}",
            t.name
        )));
    }
    Ok(())
}

/// Checks every rule of docs/FORMAT.md that the header alone decides,
/// including the payload layout against `preamble`.
pub(crate) fn validate(preamble: &Preamble, h: &Header) -> Result<()> {
    let mut names = HashSet::new();
    for b in &h.blocks {
        if !names.insert(b.name.as_str()) {
            return Err(Error::DuplicateBlockName {
                name: b.name.clone(),
            });
        }
    }
    let mut objects = HashSet::new();
    for b in &h.blocks {
        validate_block(h, b, &mut objects)?;
    }
    validate_metadata(h)?;
    let mut cursor = preamble.data_offset;
    for b in &h.blocks {
        let Some(p) = b.encoding.payload() else {
            continue;
        };
        if b.in_row_file() {
            // section 7e: stored in its row file, no place in the knot
            if p.offset != 0 {
                return Err(Error::PayloadOffset {
                    block: b.name.clone(),
                    expected: 0,
                    found: p.offset,
                });
            }
            continue;
        }
        let expected = align_up(cursor).ok_or(Error::FileLength {
            expected: u64::MAX,
            found: preamble.file_len,
        })?;
        if p.offset != expected {
            return Err(Error::PayloadOffset {
                block: b.name.clone(),
                expected,
                found: p.offset,
            });
        }
        cursor = p.offset.checked_add(p.len).ok_or(Error::FileLength {
            expected: u64::MAX,
            found: preamble.file_len,
        })?;
    }
    if cursor != preamble.file_len {
        return Err(Error::FileLength {
            expected: cursor,
            found: preamble.file_len,
        });
    }
    Ok(())
}
