use std::collections::HashSet;

use sha2::{Digest, Sha256};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::*;
use crate::merkle::{MAX_PROOF_HEIGHT, ProofLayout, proof_object_name};
use crate::model::*;

/// Bytes of the preamble covered by the header checksum.
pub(crate) const CHECKSUMMED_PREAMBLE: usize = 40;

/// A bounds-checked reader over the header bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n);
        match end.and_then(|end| self.buf.get(self.pos..end).map(|s| (s, end))) {
            Some((s, end)) => {
                self.pos = end;
                Ok(s)
            }
            None => Err(Error::HeaderEof {
                what,
                offset: self.offset(),
                needed: (n as u64).saturating_sub(self.remaining() as u64),
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(u8::from_le_bytes(self.array(what)?))
    }
    fn u16(&mut self, what: &'static str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, len: usize, max: usize, what: &'static str) -> Result<String> {
        if len > max {
            return Err(Error::LimitExceeded {
                what,
                value: len as u64,
                max: max as u64,
            });
        }
        let offset = self.offset();
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| Error::InvalidUtf8 { what, offset })
    }

    fn str16(&mut self, max: usize, what: &'static str) -> Result<String> {
        let len = self.u16(what)?;
        self.string(usize::from(len), max, what)
    }

    fn str32(&mut self, max: usize, what: &'static str) -> Result<String> {
        let len = self.u32(what)?;
        self.string(usize::try_from(len).unwrap_or(usize::MAX), max, what)
    }

    /// Rejects a count of items of at least `min_item` bytes each that could
    /// not fit in what is left, before anything is allocated for it.
    fn check_count(&self, count: u64, min_item: u64, what: &'static str) -> Result<usize> {
        let need = count.saturating_mul(min_item);
        if need > self.remaining() as u64 {
            return Err(Error::HeaderEof {
                what,
                offset: self.offset(),
                needed: need.saturating_sub(self.remaining() as u64),
            });
        }
        usize::try_from(count).map_err(|_| Error::LimitExceeded {
            what,
            value: count,
            max: usize::MAX as u64,
        })
    }
}

fn limit(what: &'static str, value: u64, max: u64) -> Result<()> {
    if value > max {
        Err(Error::LimitExceeded { what, value, max })
    } else {
        Ok(())
    }
}

/// Parses and checks the 72-byte preamble. Returns it and the 40 bytes the
/// header checksum covers.
pub(crate) fn parse_preamble(bytes: &[u8]) -> Result<Preamble> {
    let Some(p) = bytes.get(..PREAMBLE_LEN as usize) else {
        return Err(Error::Truncated {
            needed: PREAMBLE_LEN,
            available: bytes.len() as u64,
        });
    };
    let mut c = Cursor { buf: p, pos: 0 };
    let magic: [u8; 8] = c.array("magic")?;
    if magic != MAGIC {
        return Err(Error::BadMagic { found: magic });
    }
    let version = c.u32("version")?;
    if version != VERSION && version != VERSION_2 {
        return Err(Error::UnsupportedVersion { found: version });
    }
    let _reserved = c.u32("reserved")?;
    let header_len = c.u64("header_len")?;
    if header_len > MAX_HEADER_LEN {
        return Err(Error::HeaderTooLarge {
            len: header_len,
            max: MAX_HEADER_LEN,
        });
    }
    let data_offset = c.u64("data_offset")?;
    let expected = PREAMBLE_LEN
        .checked_add(header_len)
        .and_then(align_up)
        .ok_or(Error::HeaderTooLarge {
            len: header_len,
            max: MAX_HEADER_LEN,
        })?;
    if data_offset != expected {
        return Err(Error::BadDataOffset {
            found: data_offset,
            expected,
        });
    }
    let file_len = c.u64("file_len")?;
    let header_sha256 = c.array("header_sha256")?;
    Ok(Preamble {
        version,
        header_len,
        data_offset,
        file_len,
        header_sha256,
    })
}

pub(crate) fn header_digest(preamble_bytes: &[u8], header: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(
        preamble_bytes
            .get(..CHECKSUMMED_PREAMBLE)
            .unwrap_or(preamble_bytes),
    );
    h.update(header);
    h.finalize().into()
}

fn parse_metadata(c: &mut Cursor<'_>) -> Result<Metadata> {
    let count = c.u32("metadata count")?;
    limit(
        "metadata entry count",
        u64::from(count),
        u64::from(MAX_METADATA_ENTRIES),
    )?;
    // key length (2) + type (1) + smallest value (1)
    c.check_count(u64::from(count), 4, "metadata entries")?;
    let mut md = Metadata::new();
    let mut previous: Option<String> = None;
    for _ in 0..count {
        let key = c.str16(MAX_KEY_LEN, "metadata key")?;
        if key.is_empty() {
            return Err(Error::EmptyName {
                what: "metadata key",
            });
        }
        if let Some(prev) = &previous
            && key.as_bytes() <= prev.as_bytes()
        {
            return Err(Error::MetadataOrder {
                key,
                previous: prev.clone(),
            });
        }
        let tag = c.u8("metadata type")?;
        let value = match tag {
            1 => Value::U64(c.u64("U64 value")?),
            2 => match c.u8("BOOL value")? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                value => return Err(Error::NonCanonicalBool { key, value }),
            },
            3 => Value::Str(c.str32(MAX_STRING_LEN, "STR value")?),
            4 => {
                let n = c.u32("STR_LIST count")?;
                limit("STR_LIST length", u64::from(n), u64::from(MAX_LIST_LEN))?;
                let n = c.check_count(u64::from(n), 4, "STR_LIST items")?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(c.str32(MAX_STRING_LEN, "STR_LIST item")?);
                }
                Value::StrList(items)
            }
            tag => return Err(Error::UnknownValueType { key, tag }),
        };
        previous = Some(key.clone());
        md.insert(key, value);
    }
    Ok(md)
}

fn parse_payload(c: &mut Cursor<'_>) -> Result<Payload> {
    Ok(Payload {
        offset: c.u64("payload offset")?,
        len: c.u64("payload length")?,
        sha256: c.array("payload sha256")?,
    })
}

fn parse_block(c: &mut Cursor<'_>, version: u32) -> Result<Block> {
    let name = c.str16(MAX_NAME_LEN, "block name")?;
    if name.is_empty() {
        return Err(Error::EmptyName { what: "block name" });
    }
    let enc_tag = c.u8("block encoding")?;
    let dtype_code = c.u8("block dtype")?;
    let dtype = DType::from_code(dtype_code).ok_or_else(|| Error::UnknownDtype {
        block: name.clone(),
        code: dtype_code,
    })?;
    let flags = c.u32("block flags")?;
    let ndim = c.u8("block ndim")?;
    limit("ndim", u64::from(ndim), u64::from(MAX_NDIM))?;
    let mut shape = Vec::with_capacity(usize::from(ndim));
    for _ in 0..ndim {
        shape.push(c.u64("block dims")?);
    }
    let encoding = match enc_tag {
        0 => Encoding::Dense(parse_payload(c)?),
        1 => {
            let rank = c.u32("spectral rank")?;
            let fcode = c.u8("spectral factor dtype")?;
            let factor_dtype = DType::from_code(fcode).ok_or_else(|| Error::UnknownDtype {
                block: name.clone(),
                code: fcode,
            })?;
            let quant = match c.u8("spectral quant")? {
                0 => Quant::None,
                1 => Quant::U8Affine,
                q => {
                    return Err(Error::BadSpectral {
                        block: name,
                        reason: format!("unknown quant {q}"),
                    });
                }
            };
            Encoding::Spectral {
                rank,
                factor_dtype,
                quant,
                payload: parse_payload(c)?,
            }
        }
        2 => Encoding::Alias {
            target: c.u32("alias target")?,
        },
        tag => return Err(Error::UnknownEncoding { block: name, tag }),
    };
    let n = c.u8("descriptor count")?;
    limit(
        "descriptors per block",
        u64::from(n),
        u64::from(MAX_DESCRIPTORS),
    )?;
    let mut columnar = Vec::with_capacity(usize::from(n));
    for _ in 0..n {
        let code = c.u8("descriptor dtype")?;
        let ddtype = DType::from_code(code).ok_or_else(|| Error::UnknownDtype {
            block: name.clone(),
            code,
        })?;
        let mut d = ColumnarDescriptor {
            dtype: ddtype,
            rows: c.u64("descriptor rows")?,
            row_bytes: c.u64("descriptor row_bytes")?,
            byte_len: c.u64("descriptor byte_len")?,
            sha256: c.array("descriptor sha256")?,
            object: c.str16(MAX_NAME_LEN, "descriptor object")?,
            flags: 0,
            proof: None,
        };
        if version == VERSION_2 {
            // section 9a: only a row file of the block's own dtype is known
            // to stand in for the block; nothing is known about the source
            if ddtype == dtype {
                d.flags = BLOCK_EXACT;
            }
        } else {
            d.flags = c.u8("descriptor flags")?;
            d.proof = Some(RowProof {
                height: c.u8("descriptor proof_height")?,
                root: c.array("descriptor merkle_root")?,
            });
        }
        columnar.push(d);
    }
    Ok(Block {
        name,
        dtype,
        flags,
        shape,
        encoding,
        columnar,
    })
}

/// Parses header bytes (no checksum check, no semantic validation).
pub(crate) fn decode_header(bytes: &[u8], version: u32) -> Result<Header> {
    let mut c = Cursor { buf: bytes, pos: 0 };
    let metadata = parse_metadata(&mut c)?;
    let count = c.u32("block count")?;
    limit("block count", u64::from(count), u64::from(MAX_BLOCKS))?;
    // smallest block: name len 2 + 1 byte name + enc + dtype + flags 4 + ndim + alias 4 + n_columnar
    let count = c.check_count(u64::from(count), 14, "block table")?;
    let mut blocks = Vec::with_capacity(count);
    for _ in 0..count {
        blocks.push(parse_block(&mut c, version)?);
    }
    if c.remaining() != 0 {
        return Err(Error::HeaderTrailingBytes {
            extra: c.remaining() as u64,
        });
    }
    Ok(Header { metadata, blocks })
}

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
    validate_spectral_figures(h)?;
    // Every `role.*` key, known or not, is a STR naming a block.
    for (key, value) in md.range::<str, _>((
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
    let files = h.meta_list(keys::PACKAGE_FILES).unwrap_or_default();
    let bad = |name: &str, reason| Error::BadPackageFile {
        name: name.to_owned(),
        reason,
    };
    let mut previous: Option<&str> = None;
    for name in files {
        valid_object_name(name).map_err(|reason| bad(name, reason))?;
        if previous.is_some_and(|p| p.as_bytes() >= name.as_bytes()) {
            return Err(bad(name, "package.files must be strictly ascending"));
        }
        previous = Some(name);
        if h.blocks.iter().flat_map(|b| &b.columnar).any(|d| {
            d.object == *name || d.proof.is_some() && proof_object_name(&d.object) == *name
        }) {
            return Err(bad(name, "is also a row file or proof object of the knot"));
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

/// `spectral.blocks`, `spectral.rel_frobenius_error`, `spectral.energy_kept`:
/// all three or none, the same length; each block named once, a `SPECTRAL`
/// block of the table; each figure a decimal, the energy at most 1.
fn validate_spectral_figures(h: &Header) -> Result<()> {
    let lists = [
        keys::SPECTRAL_BLOCKS,
        keys::SPECTRAL_REL_ERROR,
        keys::SPECTRAL_ENERGY,
    ]
    .map(|k| (k, h.meta_list(k)));
    let present: Vec<_> = lists.iter().filter(|(_, l)| l.is_some()).collect();
    if present.is_empty() {
        return Ok(());
    }
    if let Some((missing, _)) = lists.iter().find(|(_, l)| l.is_none()) {
        return Err(Error::ListIncomplete {
            present: present.first().map_or("", |(k, _)| k),
            missing,
        });
    }
    let [(_, Some(blocks)), (_, Some(errors)), (_, Some(energy))] = lists else {
        return Ok(());
    };
    let bad = |key, reason: String| Error::SpectralMetadata { key, reason };
    if errors.len() != blocks.len() || energy.len() != blocks.len() {
        return Err(bad(
            keys::SPECTRAL_BLOCKS,
            format!(
                "{} blocks but {} errors and {} energies",
                blocks.len(),
                errors.len(),
                energy.len()
            ),
        ));
    }
    let mut seen = HashSet::new();
    for ((name, e), k) in blocks.iter().zip(errors).zip(energy) {
        if !seen.insert(name.as_str()) {
            return Err(bad(keys::SPECTRAL_BLOCKS, format!("{name:?} listed twice")));
        }
        if !h
            .block(name)
            .is_some_and(|b| matches!(b.encoding, Encoding::Spectral { .. }))
        {
            return Err(bad(
                keys::SPECTRAL_BLOCKS,
                format!("{name:?} is not a spectral block of the knot"),
            ));
        }
        for (key, v, max) in [
            (keys::SPECTRAL_REL_ERROR, e, f64::INFINITY),
            (keys::SPECTRAL_ENERGY, k, 1.0),
        ] {
            let ok = crate::spectral::is_decimal(v) && v.parse::<f64>().is_ok_and(|x| x <= max);
            if !ok {
                return Err(bad(
                    key,
                    format!("{name:?}: {v:?} is not a decimal in [0, {max}]"),
                ));
            }
        }
    }
    Ok(())
}

fn valid_object_name(s: &str) -> std::result::Result<(), &'static str> {
    if s.is_empty() {
        return Err("empty");
    }
    if s.starts_with('.') {
        return Err("must not start with '.'");
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("only [A-Za-z0-9._-] allowed");
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
    let name = || b.name.clone();
    let bytes = shape_bytes(&b.shape, b.dtype).ok_or_else(|| Error::ShapeOverflow {
        block: name(),
        shape: b.shape.clone(),
    })?;
    let flagged = b.is_columnar_eligible();
    match &b.encoding {
        Encoding::Dense(p) => {
            if p.len != bytes {
                return Err(Error::PayloadLength {
                    block: name(),
                    expected: bytes,
                    found: p.len,
                });
            }
            if flagged && b.shape.len() != 2 {
                return Err(Error::DescriptorPlacement {
                    block: name(),
                    reason: "COLUMNAR_ELIGIBLE is set on a block that is not 2-D",
                });
            }
            if flagged && b.columnar.is_empty() {
                return Err(Error::DescriptorPlacement {
                    block: name(),
                    reason: "COLUMNAR_ELIGIBLE is set but the block has no columnar descriptor",
                });
            }
        }
        Encoding::Spectral {
            rank,
            factor_dtype,
            quant,
            payload,
        } => {
            let bad = |reason: String| Error::BadSpectral {
                block: name(),
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
                    block: name(),
                    expected,
                    found: payload.len,
                });
            }
            if flagged {
                return Err(Error::DescriptorPlacement {
                    block: name(),
                    reason: "spectral blocks are never COLUMNAR_ELIGIBLE",
                });
            }
        }
        Encoding::Alias { target } => {
            let bad = |reason: String| Error::BadAlias {
                block: name(),
                reason,
            };
            let t = usize::try_from(*target)
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
            if t.is_columnar_eligible() != flagged {
                return Err(bad(format!(
                    "COLUMNAR_ELIGIBLE differs from target {:?}",
                    t.name
                )));
            }
        }
    }
    if b.columnar.is_empty() {
        return Ok(());
    }
    if !matches!(b.encoding, Encoding::Dense(_)) || !flagged {
        return Err(Error::DescriptorPlacement {
            block: name(),
            reason: "columnar descriptors are only allowed on COLUMNAR_ELIGIBLE dense blocks",
        });
    }
    let (rows, cols) = match b.shape.as_slice() {
        [r, c] => (*r, *c),
        _ => {
            return Err(Error::DescriptorPlacement {
                block: name(),
                reason: "columnar descriptors need a 2-D block",
            });
        }
    };
    if rows == 0 || cols == 0 {
        return Err(Error::DescriptorPlacement {
            block: name(),
            reason: "columnar descriptors need a block with at least one row and one column",
        });
    }
    let mut dtypes = HashSet::new();
    for d in &b.columnar {
        let field = |field: &'static str, expected: String, found: String| Error::DescriptorField {
            block: name(),
            object: d.object.clone(),
            field,
            expected,
            found,
        };
        valid_object_name(&d.object).map_err(|reason| Error::BadObjectName {
            block: name(),
            object: d.object.clone(),
            reason,
        })?;
        if !objects.insert(d.object.clone()) {
            return Err(Error::BadObjectName {
                block: name(),
                object: d.object.clone(),
                reason: "used by another descriptor",
            });
        }
        if let Some(proof) = &d.proof {
            // section 7a: the proof object is named after the row file
            let proof_name = proof_object_name(&d.object);
            if proof_name.len() > MAX_NAME_LEN || !objects.insert(proof_name) {
                return Err(Error::BadObjectName {
                    block: name(),
                    object: d.object.clone(),
                    reason: "its proof object name is too long or used by another object",
                });
            }
            if ProofLayout::new(d.rows, proof.height).is_none() {
                return Err(field(
                    "proof_height",
                    format!("0..={MAX_PROOF_HEIGHT}"),
                    proof.height.to_string(),
                ));
            }
        }
        if d.dtype == b.dtype && !d.is_block_exact() {
            return Err(field(
                "flags",
                "BLOCK_EXACT set (a row file of the block's dtype is the payload)".into(),
                format!("{:#04x}", d.flags),
            ));
        }
        let dtype_ok = if b.dtype.is_castable_float() {
            d.dtype.is_castable_float()
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
        let row_bytes = cols
            .checked_mul(d.dtype.itemsize())
            .ok_or_else(|| field("row_bytes", "no overflow".into(), "overflow".into()))?;
        if d.row_bytes != row_bytes {
            return Err(field(
                "row_bytes",
                row_bytes.to_string(),
                d.row_bytes.to_string(),
            ));
        }
        let byte_len = rows
            .checked_mul(row_bytes)
            .ok_or_else(|| field("byte_len", "no overflow".into(), "overflow".into()))?;
        if d.byte_len != byte_len {
            return Err(field(
                "byte_len",
                byte_len.to_string(),
                d.byte_len.to_string(),
            ));
        }
        // Section 7: a row file in the block's own dtype is the payload.
        if let Encoding::Dense(p) = &b.encoding
            && d.dtype == b.dtype
            && d.sha256 != p.sha256
        {
            return Err(field(
                "sha256",
                format!(
                    "{} (the payload's: same dtype, same bytes)",
                    crate::hex(&p.sha256)
                ),
                crate::hex(&d.sha256),
            ));
        }
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

/// A validated preamble and header: everything but the payloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnotHeader {
    preamble: Preamble,
    header: Header,
}

impl KnotHeader {
    /// The preamble.
    pub fn preamble(&self) -> &Preamble {
        &self.preamble
    }

    /// Metadata and block table.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// `72 + header_len`: the bytes a remote reader fetched.
    pub fn header_end(&self) -> u64 {
        // validated: header_len <= MAX_HEADER_LEN
        PREAMBLE_LEN.saturating_add(self.preamble.header_len)
    }

    /// Byte range `[offset, offset + len)` of the payload holding block
    /// `index` (following an alias).
    pub fn payload_of(&self, index: usize) -> Option<Payload> {
        self.header.resolve(index)?.encoding.payload().copied()
    }
}

/// What [`parse_prefix`] learned from the first bytes of a knot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prefix {
    /// The prefix is too short; fetch bytes `0..total` (or at least up to `total`).
    NeedBytes {
        /// Total prefix length needed.
        total: u64,
    },
    /// The whole header, checked and validated.
    Complete(Box<KnotHeader>),
}

/// Parses the header from the first bytes of a knot. Given fewer than 72
/// bytes it asks for 72; given the preamble, it asks for `72 + header_len`.
/// Extra bytes after the header are ignored. The result is fully validated
/// except for payload bytes, padding and the real file length.
pub fn parse_prefix(prefix: &[u8]) -> Result<Prefix> {
    if (prefix.len() as u64) < PREAMBLE_LEN {
        return Ok(Prefix::NeedBytes {
            total: PREAMBLE_LEN,
        });
    }
    let preamble = parse_preamble(prefix)?;
    let total = PREAMBLE_LEN.saturating_add(preamble.header_len);
    let (Ok(start), Ok(end)) = (usize::try_from(PREAMBLE_LEN), usize::try_from(total)) else {
        return Err(Error::HeaderTooLarge {
            len: preamble.header_len,
            max: MAX_HEADER_LEN,
        });
    };
    let Some(header_bytes) = prefix.get(start..end) else {
        return Ok(Prefix::NeedBytes { total });
    };
    let computed = header_digest(prefix, header_bytes);
    if computed != preamble.header_sha256 {
        return Err(Error::HeaderChecksum {
            stored: crate::hex(&preamble.header_sha256),
            computed: crate::hex(&computed),
        });
    }
    let header = decode_header(header_bytes, preamble.version)?;
    validate(&preamble, &header)?;
    Ok(Prefix::Complete(Box::new(KnotHeader { preamble, header })))
}

/// A whole knot in memory (typically an mmap), validated, with borrowed payloads.
#[derive(Debug)]
pub struct Knot<'a> {
    header: KnotHeader,
    bytes: &'a [u8],
}

impl<'a> Knot<'a> {
    /// Validates everything the format requires except the payload digests
    /// (see [`Knot::verify_payload`]): preamble, header checksum, every
    /// header rule, the layout, zero padding and the file length.
    pub fn parse(bytes: &'a [u8]) -> Result<Knot<'a>> {
        let header = match parse_prefix(bytes)? {
            Prefix::Complete(h) => *h,
            Prefix::NeedBytes { total } if total <= PREAMBLE_LEN => {
                return Err(Error::Truncated {
                    needed: total,
                    available: bytes.len() as u64,
                });
            }
            Prefix::NeedBytes { total } => {
                return Err(Error::HeaderTruncated {
                    header_end: total,
                    available: bytes.len() as u64,
                });
            }
        };
        let len = bytes.len() as u64;
        if len != header.preamble.file_len {
            return Err(Error::FileSize {
                file_len: header.preamble.file_len,
                actual: len,
            });
        }
        let mut gap_start = header.header_end();
        let check_gap = |from: u64, to: u64| -> Result<()> {
            let slice = usize::try_from(from)
                .ok()
                .zip(usize::try_from(to).ok())
                .and_then(|(f, t)| bytes.get(f..t))
                .ok_or(Error::Truncated {
                    needed: to,
                    available: len,
                })?;
            if let Some(i) = slice.iter().position(|&b| b != 0) {
                return Err(Error::NonZeroPadding {
                    offset: from.saturating_add(i as u64),
                });
            }
            Ok(())
        };
        check_gap(gap_start, header.preamble.data_offset)?;
        gap_start = header.preamble.data_offset;
        for b in &header.header.blocks {
            if let Some(p) = b.encoding.payload() {
                check_gap(gap_start, p.offset)?;
                gap_start = p.offset.saturating_add(p.len);
            }
        }
        Ok(Knot { header, bytes })
    }

    /// The validated header.
    pub fn header(&self) -> &KnotHeader {
        &self.header
    }

    /// The metadata and block table.
    pub fn blocks(&self) -> &[Block] {
        &self.header.header.blocks
    }

    /// The payload bytes of block `index` (following an alias), without copying.
    pub fn payload(&self, index: usize) -> Option<&'a [u8]> {
        let p = self.header.payload_of(index)?;
        let start = usize::try_from(p.offset).ok()?;
        let end = usize::try_from(p.offset.checked_add(p.len)?).ok()?;
        self.bytes.get(start..end)
    }

    /// Whether the payload of block `index` hashes to its stored digest.
    /// `None` for an index out of range.
    pub fn verify_payload(&self, index: usize) -> Option<bool> {
        let p = self.header.payload_of(index)?;
        let data = self.payload(index)?;
        let digest: [u8; 32] = Sha256::digest(data).into();
        Some(digest == p.sha256)
    }

    /// Checks the payload of block `index` against its stored digest
    /// ([`Error::PayloadDigest`]). Blocks without a payload (aliases of
    /// nothing) and indices out of range pass.
    pub fn check_payload(&self, index: usize) -> Result<()> {
        let (Some(p), Some(data)) = (self.header.payload_of(index), self.payload(index)) else {
            return Ok(());
        };
        check_payload_digest(&self.header.header, index, &p, Sha256::digest(data).into())
    }
}

/// [`Error::PayloadDigest`] unless `computed` is the digest `p` records for
/// block `index` of `header`.
pub fn check_payload_digest(
    header: &Header,
    index: usize,
    p: &Payload,
    computed: [u8; 32],
) -> Result<()> {
    if computed == p.sha256 {
        return Ok(());
    }
    Err(Error::PayloadDigest {
        block: header
            .resolve(index)
            .map(|b| b.name.clone())
            .unwrap_or_default(),
        stored: crate::hex(&p.sha256),
        computed: crate::hex(&computed),
        offset: p.offset,
        end: p.offset.saturating_add(p.len),
    })
}

/// The checks of a row file that do not need its rows (section 7): its
/// length ([`Error::RowFileLength`]).
pub fn check_row_file_len(d: &ColumnarDescriptor, len: u64) -> Result<()> {
    if len == d.byte_len {
        return Ok(());
    }
    Err(Error::RowFileLength {
        object: d.object.clone(),
        expected: d.byte_len,
        found: len,
        rows: d.rows,
        row_bytes: d.row_bytes,
    })
}

/// [`Error::RowFileDigest`] unless `computed` is the descriptor's digest.
pub fn check_row_file_digest(d: &ColumnarDescriptor, computed: [u8; 32]) -> Result<()> {
    if computed == d.sha256 {
        return Ok(());
    }
    Err(Error::RowFileDigest {
        object: d.object.clone(),
        stored: crate::hex(&d.sha256),
        computed: crate::hex(&computed),
    })
}
