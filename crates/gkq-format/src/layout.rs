//! Constants of the byte layout (docs/FORMAT.md sections 2 and 8).

/// The eight magic bytes that open every knot: `"GKQKNOT\0"`.
pub const MAGIC: [u8; 8] = *b"GKQKNOT\0";
/// The version this crate writes (layout revision 3: descriptors carry
/// exactness flags and a row proof).
pub const VERSION: u32 = 3;
/// The first release's version, still read (docs/FORMAT.md section 9a).
pub const VERSION_2: u32 = 2;
/// Layout revision 4: revision 3 plus the block-quantized dtypes (section
/// 3.5). Writers write it exactly when a block or a descriptor has one, so
/// a reader of version 3 refuses such a knot by its version.
pub const VERSION_4: u32 = 4;
/// Layout revision 5: revision 4 plus a block stored once, in its row
/// file, with each row's proof record inline (section 7e). Writers write
/// it exactly when a block has `IN_ROW_FILE` or a descriptor `INLINE_PROOF`.
pub const VERSION_5: u32 = 5;
/// Length of the fixed preamble.
pub const PREAMBLE_LEN: u64 = 72;
/// Alignment of every payload and of the payload region.
pub const ALIGN: u64 = 4096;

/// Largest header a parser accepts.
pub const MAX_HEADER_LEN: u64 = 16 * 1024 * 1024;
/// Most metadata entries.
pub const MAX_METADATA_ENTRIES: u32 = 4096;
/// Longest metadata key.
pub const MAX_KEY_LEN: usize = 256;
/// Longest `STR` value.
pub const MAX_STRING_LEN: usize = 65_536;
/// Most items of a `STR_LIST`.
pub const MAX_LIST_LEN: u32 = 65_536;
/// Most blocks.
pub const MAX_BLOCKS: u32 = 65_536;
/// Longest block name (and the most bytes a reader reads for an object name).
pub const MAX_NAME_LEN: usize = 1024;
/// Longest object name (row file or companion file): 255, the most a file
/// system allows a name, less the 6 bytes of `.proof` (section 3.4).
pub const MAX_OBJECT_NAME_LEN: usize = 249;
/// Most dimensions of a shape.
pub const MAX_NDIM: u8 = 8;
/// Most columnar descriptors per block.
pub const MAX_DESCRIPTORS: u8 = 8;
/// Largest spectral rank.
pub const MAX_RANK: u32 = 65_536;

/// The first read of a knot when nothing says how long its header is:
/// 32 KiB, which holds most headers (a node's cache then remembers the
/// length a package needs).
pub const FIRST_READ: u64 = 32 << 10;
/// The largest companion file (`package.files`) a reader holds or copies:
/// the knot records its digest, not its length.
pub const MAX_COMPANION: u64 = 1 << 30;
/// Bytes an object is copied in per step (each step in parallel parts), so
/// that a copy holds one step in memory whatever the object's length.
pub const COPY_STEP: u64 = 64 << 20;

/// `align_up(x, ALIGN)`, or `None` on overflow.
pub fn align_up(x: u64) -> Option<u64> {
    x.checked_next_multiple_of(ALIGN)
}

/// Parses a canonical decimal row number: `0`, or digits without a leading zero.
pub(crate) fn row_number(s: &str) -> Option<u64> {
    let canonical = s == "0" || (!s.starts_with('0') && !s.is_empty());
    if !canonical || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Section 3.4's object-name rule: `[A-Za-z0-9._-]`, not starting with
/// `.`, at most [`MAX_OBJECT_NAME_LEN`] bytes (so `NAME.proof` still fits
/// in the 255 bytes a file system allows a name).
pub(crate) fn valid_object_name(s: &str) -> std::result::Result<(), &'static str> {
    if s.is_empty() {
        return Err("empty");
    }
    if s.len() > MAX_OBJECT_NAME_LEN {
        return Err("longer than 249 bytes (NAME.proof must fit in a 255-byte file name)");
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
