use sha2::{Digest, Sha256};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::*;

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
    if !matches!(version, VERSION_2 | VERSION | VERSION_4 | VERSION_5) {
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

/// The fields of a spectral encoding after its tag.
fn parse_spectral(c: &mut Cursor<'_>, block: &str) -> Result<Encoding> {
    let rank = c.u32("spectral rank")?;
    let fcode = c.u8("spectral factor dtype")?;
    let factor_dtype = DType::from_code(fcode).ok_or_else(|| Error::UnknownDtype {
        block: block.to_owned(),
        code: fcode,
    })?;
    let quant = match c.u8("spectral quant")? {
        0 => Quant::None,
        1 => Quant::U8Affine,
        q => {
            return Err(Error::BadSpectral {
                block: block.to_owned(),
                reason: format!("unknown quant {q}"),
            });
        }
    };
    Ok(Encoding::Spectral {
        rank,
        factor_dtype,
        quant,
        payload: parse_payload(c)?,
    })
}

/// The dtype of `code` in a knot of `version` (of `block`, for messages):
/// the block types exist from version 4 on.
fn dtype_of(code: u8, block: &str, version: u32) -> Result<DType> {
    let dtype = DType::from_code(code).ok_or_else(|| Error::UnknownDtype {
        block: block.to_owned(),
        code,
    })?;
    if dtype.since_version() > version {
        return Err(Error::DtypeVersion {
            block: block.to_owned(),
            dtype,
            version,
        });
    }
    Ok(dtype)
}

/// One columnar descriptor of `block` (whose dtype is `dtype`).
fn parse_descriptor(
    c: &mut Cursor<'_>,
    version: u32,
    block: &str,
    dtype: DType,
) -> Result<ColumnarDescriptor> {
    let code = c.u8("descriptor dtype")?;
    let ddtype = dtype_of(code, block, version)?;
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
        if version < VERSION_5 {
            // reserved before version 5 (section 9a): ignored
            d.flags &= !INLINE_PROOF;
        }
        d.proof = Some(RowProof {
            height: c.u8("descriptor proof_height")?,
            root: c.array("descriptor merkle_root")?,
        });
    }
    Ok(d)
}

fn parse_block(c: &mut Cursor<'_>, version: u32) -> Result<Block> {
    let name = c.str16(MAX_NAME_LEN, "block name")?;
    if name.is_empty() {
        return Err(Error::EmptyName { what: "block name" });
    }
    let enc_tag = c.u8("block encoding")?;
    let dtype_code = c.u8("block dtype")?;
    let dtype = dtype_of(dtype_code, &name, version)?;
    let mut flags = c.u32("block flags")?;
    if version < VERSION_5 {
        // reserved before version 5 (section 9a): ignored
        flags &= !IN_ROW_FILE;
    }
    let ndim = c.u8("block ndim")?;
    limit("ndim", u64::from(ndim), u64::from(MAX_NDIM))?;
    let mut shape = Vec::with_capacity(usize::from(ndim));
    for _ in 0..ndim {
        shape.push(c.u64("block dims")?);
    }
    let encoding = match enc_tag {
        0 => Encoding::Dense(parse_payload(c)?),
        1 => parse_spectral(c, &name)?,
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
        columnar.push(parse_descriptor(c, version, &name, dtype)?);
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
