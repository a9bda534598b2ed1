//! A validated knot: its header alone, or the whole file borrowed.

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::layout::*;
use crate::model::*;
use crate::parse::{decode_header, header_digest, parse_preamble};
use crate::validate::validate;

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

    /// The knot id (`header_sha256`, section 2).
    pub fn id(&self) -> crate::KnotId {
        crate::KnotId::from_digest(self.preamble().header_sha256)
    }

    /// `72 + header_len`: the bytes a remote reader fetched.
    pub fn header_end(&self) -> u64 {
        // validated: header_len <= MAX_HEADER_LEN
        PREAMBLE_LEN.saturating_add(self.preamble.header_len)
    }

    /// Byte range `[offset, offset + len)` of the payload holding block
    /// `index` (following an alias); `None` when the knot does not hold it
    /// (an alias of nothing, or a block stored in its row file:
    /// [`KnotHeader::home_of`]).
    pub fn payload_of(&self, index: usize) -> Option<Payload> {
        let b = self.header.resolve(index)?;
        if b.in_row_file() {
            return None;
        }
        b.encoding.payload().copied()
    }

    /// The bytes of block `index`'s payload (following an alias), wherever
    /// it is stored; 0 for none.
    pub fn payload_len(&self, index: usize) -> u64 {
        let b = self.header.resolve(index);
        b.and_then(|b| b.encoding.payload()).map_or(0, |p| p.len)
    }

    /// For a block (following an alias) stored in its row file (section
    /// 7e): its payload's length and digest (its offset is 0), and its
    /// home, the descriptor of that row file.
    pub fn home_of(&self, index: usize) -> Option<(Payload, &ColumnarDescriptor)> {
        let b = self.header.resolve(index)?;
        if !b.in_row_file() {
            return None;
        }
        Some((*b.encoding.payload()?, b.home()?))
    }
}

/// The rows of a whole row file of `stride` bytes a row (section 7e: the
/// record after each row dropped), one after the other: the payload of a
/// block stored in it. In place: the rows move down over the records and
/// the rest is given back (no second buffer the size of the file).
pub fn into_rows(mut file: Vec<u8>, row_bytes: u64, stride: u64) -> Vec<u8> {
    let (Ok(row), Ok(stride)) = (usize::try_from(row_bytes), usize::try_from(stride)) else {
        return Vec::new();
    };
    if stride <= row {
        return file;
    }
    let rows = file.len().checked_div(stride).unwrap_or(0);
    for i in 0..rows {
        let (from, to) = (i.saturating_mul(stride), i.saturating_mul(row));
        file.copy_within(from..from.saturating_add(row), to);
    }
    file.truncate(rows.saturating_mul(row));
    file.shrink_to_fit();
    file
}

/// The rows of a row file of `stride` bytes a row (section 7e), taken from
/// the file's bytes in order, piece by piece, as they are read: what
/// [`into_rows`] gives of the whole file, without the file ever held whole
/// (the peak is the rows and one piece, not the rows and their records).
#[derive(Debug)]
pub struct RowsOf {
    row: usize,
    stride: usize,
    /// Where the next byte falls within its row and record.
    at: usize,
    /// The rows' bytes the file holds (its whole rows).
    want: usize,
    rows: Vec<u8>,
}

impl RowsOf {
    /// Ready for a file of `file_len` bytes, `row_bytes` of each `stride`
    /// a row (the room for its rows is reserved, not touched). The room is
    /// taken from `file_len` as given: a caller bounds it first (the
    /// reader refuses a file over its store's read cap before calling).
    pub fn new(file_len: u64, row_bytes: u64, stride: u64) -> RowsOf {
        let as_usize = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let row = as_usize(row_bytes);
        let stride = as_usize(stride).max(row).max(1);
        let want = as_usize(file_len)
            .checked_div(stride)
            .unwrap_or(0)
            .saturating_mul(row);
        RowsOf {
            row,
            stride,
            at: 0,
            want,
            rows: Vec::with_capacity(want),
        }
    }

    /// The file's next bytes.
    pub fn push(&mut self, mut piece: &[u8]) {
        while !piece.is_empty() {
            let in_row = self.at < self.row;
            let end = if in_row { self.row } else { self.stride };
            let n = end.saturating_sub(self.at).clamp(1, piece.len());
            let Some((now, rest)) = piece.split_at_checked(n) else {
                return;
            };
            if in_row {
                self.rows.extend_from_slice(now);
            }
            self.at = self
                .at
                .saturating_add(n)
                .checked_rem(self.stride)
                .unwrap_or(0);
            piece = rest;
        }
    }

    /// The rows, one after the other (a trailing part of a row dropped, as
    /// [`into_rows`] drops it).
    pub fn finish(mut self) -> Vec<u8> {
        self.rows.truncate(self.want);
        self.rows
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
    let preamble = match prefix_id(prefix)? {
        Err(total) => return Ok(Prefix::NeedBytes { total }),
        Ok(_) => parse_preamble(prefix)?,
    };
    let header_bytes = prefix
        .get(PREAMBLE_LEN as usize..PREAMBLE_LEN.saturating_add(preamble.header_len) as usize)
        .unwrap_or_default();
    let header = decode_header(header_bytes, preamble.version)?;
    validate(&preamble, &header)?;
    Ok(Prefix::Complete(Box::new(KnotHeader { preamble, header })))
}

/// The knot id of a prefix, from the preamble and the header checksum
/// alone (no header field is decoded): `Ok(Err(total))` when the prefix is
/// shorter than `total`, the bytes the checksum covers. What a node checks
/// a signature against before it decodes anything else (section 7c).
pub fn prefix_id(prefix: &[u8]) -> Result<Result<crate::KnotId, u64>> {
    if (prefix.len() as u64) < PREAMBLE_LEN {
        return Ok(Err(PREAMBLE_LEN));
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
        return Ok(Err(total));
    };
    let computed = header_digest(prefix, header_bytes);
    if computed != preamble.header_sha256 {
        return Err(Error::HeaderChecksum {
            stored: crate::hex(&preamble.header_sha256),
            computed: crate::hex(&computed),
        });
    }
    Ok(Ok(crate::KnotId::from_digest(computed)))
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
            if b.in_row_file() {
                continue;
            }
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
