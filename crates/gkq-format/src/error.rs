/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can be wrong with a knot, one variant per rule of
/// docs/FORMAT.md section 9, plus the writer's own failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Fewer bytes than the structure needs.
    #[error("knot truncated: need {needed} bytes, have {available}")]
    Truncated {
        /// Bytes needed.
        needed: u64,
        /// Bytes available.
        available: u64,
    },
    /// The first eight bytes are not `GKQKNOT\0`.
    #[error("not a GKQ knot: {}", what_it_is(found))]
    BadMagic {
        /// What was found.
        found: [u8; 8],
    },
    /// A version other than 2, 3 and 4.
    #[error("unsupported knot version {found} (this reader reads versions 2 to 5)")]
    UnsupportedVersion {
        /// The version read.
        found: u32,
    },
    /// `header_len` over the limit.
    #[error("header of {len} bytes exceeds the limit of {max}")]
    HeaderTooLarge {
        /// Declared length.
        len: u64,
        /// Limit.
        max: u64,
    },
    /// `data_offset` is not where the spec puts it.
    #[error("data_offset is {found}, expected {expected}")]
    BadDataOffset {
        /// Read.
        found: u64,
        /// Required.
        expected: u64,
    },
    /// The header digest does not match.
    #[error("header checksum mismatch: stored {stored}, computed {computed}")]
    HeaderChecksum {
        /// Hex of the stored digest.
        stored: String,
        /// Hex of the computed digest.
        computed: String,
    },
    /// A field extends past the end of the header.
    #[error("header ends inside {what} at header offset {offset} (need {needed} more bytes)")]
    HeaderEof {
        /// The field being read.
        what: &'static str,
        /// Offset within the header.
        offset: u64,
        /// Missing bytes.
        needed: u64,
    },
    /// Bytes left over after the block table.
    #[error("{extra} unexpected bytes after the block table")]
    HeaderTrailingBytes {
        /// How many.
        extra: u64,
    },
    /// A GGUF file whose header is not one (magic, version, counts,
    /// truncation).
    #[error("GGUF header, byte {at}: {reason}")]
    Gguf {
        /// Where in the file.
        at: u64,
        /// What is wrong.
        reason: String,
    },
    /// A GGUF metadata key whose value cannot be read.
    #[error("GGUF metadata key {key:?}: {reason}")]
    GgufKey {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A GGUF tensor info or tensor data that cannot be used.
    #[error("GGUF tensor {tensor:?}: {reason}")]
    GgufTensor {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A signature object (section 7c) that does not sign this package
    /// with a trusted key, or a key that cannot be one.
    #[error("{0}")]
    Signature(crate::sig::SigFailure),
    /// A block type (section 3.5) in a knot of a version before 4.
    #[error("block {block:?}: dtype {dtype} needs knot version 4, this knot is version {version}")]
    DtypeVersion {
        /// The block.
        block: String,
        /// The dtype.
        dtype: crate::DType,
        /// The knot's version.
        version: u32,
    },
    /// A block-type tensor whose last dimension is not a whole number of
    /// blocks (section 3.5).
    #[error(
        "block {block:?}: its last dimension ({cols}) is not a whole number of {dtype} blocks of {per} values"
    )]
    BlockShape {
        /// The block.
        block: String,
        /// Its dtype.
        dtype: crate::DType,
        /// The last dimension.
        cols: u64,
        /// Values per block.
        per: u64,
    },
    /// A knot id (`--knot-id`, a pin) that is not 64 hex digits.
    #[error("{given} is not a knot id: {reason}")]
    BadKnotId {
        /// What was given, quoted (cut short).
        given: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A limit of section 8 exceeded.
    #[error("{what} is {value}, over the limit of {max}")]
    LimitExceeded {
        /// Which limit.
        what: &'static str,
        /// Value read.
        value: u64,
        /// Limit.
        max: u64,
    },
    /// A string is not UTF-8.
    #[error("{what} at header offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which string.
        what: &'static str,
        /// Offset within the header.
        offset: u64,
    },
    /// An empty key, block name or object name.
    #[error("empty {what}")]
    EmptyName {
        /// Which name.
        what: &'static str,
    },
    /// Metadata keys not strictly ascending.
    #[error("metadata key {key:?} is not after {previous:?} (keys must be strictly ascending)")]
    MetadataOrder {
        /// Offending key.
        key: String,
        /// Key before it.
        previous: String,
    },
    /// Unknown metadata value type.
    #[error("metadata key {key:?} has unknown value type {tag}")]
    UnknownValueType {
        /// Key.
        key: String,
        /// Tag read.
        tag: u8,
    },
    /// A bool byte other than 0 or 1.
    #[error("metadata key {key:?} has bool byte {value} (must be 0 or 1)")]
    NonCanonicalBool {
        /// Key.
        key: String,
        /// Byte read.
        value: u8,
    },
    /// A well-known key with the wrong type.
    #[error("metadata key {key:?} must be {expected}, found {found}")]
    MetadataType {
        /// Key.
        key: String,
        /// Required type.
        expected: &'static str,
        /// Type found.
        found: &'static str,
    },
    /// `source.files` and `source.sha256` differ in length.
    #[error("source.files has {files} entries but source.sha256 has {hashes}")]
    SourceListMismatch {
        /// Files.
        files: usize,
        /// Hashes.
        hashes: usize,
    },
    /// One of `source.files`/`source.sha256` (or `package.files`/`package.sha256`) without the other.
    #[error("metadata has {present} but not {missing} (the two go together)")]
    ListIncomplete {
        /// The key present.
        present: &'static str,
        /// The key missing.
        missing: &'static str,
    },
    /// `package.files` and `package.sha256` differ in length.
    #[error("package.files has {files} entries but package.sha256 has {hashes}")]
    PackageListMismatch {
        /// Files.
        files: usize,
        /// Hashes.
        hashes: usize,
    },
    /// A companion file name that breaks a rule of section 3.1.
    #[error("package file {name:?}: {reason}")]
    BadPackageFile {
        /// The name.
        name: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A `role.*` key names no block.
    #[error("metadata {role} names block {name:?}, which is not in the knot")]
    UnknownRoleBlock {
        /// The role key.
        role: String,
        /// The name.
        name: String,
    },
    /// Two blocks with one name.
    #[error("duplicate block name {name:?}")]
    DuplicateBlockName {
        /// Name.
        name: String,
    },
    /// Unknown encoding tag.
    #[error("block {block:?} has unknown encoding {tag}")]
    UnknownEncoding {
        /// Block name.
        block: String,
        /// Tag read.
        tag: u8,
    },
    /// Unknown dtype code.
    #[error("block {block:?} has unknown dtype code {code}")]
    UnknownDtype {
        /// Block name.
        block: String,
        /// Code read.
        code: u8,
    },
    /// Shape byte size overflows u64.
    #[error("block {block:?}: shape {shape:?} overflows")]
    ShapeOverflow {
        /// Block name.
        block: String,
        /// Shape.
        shape: Vec<u64>,
    },
    /// Payload length disagrees with the shape.
    #[error("block {block:?}: payload is {found} bytes, shape and dtype need {expected}")]
    PayloadLength {
        /// Block name.
        block: String,
        /// Required.
        expected: u64,
        /// Stored.
        found: u64,
    },
    /// Payload not at its canonical offset (overlap, hole, or misplacement).
    #[error("block {block:?}: payload at offset {found}, expected {expected} (payloads must be packed in table order, {align}-aligned)", align = crate::layout::ALIGN)]
    PayloadOffset {
        /// Block name.
        block: String,
        /// Required offset.
        expected: u64,
        /// Stored offset.
        found: u64,
    },
    /// The preamble's `file_len` field disagrees with the end of the last payload.
    #[error("the preamble's file_len field is {found}, but the payloads end at {expected}")]
    FileLength {
        /// End of the last payload (or `data_offset` when there is none).
        expected: u64,
        /// The `file_len` field.
        found: u64,
    },
    /// The bytes given are not as long as the preamble's `file_len` says.
    #[error("the file is {actual} bytes long, but its preamble declares file_len {file_len}")]
    FileSize {
        /// The `file_len` field.
        file_len: u64,
        /// Bytes actually given.
        actual: u64,
    },
    /// The file ends before `72 + header_len`.
    #[error(
        "the file is {available} bytes long, but its header ends at byte {header_end} (72 + header_len)"
    )]
    HeaderTruncated {
        /// `72 + header_len`.
        header_end: u64,
        /// Bytes given.
        available: u64,
    },
    /// A payload does not hash to its recorded digest.
    #[error(
        "block {block:?}: payload sha256 is {computed}, the header records {stored} (bytes {offset}..{end} of the knot)"
    )]
    PayloadDigest {
        /// Block name.
        block: String,
        /// Hex of the recorded digest.
        stored: String,
        /// Hex of the computed digest.
        computed: String,
        /// Absolute offset of the payload.
        offset: u64,
        /// End (exclusive) of the payload.
        end: u64,
    },
    /// A row file's length is not the descriptor's `byte_len`.
    #[error("row file {object:?}: {found} bytes, expected {expected} ({rows} rows x {row_bytes} bytes){}", if found < expected { ": truncated" } else { "" })]
    RowFileLength {
        /// Object name.
        object: String,
        /// Descriptor `byte_len`.
        expected: u64,
        /// Length found.
        found: u64,
        /// Descriptor `rows`.
        rows: u64,
        /// Descriptor `row_bytes`.
        row_bytes: u64,
    },
    /// A runs object (section 7b) whose length is not `rows × stride`.
    #[error(
        "runs object {object:?} is {found} bytes, expected {expected} ({rows} rows × {stride}-byte strides of row and record)"
    )]
    RunsLength {
        /// The runs object's name.
        object: String,
        /// `rows × stride`.
        expected: u64,
        /// Length found.
        found: u64,
        /// Descriptor `rows`.
        rows: u64,
        /// `row_bytes + 32·h`.
        stride: u64,
    },
    /// A warm object (section 7d) whose length is not
    /// `32 × chunks + K × stride`.
    #[error(
        "warm object {object:?} is {found} bytes, expected {expected} (the chunk table and one row and record per warm row)"
    )]
    WarmLength {
        /// The warm object's name.
        object: String,
        /// `32 × chunks + K × stride`.
        expected: u64,
        /// Length found.
        found: u64,
    },
    /// A row file does not hash to the descriptor's digest.
    #[error("row file {object:?}: sha256 is {computed}, the knot records {stored}")]
    RowFileDigest {
        /// Object name.
        object: String,
        /// Hex of the recorded digest.
        stored: String,
        /// Hex of the computed digest.
        computed: String,
    },
    /// Rows of a row file differ from the block cast as section 7 says.
    #[error(
        "row file {object:?}: {count} rows differ from block {block:?} cast to {dtype}, the first is row {first_row}"
    )]
    RowMismatch {
        /// Object name.
        object: String,
        /// Block name.
        block: String,
        /// Descriptor dtype.
        dtype: crate::DType,
        /// How many rows differ.
        count: u64,
        /// The first differing row.
        first_row: u64,
    },
    /// A proof object's chunk table is wrong (section 7a).
    #[error("proof object {object:?}: {reason}")]
    ProofTable {
        /// Proof object name.
        object: String,
        /// What is wrong.
        reason: String,
    },
    /// A row does not verify against the row proof (section 7a).
    #[error("row file {object:?}: row {row} fails its Merkle proof: {reason}")]
    RowProof {
        /// Row file object name.
        object: String,
        /// Row index.
        row: u64,
        /// What is wrong.
        reason: String,
    },
    /// A whole proof object that is not the one computed from its row file
    /// (section 7a, rule 16).
    #[error(
        "proof object {object:?} differs from the one computed from the rows at byte {at} (RowProof)"
    )]
    ProofObject {
        /// Proof object name.
        object: String,
        /// The first byte that differs.
        at: u64,
    },
    /// A row file, proof object or companion file the knot names is absent
    /// (rule 17).
    #[error("{what} {object:?} named by the knot is missing (ObjectMissing)")]
    ObjectMissing {
        /// `row file`, `proof object` or `companion file`.
        what: &'static str,
        /// Its name.
        object: String,
    },
    /// A companion file whose SHA-256 is not its `package.sha256` entry (rule 17).
    #[error(
        "companion file {name:?}: sha256 is {computed}, package.sha256 records {stored} (CompanionDigest)"
    )]
    CompanionDigest {
        /// Its name.
        name: String,
        /// Hex of the recorded digest.
        stored: String,
        /// Hex of the computed digest.
        computed: String,
    },
    /// A recorded figure (of a spectral or a quantized block) that a
    /// verifier with the source measures otherwise, beyond the tolerance
    /// (rule 17).
    #[error(
        "{} block {block:?}: {what} against the source is {measured:.6e}, the knot records {recorded} in {key} (tolerance {tolerance:e} relative; FigureMismatch)",
        if key.starts_with("quant.") { "quantized" } else { "spectral" }
    )]
    FigureMismatch {
        /// The block.
        block: String,
        /// The key (`spectral.rel_frobenius_error`, `spectral.energy_kept`,
        /// `quant.rmse`, `quant.max_abs_error`).
        key: &'static str,
        /// What the figure is.
        what: &'static str,
        /// The recorded figure.
        recorded: f64,
        /// The measured figure.
        measured: f64,
        /// The relative tolerance.
        tolerance: f64,
    },
    /// A claimed exactness flag does not hold (section 3.4).
    #[error("row file {object:?}: flag {flag} is set but {reason}")]
    ExactnessClaim {
        /// Row file object name.
        object: String,
        /// `SOURCE_EXACT` or `BLOCK_EXACT`.
        flag: &'static str,
        /// The first counterexample.
        reason: String,
    },
    /// Padding that is not zero.
    #[error("non-zero padding byte at offset {offset}")]
    NonZeroPadding {
        /// Absolute offset.
        offset: u64,
    },
    /// An alias that breaks a rule.
    #[error("alias block {block:?}: {reason}")]
    BadAlias {
        /// Block name.
        block: String,
        /// What is wrong.
        reason: String,
    },
    /// A spectral block that breaks a rule.
    #[error("spectral block {block:?}: {reason}")]
    BadSpectral {
        /// Block name.
        block: String,
        /// What is wrong.
        reason: String,
    },
    /// The `spectral.*` metadata lists break a rule (docs/FORMAT.md 3.1).
    #[error("metadata {key}: {reason}")]
    SpectralMetadata {
        /// The key at fault.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The `quant.*` metadata lists break a rule (docs/FORMAT.md 3.1).
    #[error("metadata {key}: {reason}")]
    QuantMetadata {
        /// The key at fault.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// `columnar.runs` breaks a rule (docs/FORMAT.md 7b).
    #[error("metadata columnar.runs: {0}")]
    RunsMetadata(String),
    /// `columnar.warm` or `columnar.warm_rows` breaks a rule (docs/FORMAT.md 7d).
    #[error("metadata {0}")]
    WarmMetadata(String),
    /// Descriptors where none are allowed, or none where one is required.
    #[error("block {block:?}: {reason}")]
    DescriptorPlacement {
        /// Block name.
        block: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A descriptor field that disagrees with its block.
    #[error("block {block:?}, row file {object:?}: {field} is {found}, expected {expected}")]
    DescriptorField {
        /// Block name.
        block: String,
        /// Object name.
        object: String,
        /// Field.
        field: &'static str,
        /// Required.
        expected: String,
        /// Found.
        found: String,
    },
    /// A bad or duplicate object name.
    #[error("block {block:?}: bad row file name {object:?}: {reason}")]
    BadObjectName {
        /// Block name.
        block: String,
        /// Object name.
        object: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The writer was handed a block out of order or with the wrong length.
    #[error("writer: {0}")]
    Writer(String),
    /// I/O from the writer's sink or a payload stream.
    #[error("I/O error while writing the knot: {0}")]
    Io(#[from] std::io::Error),
}

/// An error and its causes on one line, `what: why: root cause`, the way
/// every tool prints them. A cause whose text the line already holds is
/// not repeated: errors that write their cause into their own message and
/// also return it from `source()` read once, like those that only return
/// it.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cur = e.source();
    while let Some(cause) = cur {
        let text = cause.to_string();
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cur = cause.source();
    }
    line
}

/// The innermost cause of an error: the part that says what happened
/// (`Connection refused (os error 111)`), without the wrappers around it.
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// What a file that is not a knot looks like it is, from its first bytes.
fn what_it_is(found: &[u8; 8]) -> String {
    let shown = format!("magic bytes are {found:02x?}");
    if found.starts_with(b"GGUF") {
        format!(
            "it is a GGUF file ({shown}, \"GGUF\"): pack it first (gkq-pack MODEL.gguf --out DIR), then give DIR or DIR/model.knot"
        )
    } else if found.starts_with(b"<") {
        format!(
            "it starts as an HTML page does ({shown}): is the URL a server's error or index page?"
        )
    } else {
        shown
    }
}

#[cfg(test)]
mod chain_tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Both(#[source] std::io::Error);

    #[test]
    fn causes_follow_once() {
        let io = || std::io::Error::other("disk on fire");
        assert_eq!(error_chain(&Outer(io())), "outer: disk on fire");
        // a cause already in the message is not repeated
        assert_eq!(error_chain(&Both(io())), "outer: disk on fire");
    }
}
