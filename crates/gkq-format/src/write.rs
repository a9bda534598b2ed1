use std::io::{Read, Seek, SeekFrom, Write};

use sha2::{Digest, Sha256};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::knot::{KnotHeader, Prefix, parse_prefix};
use crate::layout::*;
use crate::model::*;
use crate::parse::header_digest;
use crate::validate::validate;

fn str_len<T: TryFrom<usize>>(s: &str, max: usize, what: &'static str) -> Result<T> {
    if s.len() > max {
        return Err(Error::LimitExceeded {
            what,
            value: s.len() as u64,
            max: max as u64,
        });
    }
    T::try_from(s.len()).map_err(|_| Error::LimitExceeded {
        what,
        value: s.len() as u64,
        max: max as u64,
    })
}

fn put_str16(out: &mut Vec<u8>, s: &str, max: usize, what: &'static str) -> Result<()> {
    let n: u16 = str_len(s, max, what)?;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn put_str32(out: &mut Vec<u8>, s: &str, max: usize, what: &'static str) -> Result<()> {
    let n: u32 = str_len(s, max, what)?;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn count<T: TryFrom<usize>>(n: usize, max: u64, what: &'static str) -> Result<T> {
    let err = || Error::LimitExceeded {
        what,
        value: n as u64,
        max,
    };
    if n as u64 > max {
        return Err(err());
    }
    T::try_from(n).map_err(|_| err())
}

fn put_payload(out: &mut Vec<u8>, p: &Payload) {
    out.extend_from_slice(&p.offset.to_le_bytes());
    out.extend_from_slice(&p.len.to_le_bytes());
    out.extend_from_slice(&p.sha256);
}

/// The metadata section (section 3.1), appended to `out`.
fn put_metadata(out: &mut Vec<u8>, metadata: &Metadata) -> Result<()> {
    let n: u32 = count(
        metadata.len(),
        u64::from(MAX_METADATA_ENTRIES),
        "metadata entry count",
    )?;
    out.extend_from_slice(&n.to_le_bytes());
    for (key, value) in metadata {
        if key.is_empty() {
            return Err(Error::EmptyName {
                what: "metadata key",
            });
        }
        put_str16(out, key, MAX_KEY_LEN, "metadata key")?;
        out.push(value.tag());
        match value {
            Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::Bool(v) => out.push(u8::from(*v)),
            Value::Str(s) => put_str32(out, s, MAX_STRING_LEN, "STR value")?,
            Value::StrList(items) => {
                let n: u32 = count(items.len(), u64::from(MAX_LIST_LEN), "STR_LIST length")?;
                out.extend_from_slice(&n.to_le_bytes());
                for s in items {
                    put_str32(out, s, MAX_STRING_LEN, "STR_LIST item")?;
                }
            }
        }
    }
    Ok(())
}

/// One block of the table (section 3.2), appended to `out`.
fn put_block(out: &mut Vec<u8>, b: &Block) -> Result<()> {
    if b.name.is_empty() {
        return Err(Error::EmptyName { what: "block name" });
    }
    put_str16(out, &b.name, MAX_NAME_LEN, "block name")?;
    out.push(b.encoding.tag());
    out.push(b.dtype.code());
    out.extend_from_slice(&b.flags.to_le_bytes());
    let ndim: u8 = count(b.shape.len(), u64::from(MAX_NDIM), "ndim")?;
    out.push(ndim);
    for d in &b.shape {
        out.extend_from_slice(&d.to_le_bytes());
    }
    match &b.encoding {
        Encoding::Dense(p) => put_payload(out, p),
        Encoding::Spectral {
            rank,
            factor_dtype,
            quant,
            payload,
        } => {
            out.extend_from_slice(&rank.to_le_bytes());
            out.push(factor_dtype.code());
            out.push(match quant {
                Quant::None => 0,
                Quant::U8Affine => 1,
            });
            put_payload(out, payload);
        }
        Encoding::Alias { target } => out.extend_from_slice(&target.to_le_bytes()),
    }
    let n: u8 = count(
        b.columnar.len(),
        u64::from(MAX_DESCRIPTORS),
        "descriptors per block",
    )?;
    out.push(n);
    for d in &b.columnar {
        put_descriptor(out, d)?;
    }
    Ok(())
}

/// One columnar descriptor (section 3.4, version 3), appended to `out`.
fn put_descriptor(out: &mut Vec<u8>, d: &ColumnarDescriptor) -> Result<()> {
    out.push(d.dtype.code());
    out.extend_from_slice(&d.rows.to_le_bytes());
    out.extend_from_slice(&d.row_bytes.to_le_bytes());
    out.extend_from_slice(&d.byte_len.to_le_bytes());
    out.extend_from_slice(&d.sha256);
    put_str16(out, &d.object, MAX_NAME_LEN, "descriptor object")?;
    // version 3 (section 3.4): flags, proof_height, merkle_root
    let proof = d
        .proof
        .ok_or_else(|| Error::Writer(format!("row file {:?} has no row proof", d.object)))?;
    out.push(d.flags);
    out.push(proof.height);
    out.extend_from_slice(&proof.root);
    Ok(())
}

/// Serialises a header (docs/FORMAT.md section 3). Its length does not
/// depend on digests or offsets, only on names, shapes and counts.
pub(crate) fn encode_header(h: &Header) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    put_metadata(&mut out, &h.metadata)?;
    let n: u32 = count(h.blocks.len(), u64::from(MAX_BLOCKS), "block count")?;
    out.extend_from_slice(&n.to_le_bytes());
    for b in &h.blocks {
        put_block(&mut out, b)?;
    }
    if out.len() as u64 > MAX_HEADER_LEN {
        return Err(Error::HeaderTooLarge {
            len: out.len() as u64,
            max: MAX_HEADER_LEN,
        });
    }
    Ok(out)
}

pub(crate) fn encode_preamble(p: &Preamble) -> Vec<u8> {
    let mut out = Vec::with_capacity(PREAMBLE_LEN as usize);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&p.version.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&p.header_len.to_le_bytes());
    out.extend_from_slice(&p.data_offset.to_le_bytes());
    out.extend_from_slice(&p.file_len.to_le_bytes());
    out.extend_from_slice(&p.header_sha256);
    out
}

/// Chunks at least this large are hashed on a scoped thread while written.
const PARALLEL_HASH_MIN: usize = 1 << 20;

fn write_zeros(out: &mut impl Write, mut n: u64) -> Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let chunk = n.min(ZEROS.len() as u64);
        let len = usize::try_from(chunk).unwrap_or(ZEROS.len());
        out.write_all(ZEROS.get(..len).unwrap_or(&ZEROS))?;
        n = n.saturating_sub(chunk);
    }
    Ok(())
}

/// Writes a knot from streamed payloads, hashing each payload as it passes.
///
/// 1. [`KnotWriter::new`] takes the header with every payload length set
///    (offsets and digests are assigned here) and reserves its space.
/// 2. Each block with a payload, in table order, is written with
///    [`KnotWriter::write_payload`] (from a `Read`) or chunk by chunk with
///    [`KnotWriter::write_chunk`] and [`KnotWriter::end_payload`].
/// 3. Row file digests are set with [`KnotWriter::set_columnar_sha256`].
/// 4. [`KnotWriter::finish`] validates the result like a reader would,
///    writes preamble and header, and returns the sink.
///
/// Memory use is one chunk; the output is deterministic.
pub struct KnotWriter<W: Write + Seek> {
    out: W,
    header: Header,
    header_len: u64,
    data_offset: u64,
    pos: u64,
    /// Index of the next block expected to receive a payload.
    next: usize,
    current: Option<(usize, Sha256, u64)>,
}

impl<W: Write + Seek> KnotWriter<W> {
    /// Lays the knot out and reserves space for preamble and header.
    pub fn new(mut out: W, mut header: Header) -> Result<Self> {
        for p in header
            .blocks
            .iter_mut()
            .filter_map(|b| b.encoding.payload_mut())
        {
            p.sha256 = [0; 32];
        }
        let (header_len, data_offset, _) = lay_out(&mut header)?;
        out.seek(SeekFrom::Start(0))?;
        write_zeros(&mut out, data_offset)?;
        let mut w = KnotWriter {
            out,
            header,
            header_len,
            data_offset,
            pos: data_offset,
            next: 0,
            current: None,
        };
        w.skip_payloadless();
        Ok(w)
    }

    fn skip_payloadless(&mut self) {
        while self
            .header
            .blocks
            .get(self.next)
            .is_some_and(|b| b.encoding.payload().is_none())
        {
            self.next = self.next.saturating_add(1);
        }
    }

    /// The header as laid out (offsets assigned; digests filled as written).
    pub fn header(&self) -> &Header {
        &self.header
    }

    fn start(&mut self, index: usize) -> Result<()> {
        if let Some((cur, _, _)) = &self.current {
            if *cur == index {
                return Ok(());
            }
            return Err(Error::Writer(format!(
                "block {index} started while block {cur} is unfinished"
            )));
        }
        if index != self.next {
            let name = self.header.blocks.get(index).map(|b| b.name.as_str());
            return Err(Error::Writer(format!(
                "payload for block {index} ({name:?}) out of order: expected block {}",
                self.next
            )));
        }
        let block = self.header.blocks.get(index);
        let offset = block
            .and_then(|b| b.encoding.payload())
            .map(|p| p.offset)
            .ok_or_else(|| Error::Writer(format!("block {index} has no payload")))?;
        if block.is_some_and(Block::in_row_file) {
            // section 7e: hashed, not written (its row file holds it)
            self.current = Some((index, Sha256::new(), 0));
            return Ok(());
        }
        let pad = offset
            .checked_sub(self.pos)
            .ok_or_else(|| Error::Writer(format!("position {} past offset {offset}", self.pos)))?;
        write_zeros(&mut self.out, pad)?;
        self.pos = offset;
        self.current = Some((index, Sha256::new(), 0));
        Ok(())
    }

    /// Appends bytes to the payload of block `index` (which must be the next
    /// block with a payload, or the one in progress).
    pub fn write_chunk(&mut self, index: usize, bytes: &[u8]) -> Result<()> {
        self.start(index)?;
        let len = self
            .header
            .blocks
            .get(index)
            .and_then(|b| b.encoding.payload())
            .map_or(0, |p| p.len);
        let Some((_, hasher, written)) = self.current.as_mut() else {
            return Err(Error::Writer("no payload in progress".into()));
        };
        let new_written = written.saturating_add(bytes.len() as u64);
        if new_written > len {
            return Err(Error::Writer(format!(
                "block {index}: {new_written} bytes written, payload is {len}"
            )));
        }
        *written = new_written;
        if self
            .header
            .blocks
            .get(index)
            .is_some_and(Block::in_row_file)
        {
            hasher.update(bytes);
            return Ok(());
        }
        if bytes.len() >= PARALLEL_HASH_MIN {
            // Hash on a second thread while this one writes the same bytes:
            // on large payloads the two cost about the same.
            std::thread::scope(|s| {
                s.spawn(|| hasher.update(bytes));
                self.out.write_all(bytes)
            })?;
        } else {
            hasher.update(bytes);
            self.out.write_all(bytes)?;
        }
        self.pos = self.pos.saturating_add(bytes.len() as u64);
        Ok(())
    }

    /// Ends the payload of block `index`, checking its length. Returns its
    /// digest, which is also recorded for the block's row file in its own dtype.
    pub fn end_payload(&mut self, index: usize) -> Result<[u8; 32]> {
        self.start(index)?;
        let Some((_, hasher, written)) = self.current.take() else {
            return Err(Error::Writer("no payload in progress".into()));
        };
        let block = self
            .header
            .blocks
            .get_mut(index)
            .ok_or_else(|| Error::Writer(format!("no block {index}")))?;
        let name = block.name.clone();
        let p = block
            .encoding
            .payload_mut()
            .ok_or_else(|| Error::Writer(format!("block {name:?} has no payload")))?;
        if written != p.len {
            return Err(Error::Writer(format!(
                "block {name:?}: {written} bytes written, payload is {}",
                p.len
            )));
        }
        p.sha256 = hasher.finalize().into();
        let digest = p.sha256;
        // Section 7: the row file in the block's own dtype is the payload
        // (with an inline proof, its rows are: the caller sets its digest).
        let dtype = block.dtype;
        let plain = |d: &&mut ColumnarDescriptor| d.dtype == dtype && !d.inline_proof();
        for d in block.columnar.iter_mut().filter(plain) {
            d.sha256 = digest;
        }
        self.next = index.saturating_add(1);
        self.skip_payloadless();
        Ok(digest)
    }

    /// Streams the whole payload of block `index` from `src`.
    pub fn write_payload(&mut self, index: usize, mut src: impl Read) -> Result<[u8; 32]> {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = src.read(&mut buf)?;
            if n == 0 {
                break;
            }
            self.write_chunk(index, buf.get(..n).unwrap_or_default())?;
        }
        self.end_payload(index)
    }

    /// Metadata, for values only known once the payloads are written (such
    /// as source file digests). Their encoded size must not change:
    /// [`KnotWriter::finish`] refuses a header whose length changed.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.header.metadata
    }

    /// The descriptor of the row file of block `index` in `dtype`, for the
    /// values only known once it is written (digest, flags, Merkle root);
    /// they are fixed-size, so the header's length does not change.
    pub fn columnar_mut(&mut self, index: usize, dtype: DType) -> Result<&mut ColumnarDescriptor> {
        self.header
            .blocks
            .get_mut(index)
            .and_then(|b| b.columnar.iter_mut().find(|d| d.dtype == dtype))
            .ok_or_else(|| Error::Writer(format!("block {index} has no {dtype} row file")))
    }

    /// Records the digest of the row file of block `index` in `dtype`.
    pub fn set_columnar_sha256(
        &mut self,
        index: usize,
        dtype: DType,
        sha256: [u8; 32],
    ) -> Result<()> {
        self.columnar_mut(index, dtype)?.sha256 = sha256;
        Ok(())
    }

    /// Writes preamble and header after checking them as a reader would.
    pub fn finish(mut self) -> Result<(W, KnotHeader)> {
        if let Some(b) = self.header.blocks.get(self.next) {
            return Err(Error::Writer(format!(
                "block {:?} has no payload written",
                b.name
            )));
        }
        let header = encode_header(&self.header)?;
        if header.len() as u64 != self.header_len {
            return Err(Error::Writer("header length changed while writing".into()));
        }
        let mut preamble = Preamble {
            version: version_of(&self.header),
            header_len: self.header_len,
            data_offset: self.data_offset,
            file_len: self.pos.max(self.data_offset),
            header_sha256: [0; 32],
        };
        // A knot with no payload still has its padding up to data_offset.
        validate(&preamble, &self.header)?;
        let pre = encode_preamble(&preamble);
        preamble.header_sha256 = header_digest(&pre, &header);
        let pre = encode_preamble(&preamble);
        let mut head = pre;
        head.extend_from_slice(&header);
        let checked = match parse_prefix(&head)? {
            Prefix::Complete(h) => *h,
            Prefix::NeedBytes { .. } => {
                return Err(Error::Writer("encoded header does not parse".into()));
            }
        };
        self.out.seek(SeekFrom::Start(0))?;
        self.out.write_all(&head)?;
        self.out.seek(SeekFrom::Start(preamble.file_len))?;
        self.out.flush()?;
        Ok((self.out, checked))
    }
}

/// Sets every payload's canonical offset (docs/FORMAT.md section 4) from
/// the payload lengths. Returns `(header_len, data_offset, file_len)`.
fn lay_out(header: &mut Header) -> Result<(u64, u64, u64)> {
    // Section 3.4: a row file of the block's own dtype is the payload, so it
    // stands in for the block; the writer records that itself.
    for b in &mut header.blocks {
        let dtype = b.dtype;
        for d in b.columnar.iter_mut().filter(|d| d.dtype == dtype) {
            d.flags |= BLOCK_EXACT;
        }
    }
    let header_len = encode_header(header)?.len() as u64;
    let data_offset = PREAMBLE_LEN
        .checked_add(header_len)
        .and_then(align_up)
        .ok_or_else(|| Error::Writer("header too large".into()))?;
    let mut cursor = data_offset;
    for b in &mut header.blocks {
        let in_row_file = b.in_row_file();
        if let Some(p) = b.encoding.payload_mut() {
            if in_row_file {
                // section 7e: no place in the knot
                p.offset = 0;
                continue;
            }
            p.offset = align_up(cursor)
                .ok_or_else(|| Error::Writer(format!("offset of {} overflows", b.name)))?;
            cursor = p
                .offset
                .checked_add(p.len)
                .ok_or_else(|| Error::Writer(format!("length of {} overflows", b.name)))?;
        }
    }
    Ok((header_len, data_offset, cursor))
}

/// The version a knot of `header` is written as: 5 when a block is stored
/// in its row file or a row file has its proof inline (section 7e), else 4
/// when a block or a descriptor has a block type (section 3.5), else 3.
pub(crate) fn version_of(header: &Header) -> u32 {
    let one_copy = header
        .blocks
        .iter()
        .any(|b| b.in_row_file() || b.columnar.iter().any(|d| d.inline_proof()));
    let quantized = header
        .blocks
        .iter()
        .any(|b| b.dtype.is_quantized() || b.columnar.iter().any(|d| d.dtype.is_quantized()));
    if one_copy {
        VERSION_5
    } else if quantized {
        VERSION_4
    } else {
        VERSION
    }
}

/// The first `72 + header_len` bytes of the knot `header` describes (its
/// payloads laid out canonically from their lengths, digests as given),
/// and its `file_len`: a knot described without writing its payloads, for
/// tools and tests that serve or inspect headers.
pub fn encode_prefix(mut header: Header) -> Result<(Vec<u8>, u64)> {
    let (header_len, data_offset, cursor) = lay_out(&mut header)?;
    let mut preamble = Preamble {
        version: version_of(&header),
        header_len,
        data_offset,
        file_len: cursor,
        header_sha256: [0; 32],
    };
    validate(&preamble, &header)?;
    let head = encode_header(&header)?;
    let pre = encode_preamble(&preamble);
    preamble.header_sha256 = header_digest(&pre, &head);
    let mut out = encode_preamble(&preamble);
    out.extend_from_slice(&head);
    Ok((out, cursor))
}
