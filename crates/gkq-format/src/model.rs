use std::collections::BTreeMap;

use crate::dtype::DType;
use crate::layout::row_number;

/// Block flag bit 0: the block may be served from a columnar row file.
pub const COLUMNAR_ELIGIBLE: u32 = 1;
/// Block flag bit 1 (version 5): the payload is in a row file (FORMAT.md 7e).
pub const IN_ROW_FILE: u32 = 2;

/// Well-known metadata keys (docs/FORMAT.md section 3.1).
pub mod keys {
    /// `STR`: producing tool and version.
    pub const TOOL: &str = "gkq.tool";
    /// `STR`: `architectures[0]` of the source config.
    pub const ARCHITECTURE: &str = "model.architecture";
    /// `STR`: `model_type` of the source config.
    pub const MODEL_TYPE: &str = "model.type";
    /// `U64`: rows of the token embedding.
    pub const VOCAB_SIZE: &str = "model.vocab_size";
    /// `U64`: columns of the token embedding.
    pub const HIDDEN_SIZE: &str = "model.hidden_size";
    /// `BOOL`: lm_head is the token embedding.
    pub const TIE_WORD_EMBEDDINGS: &str = "model.tie_word_embeddings";
    /// `STR`: block name of the token embedding.
    pub const ROLE_TOKEN_EMBD: &str = "role.token_embd";
    /// `STR`: block name of the lm_head.
    pub const ROLE_LM_HEAD: &str = "role.lm_head";
    /// `STR`: source model id.
    pub const SOURCE_MODEL_ID: &str = "source.model_id";
    /// `STR`: source revision.
    pub const SOURCE_REVISION: &str = "source.revision";
    /// `STR_LIST`: source file names.
    pub const SOURCE_FILES: &str = "source.files";
    /// `STR_LIST`: hex sha256 of each source file.
    pub const SOURCE_SHA256: &str = "source.sha256";
    /// `STR_LIST`: companion files of the package (config.json, tokenizer
    /// files, ...), next to the knot, in byte order.
    pub const PACKAGE_FILES: &str = "package.files";
    /// `STR_LIST`: hex sha256 of each file in `package.files`.
    pub const PACKAGE_SHA256: &str = "package.sha256";
    /// `STR_LIST`: the spectral blocks whose figures follow, in table order.
    pub const SPECTRAL_BLOCKS: &str = "spectral.blocks";
    /// `STR_LIST`: per block of `spectral.blocks`, the relative Frobenius
    /// error of its reconstruction against the source tensor, as a decimal.
    pub const SPECTRAL_REL_ERROR: &str = "spectral.rel_frobenius_error";
    /// `STR_LIST`: per block of `spectral.blocks`, the share of the source
    /// tensor's energy (Σσ²) its rank keeps, as a decimal in [0, 1].
    pub const SPECTRAL_ENERGY: &str = "spectral.energy_kept";
    /// `STR_LIST`: row files (descriptor objects, strictly ascending) that
    /// have a runs object `<object>.runs` next to them (FORMAT.md 7b).
    pub const COLUMNAR_RUNS: &str = "columnar.runs";
    /// `STR_LIST`: row files (descriptor objects, strictly ascending) that
    /// have a warm object `<object>.warm` next to them (FORMAT.md 7d).
    pub const COLUMNAR_WARM: &str = "columnar.warm";
    /// `STR_LIST`: the warm rows of every warm object, canonical decimals,
    /// strictly ascending (FORMAT.md 7d).
    pub const COLUMNAR_WARM_ROWS: &str = "columnar.warm_rows";
    /// `STR_LIST`: the quantized blocks (section 3.5) whose figures
    /// follow, in table order.
    pub const QUANT_BLOCKS: &str = "quant.blocks";
    /// `STR_LIST`: per block of `quant.blocks`, the root mean square of the
    /// difference between its dequantized values and the source tensor's,
    /// as a decimal.
    pub const QUANT_RMSE: &str = "quant.rmse";
    /// `STR_LIST`: per block of `quant.blocks`, the largest absolute
    /// difference between its dequantized values and the source tensor's.
    pub const QUANT_MAX_ABS_ERROR: &str = "quant.max_abs_error";
    /// Prefix of the role keys: every `role.*` key is a `STR` naming a block.
    pub const ROLE_PREFIX: &str = "role.";
}

/// A typed metadata value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// Type 1.
    U64(u64),
    /// Type 2.
    Bool(bool),
    /// Type 3.
    Str(String),
    /// Type 4.
    StrList(Vec<String>),
}

impl Value {
    pub(crate) fn tag(&self) -> u8 {
        match self {
            Value::U64(_) => 1,
            Value::Bool(_) => 2,
            Value::Str(_) => 3,
            Value::StrList(_) => 4,
        }
    }

    pub(crate) fn type_name(tag: u8) -> &'static str {
        match tag {
            1 => "U64",
            2 => "BOOL",
            3 => "STR",
            4 => "STR_LIST",
            _ => "unknown",
        }
    }
}

/// Metadata entries, kept sorted by key (the on-disk order).
pub type Metadata = BTreeMap<String, Value>;

/// Where a block's payload lives in the knot, and its digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Payload {
    /// Absolute offset in the knot.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// SHA-256 of the payload bytes.
    pub sha256: [u8; 32],
}

/// What the writer recorded about one spectral block (docs/FORMAT.md 3.1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpectralFigure<'a> {
    /// Block name.
    pub block: &'a str,
    /// `||W - W_hat||_F / ||W||_F` against the source tensor.
    pub rel_frobenius_error: f64,
    /// `Σ_{i<K} σ_i² / Σ σ_i²` of the source tensor.
    pub energy_kept: f64,
}

/// What the writer recorded about one quantized block (docs/FORMAT.md 3.5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantFigure<'a> {
    /// Block name.
    pub block: &'a str,
    /// Root mean square of source − dequantized.
    pub rmse: f64,
    /// Largest |source − dequantized|.
    pub max_abs_error: f64,
}

/// Quantisation of spectral factors (docs/FORMAT.md section 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    /// Factors stored in `factor_dtype`.
    None,
    /// Factors stored as u8 with per-row f32 scale and zero.
    U8Affine,
}

/// How a block stores its tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// The tensor's bytes, row-major.
    Dense(Payload),
    /// Rank-K factors.
    Spectral {
        /// K.
        rank: u32,
        /// Dtype of U and Vt.
        factor_dtype: DType,
        /// Quantisation of U and Vt.
        quant: Quant,
        /// The factors.
        payload: Payload,
    },
    /// The same tensor as block `target` (a tied lm_head).
    Alias {
        /// Index of a dense or spectral block.
        target: u32,
    },
}

impl Encoding {
    /// The payload, if the block has one.
    pub fn payload(&self) -> Option<&Payload> {
        match self {
            Encoding::Dense(p) | Encoding::Spectral { payload: p, .. } => Some(p),
            Encoding::Alias { .. } => None,
        }
    }

    pub(crate) fn payload_mut(&mut self) -> Option<&mut Payload> {
        match self {
            Encoding::Dense(p) | Encoding::Spectral { payload: p, .. } => Some(p),
            Encoding::Alias { .. } => None,
        }
    }

    pub(crate) fn tag(&self) -> u8 {
        match self {
            Encoding::Dense(_) => 0,
            Encoding::Spectral { .. } => 1,
            Encoding::Alias { .. } => 2,
        }
    }
}

/// A columnar row file of a block (docs/FORMAT.md section 3.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnarDescriptor {
    /// Dtype of the rows in the file.
    pub dtype: DType,
    /// Number of rows (the vocabulary size).
    pub rows: u64,
    /// Bytes per row.
    pub row_bytes: u64,
    /// `rows * row_bytes`: the Content-Length a server must report.
    pub byte_len: u64,
    /// SHA-256 of the whole file.
    pub sha256: [u8; 32],
    /// File name relative to the knot.
    pub object: String,
    /// Exactness flags ([`SOURCE_EXACT`], [`BLOCK_EXACT`]; version 3).
    pub flags: u8,
    /// The Merkle root of the rows and the proof height (version 3); `None`
    /// in a version 2 knot, whose rows cannot be verified one by one.
    pub proof: Option<RowProof>,
}

/// Descriptor flag: every value of the row file equals the source tensor's
/// value (converting it back to the source dtype gives the source bits).
pub const SOURCE_EXACT: u8 = 1;
/// Descriptor flag: converting the row file's values to the block's dtype
/// gives the block's payload bit for bit, so a node may use these rows in
/// place of the block's.
pub const BLOCK_EXACT: u8 = 2;
/// Descriptor flag (version 5): each row is followed by its record (7e).
pub const INLINE_PROOF: u8 = 4;

/// The row proof of a row file (docs/FORMAT.md section 7a).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowProof {
    /// A chunk of the proof object holds `2^height` rows.
    pub height: u8,
    /// RFC 9162 Merkle tree hash over the rows (leaf = one row).
    pub root: [u8; 32],
}

impl ColumnarDescriptor {
    /// A descriptor for a `[rows, cols]` tensor in `dtype`, with a zero digest
    /// (the writer fills it in), or `None` if the sizes overflow.
    pub fn for_shape(rows: u64, cols: u64, dtype: DType, object: String) -> Option<Self> {
        let row_bytes = dtype.row_bytes(cols)?;
        let byte_len = rows.checked_mul(row_bytes)?;
        Some(ColumnarDescriptor {
            dtype,
            rows,
            row_bytes,
            byte_len,
            sha256: [0; 32],
            object,
            flags: 0,
            proof: Some(RowProof {
                height: default_proof_height(rows, row_bytes),
                root: [0; 32],
            }),
        })
    }

    /// Whether the rows may stand in for the block's ([`BLOCK_EXACT`]).
    pub fn is_block_exact(&self) -> bool {
        self.flags & BLOCK_EXACT != 0
    }

    /// Whether the rows equal the source tensor's values ([`SOURCE_EXACT`]).
    pub fn is_source_exact(&self) -> bool {
        self.flags & SOURCE_EXACT != 0
    }

    /// Whether each row is followed by its record ([`INLINE_PROOF`], 7e).
    pub fn inline_proof(&self) -> bool {
        self.flags & INLINE_PROOF != 0
    }

    /// Bytes from one row's start to the next: `row_bytes`, and with an
    /// inline proof (section 7e) the row's record, `32 × proof_height`.
    pub fn stride(&self) -> u64 {
        let h = self.proof.map_or(0, |p| u64::from(p.height));
        let record = if self.inline_proof() {
            h.saturating_mul(32)
        } else {
            0
        };
        self.row_bytes.saturating_add(record)
    }

    /// Byte range `[start, end)` of rows `first..first + count` (and their
    /// records, inline), or `None` past the end or on overflow.
    pub fn row_range(&self, first: u64, count: u64) -> Option<(u64, u64)> {
        let end = first.checked_add(count).filter(|&e| e <= self.rows)?;
        Some((
            first.checked_mul(self.stride())?,
            end.checked_mul(self.stride())?,
        ))
    }
}

/// The name of the knot in a package directory or under a published prefix
/// (the row files and companion files sit next to it).
pub const KNOT_NAME: &str = "model.knot";

/// The two roles a knot names (FORMAT.md 3.1): which block is the token
/// embedding and which the output projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// `role.token_embd`: the input embedding.
    TokenEmbd,
    /// `role.lm_head`: the output projection.
    LmHead,
}

impl Role {
    /// Both, in knot order.
    pub const ALL: [Role; 2] = [Role::TokenEmbd, Role::LmHead];

    /// The role's name, as in metadata keys and row file names
    /// (`token_embd`, `lm_head`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::TokenEmbd => "token_embd",
            Role::LmHead => "lm_head",
        }
    }

    /// The role in words, for messages (`token embedding`, `lm_head`).
    pub fn describe(self) -> &'static str {
        match self {
            Role::TokenEmbd => "token embedding",
            Role::LmHead => "lm_head",
        }
    }

    /// The metadata key naming the role's block (`role.token_embd`, `role.lm_head`).
    pub fn key(self) -> &'static str {
        match self {
            Role::TokenEmbd => keys::ROLE_TOKEN_EMBD,
            Role::LmHead => keys::ROLE_LM_HEAD,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The object name writers give a row file: `<role>.<dtype>.rows`.
pub fn rows_object_name(role: Role, dtype: DType) -> String {
    format!("{}.{}.rows", role.as_str(), dtype.name())
}

/// One entry of the block table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// Tensor name, unique in the knot.
    pub name: String,
    /// Dtype of the tensor's values.
    pub dtype: DType,
    /// Flag bits; see [`COLUMNAR_ELIGIBLE`]. Unknown bits are kept as read.
    pub flags: u32,
    /// Shape, outermost first.
    pub shape: Vec<u64>,
    /// Storage.
    pub encoding: Encoding,
    /// Columnar row files (only on columnar-eligible dense 2-D blocks).
    pub columnar: Vec<ColumnarDescriptor>,
}

impl Block {
    /// A dense block with a zero digest; the writer assigns offset and digest.
    pub fn dense(name: impl Into<String>, dtype: DType, shape: Vec<u64>) -> Option<Block> {
        let len = shape_bytes(&shape, dtype)?;
        Some(Block {
            name: name.into(),
            dtype,
            flags: 0,
            shape,
            encoding: Encoding::Dense(Payload {
                offset: 0,
                len,
                sha256: [0; 32],
            }),
            columnar: Vec::new(),
        })
    }

    /// Whether bit 0 is set.
    pub fn is_columnar_eligible(&self) -> bool {
        self.flags & COLUMNAR_ELIGIBLE != 0
    }

    /// Whether the payload is in its own-dtype row file ([`IN_ROW_FILE`], 7e).
    pub fn in_row_file(&self) -> bool {
        self.flags & IN_ROW_FILE != 0
    }

    /// The descriptor of the block's own dtype: its home in section 7e.
    pub fn home(&self) -> Option<&ColumnarDescriptor> {
        self.columnar.iter().find(|d| d.dtype == self.dtype)
    }

    /// Number of elements, or `None` on overflow (a shape with a zero
    /// dimension has 0 elements, whatever its other dimensions).
    pub fn elements(&self) -> Option<u64> {
        if self.shape.contains(&0) {
            return Some(0);
        }
        self.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
    }
}

/// `product(shape) × itemsize`, or for a block type
/// `product(shape[..n-1]) × row_bytes(shape[n-1])`; `None` on overflow, or
/// when the last dimension is not a whole number of blocks. A shape with a
/// zero dimension is 0 bytes (docs/FORMAT.md 3.2): nothing overflows.
pub fn shape_bytes(shape: &[u64], dtype: DType) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    let (outer, last) = match shape.split_last() {
        Some((&last, outer)) => (outer, last),
        None if dtype.is_quantized() => return None,
        None => return Some(dtype.itemsize()),
    };
    let row = dtype.row_bytes(last)?;
    outer.iter().try_fold(row, |a, &d| a.checked_mul(d))
}

/// The fixed preamble (docs/FORMAT.md section 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preamble {
    /// Layout version: 3, 4 (block types) or 5 (section 7e); 2 read (9a).
    pub version: u32,
    /// Length of the header after the preamble.
    pub header_len: u64,
    /// Start of the payload region.
    pub data_offset: u64,
    /// Total knot length.
    pub file_len: u64,
    /// SHA-256 of preamble bytes 0..40 and the header.
    pub header_sha256: [u8; 32],
}

/// Metadata plus block table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Typed key/values.
    pub metadata: Metadata,
    /// The block table, in payload order.
    pub blocks: Vec<Block>,
}

impl Header {
    /// Index of the block called `name`.
    pub fn block_index(&self, name: &str) -> Option<usize> {
        self.blocks.iter().position(|b| b.name == name)
    }

    /// The block called `name`.
    pub fn block(&self, name: &str) -> Option<&Block> {
        self.blocks.iter().find(|b| b.name == name)
    }

    /// Follows an alias to the block that holds the data.
    pub fn resolve(&self, index: usize) -> Option<&Block> {
        let b = self.blocks.get(index)?;
        match b.encoding {
            Encoding::Alias { target } => self.blocks.get(usize::try_from(target).ok()?),
            _ => Some(b),
        }
    }

    /// A `STR` metadata value.
    pub fn meta_str(&self, key: &str) -> Option<&str> {
        match self.metadata.get(key) {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// A `U64` metadata value.
    pub fn meta_u64(&self, key: &str) -> Option<u64> {
        match self.metadata.get(key) {
            Some(Value::U64(v)) => Some(*v),
            _ => None,
        }
    }

    /// A `BOOL` metadata value.
    pub fn meta_bool(&self, key: &str) -> Option<bool> {
        match self.metadata.get(key) {
            Some(Value::Bool(v)) => Some(*v),
            _ => None,
        }
    }

    /// The companion files (`package.files`) with their digests
    /// (`package.sha256`), in order.
    pub fn package_files(&self) -> Vec<(&str, &str)> {
        let files = self.package_file_names();
        let hashes = self.meta_list(keys::PACKAGE_SHA256).unwrap_or_default();
        files
            .iter()
            .zip(hashes)
            .map(|(f, h)| (f.as_str(), h.as_str()))
            .collect()
    }

    /// The recorded figures of the spectral blocks (`spectral.blocks`,
    /// `spectral.rel_frobenius_error`, `spectral.energy_kept`), in order.
    /// Entries that do not parse are skipped (a validated header has none).
    pub fn spectral_figures(&self) -> Vec<SpectralFigure<'_>> {
        use keys::{SPECTRAL_BLOCKS, SPECTRAL_ENERGY, SPECTRAL_REL_ERROR};
        let lists = [SPECTRAL_BLOCKS, SPECTRAL_REL_ERROR, SPECTRAL_ENERGY];
        self.figures(lists, |block, rel_frobenius_error, energy_kept| {
            SpectralFigure {
                block,
                rel_frobenius_error,
                energy_kept,
            }
        })
    }

    /// The recorded figures of the quantized blocks (`quant.blocks`,
    /// `quant.rmse`, `quant.max_abs_error`), as [`Header::spectral_figures`].
    pub fn quant_figures(&self) -> Vec<QuantFigure<'_>> {
        let lists = [
            keys::QUANT_BLOCKS,
            keys::QUANT_RMSE,
            keys::QUANT_MAX_ABS_ERROR,
        ];
        self.figures(lists, |block, rmse, max_abs_error| QuantFigure {
            block,
            rmse,
            max_abs_error,
        })
    }

    /// A list of blocks zipped with two lists of figures that parse.
    fn figures<'a, T>(&'a self, keys: [&str; 3], make: impl Fn(&'a str, f64, f64) -> T) -> Vec<T> {
        let [b, x, y] = keys.map(|k| self.meta_list(k).unwrap_or_default());
        b.iter()
            .zip(x)
            .zip(y)
            .filter_map(|((b, x), y)| Some(make(b, x.parse().ok()?, y.parse().ok()?)))
            .collect()
    }

    /// Whether row file `object` has a runs object (listed in `columnar.runs`).
    pub fn has_runs(&self, object: &str) -> bool {
        self.meta_list(keys::COLUMNAR_RUNS)
            .is_some_and(|l| l.iter().any(|o| o == object))
    }

    /// Whether row file `object` has a warm object (listed in `columnar.warm`).
    pub fn has_warm(&self, object: &str) -> bool {
        self.meta_list(keys::COLUMNAR_WARM)
            .is_some_and(|l| l.iter().any(|o| o == object))
    }

    /// The warm rows (`columnar.warm_rows`, FORMAT.md 7d), ascending; empty without warm objects.
    pub fn warm_rows(&self) -> Vec<u64> {
        let rows = self.meta_list(keys::COLUMNAR_WARM_ROWS).unwrap_or_default();
        rows.iter().filter_map(|s| row_number(s)).collect()
    }

    /// A `STR_LIST` metadata value.
    pub fn meta_list(&self, key: &str) -> Option<&[String]> {
        match self.metadata.get(key) {
            Some(Value::StrList(v)) => Some(v),
            _ => None,
        }
    }

    /// The names of the package's companion files (`package.files`; none when absent).
    pub fn package_file_names(&self) -> &[String] {
        self.meta_list(keys::PACKAGE_FILES).unwrap_or_default()
    }
}

/// The proof height a writer picks for a row file: the largest `h` whose path record (`32 × h`
/// bytes) is at most 12 % of a row, raised to the smallest `h` whose chunk table is at most 2,048
/// roots (64 KiB, fetched once per node: narrow rows, such as a block type's, would otherwise
/// make the table dominate a session), capped at `ceil(log2(rows))` (a taller chunk than the
/// tree is useless) and at 16.
pub fn default_proof_height(rows: u64, row_bytes: u64) -> u8 {
    let by_budget = row_bytes.saturating_mul(12) / (100 * 32);
    let by_table = (0..16u64)
        .find(|&h| rows.div_ceil(1u64 << h) <= MAX_TABLE_ROOTS)
        .unwrap_or(16);
    let by_rows = u64::from(64u32.saturating_sub(rows.saturating_sub(1).leading_zeros()));
    u8::try_from(by_budget.max(by_table).min(by_rows).min(16)).unwrap_or(16)
}

/// The chunk table a writer aims to stay within: 2,048 roots (64 KiB).
pub(crate) const MAX_TABLE_ROOTS: u64 = 2048;
