//! `gkq-pack`: a Hugging Face model directory → a GKQ v2 knot plus the
//! row-aligned columnar files of its token embedding and lm_head.
//!
//! One pass over the source: each tensor is read in bounded chunks with
//! positioned reads, cast (in parallel, with rayon) where its role asks for
//! it, hashed while it is written, and fed to the source file's own hasher
//! on the way, so source digests cost no second read. Output is atomic (see
//! [`output`]) and deterministic.

pub mod analyze;
mod error;
pub mod output;
mod prefetch;
pub mod roles;
mod run;
pub mod spectral;

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use gkq_format::merkle::{self, Hash};
use gkq_format::{
    BLOCK_EXACT, Block, COLUMNAR_ELIGIBLE, CastReport, ColumnarDescriptor, DType, Encoding, Header,
    KnotWriter, Metadata, RowProof, SOURCE_EXACT, Value, cast_row, keys, rows_object_name,
};
use rayon::prelude::*;
use serde::Serialize;
use sha2::{Digest, Sha256};

pub use error::{PackError, Result};
pub use gkq_format::KNOT_NAME;
pub use gkq_source::{ModelConfig, SourceModel, SourceTensor, hub};
pub use roles::Roles;

use error::IoContext;
use output::{Output, flush_file, write_all};
use run::Run;

/// The companion files copied into the package when the model has them
/// (docs/FORMAT.md 3.1, `package.files`): what a node needs besides the
/// weights to run the model.
pub const COMPANION_FILES: &[&str] = &[
    "added_tokens.json",
    "config.json",
    "generation_config.json",
    "merges.txt",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
];

/// The producing tool, recorded in `gkq.tool`.
pub const TOOL: &str = concat!("gkq-pack ", env!("CARGO_PKG_VERSION"));

/// Bytes of source read per step.
const CHUNK: usize = 8 << 20;
/// Source bytes between two background writeback requests.
const WRITEBACK_STEP: u64 = 128 << 20;

/// What to pack and how.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// The Hugging Face model directory.
    pub model_dir: PathBuf,
    /// The output directory.
    pub out_dir: PathBuf,
    /// Row file dtypes; the first is also the dtype of the role blocks.
    pub dtypes: Vec<DType>,
    /// Override of the embedding tensor name.
    pub embed_tensor: Option<String>,
    /// Override of the lm_head tensor name.
    pub lm_head_tensor: Option<String>,
    /// Replace the contents of an existing output directory.
    pub force: bool,
    /// Accept narrowing casts that overflow to infinity.
    pub allow_lossy: bool,
    /// `source.model_id` (default: from a Hugging Face cache path, else none).
    pub model_id: Option<String>,
    /// `source.revision` (default: from a Hugging Face cache path, else none).
    pub revision: Option<String>,
    /// `--spectral PATTERN=SPEC`: tensors stored as rank-K spectral blocks.
    pub spectral: Vec<spectral::SpectralSpec>,
}

impl PackOptions {
    /// Defaults: f32 rows, no overrides.
    pub fn new(model_dir: impl Into<PathBuf>, out_dir: impl Into<PathBuf>) -> PackOptions {
        PackOptions {
            model_dir: model_dir.into(),
            out_dir: out_dir.into(),
            dtypes: vec![DType::F32],
            embed_tensor: None,
            lm_head_tensor: None,
            force: false,
            allow_lossy: false,
            model_id: None,
            revision: None,
            spectral: Vec::new(),
        }
    }
}

pub use gkq_format::progress::{NoProgress, Progress};

/// A file written, for the report.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FileReport {
    /// Path.
    pub path: PathBuf,
    /// Length.
    pub bytes: u64,
    /// Hex SHA-256.
    pub sha256: String,
}

/// The knot, for the report.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct KnotFile {
    /// Path.
    pub path: PathBuf,
    /// Length.
    pub bytes: u64,
}

/// A columnar row file, for the report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ColumnarReport {
    /// Block name.
    pub tensor: String,
    /// `token_embd` or `lm_head`.
    pub role: String,
    /// Row dtype.
    pub dtype: String,
    /// Path.
    pub path: PathBuf,
    /// Rows.
    pub rows: u64,
    /// Bytes per row.
    pub row_bytes: u64,
    /// Length.
    pub bytes: u64,
    /// Hex SHA-256.
    pub sha256: String,
    /// Largest `|source - row value|` over finite values: the loss of this
    /// row file against the source tensor (not against the knot's block).
    pub max_abs_error_vs_source: f64,
    /// `SOURCE_EXACT`: every value casts back to the source's bits.
    pub source_exact: bool,
    /// `BLOCK_EXACT`: every value casts to the block's dtype bit for bit, so
    /// a node may fetch these rows instead of the block's.
    pub block_exact: bool,
    /// Hex of the Merkle root over the rows (FORMAT.md 7a).
    pub merkle_root: String,
    /// The proof object next to the row file.
    pub proof: FileReport,
    /// `proof_height`: 32 × this many bytes of proof per row fetched.
    pub proof_height: u8,
}

/// A companion file copied into the package, for the report.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CompanionReport {
    /// File name (the same in the model directory and the package).
    pub name: String,
    /// Path in the package.
    pub path: PathBuf,
    /// Length.
    pub bytes: u64,
    /// Hex SHA-256 (recorded in `package.sha256`).
    pub sha256: String,
}

/// A cast that was performed, for the report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CastSummary {
    /// Tensor.
    pub tensor: String,
    /// From dtype.
    pub from: String,
    /// To dtype.
    pub to: String,
    /// Largest absolute rounding error (0 for widening casts).
    pub max_abs_error: f64,
    /// Whether any finite value became infinite (only with `--allow-lossy`).
    pub overflowed: bool,
}

/// What [`pack`] produced (the `--json` output).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PackReport {
    /// The knot id: hex of the preamble's `header_sha256`, which
    /// authenticates the header and through its digests every payload, row
    /// file and companion file. A node pins a model with it (`--knot-id`).
    pub knot_id: String,
    /// The knot. No whole-file digest is computed for it: the knot id
    /// (the header's digest, which records every payload's) authenticates
    /// it, and computing one would mean reading the knot again, since its
    /// header is written last.
    pub knot: KnotFile,
    /// The row files.
    pub columnar: Vec<ColumnarReport>,
    /// The companion files (config, tokenizer).
    pub companions: Vec<CompanionReport>,
    /// lm_head recorded as an alias of the embedding.
    pub tied: bool,
    /// Blocks in the knot.
    pub tensors: usize,
    /// Sum of the source file sizes.
    pub source_bytes: u64,
    /// Wall time.
    pub seconds: f64,
    /// Casts performed.
    pub casts: Vec<CastSummary>,
    /// The spectral blocks (`--spectral`), with their recorded figures.
    pub spectral: Vec<spectral::SpectralReport>,
    /// `config.json` architecture.
    pub architecture: String,
    /// Embedding tensor name.
    pub token_embd: String,
    /// lm_head block name (`None`: the model has no output projection).
    pub lm_head: Option<String>,
    /// `source.model_id` recorded in the knot.
    pub model_id: Option<String>,
    /// `source.revision` recorded in the knot.
    pub revision: Option<String>,
    /// Peak resident set size of this process (Linux `VmHWM`), when known.
    pub peak_rss_bytes: Option<u64>,
}

/// Peak resident set size of this process, from `/proc/self/status`.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// One row file while packing.
struct RowSink {
    dtype: DType,
    path: PathBuf,
    w: BufWriter<File>,
    /// `None` for the row file in the block's dtype: its digest is the payload's.
    hasher: Option<Sha256>,
    /// Leaf hashes of the rows written so far (FORMAT.md 7a).
    leaves: Vec<Hash>,
    source_exact: bool,
    block_exact: bool,
    /// Largest error against the source.
    vs_source: f64,
    /// The cast from the block's dtype (for the other dtypes).
    cast: CastReport,
}

/// One role block and its row files while packing.
struct RoleOut {
    block: usize,
    role: &'static str,
    /// The row files, the one in the block's dtype first.
    files: Vec<RowSink>,
    casts: Vec<CastSummary>,
}

/// Rows per rayon task when casting, hashing or comparing rows.
const ROWS_PER_TASK: usize = 256;

/// Leaf hashes of whole rows, in parallel.
fn leaves_of(bytes: &[u8], row_bytes: usize) -> Vec<Hash> {
    bytes
        .par_chunks(row_bytes.max(1))
        .map(merkle::leaf_hash)
        .collect()
}

/// Whether every value of `values` (rows in `vd`) casts to `rd` giving the
/// bits of `reference`, in parallel over groups of rows.
fn casts_back_exactly(values: &[u8], vd: DType, reference: &[u8], rd: DType, cols: usize) -> bool {
    let per = cols.max(1) * ROWS_PER_TASK;
    values
        .par_chunks(per * vd.itemsize() as usize)
        .zip(reference.par_chunks(per * rd.itemsize() as usize))
        .all(|(a, b)| gkq_format::first_inexact(a, vd, b, rd).is_none())
}

impl RowSink {
    /// Writes the next rows of this file (`bytes`, in its dtype), and checks
    /// them against the source `chunk` and the block's rows.
    fn push(
        &mut self,
        bytes: &[u8],
        chunk: (&[u8], DType),
        block: (&[u8], DType),
        cols: usize,
    ) -> Result<()> {
        let row_bytes = cols * self.dtype.itemsize() as usize;
        let (src_exact, (blk_exact, (vs, leaves))) = rayon::join(
            || self.source_exact && casts_back_exactly(bytes, self.dtype, chunk.0, chunk.1, cols),
            || {
                rayon::join(
                    || {
                        self.block_exact
                            && casts_back_exactly(bytes, self.dtype, block.0, block.1, cols)
                    },
                    || {
                        rayon::join(
                            || {
                                loss_vs_source(
                                    chunk.0,
                                    chunk.1,
                                    bytes,
                                    self.dtype,
                                    cols * chunk.1.itemsize() as usize,
                                )
                            },
                            || leaves_of(bytes, row_bytes),
                        )
                    },
                )
            },
        );
        self.source_exact = src_exact;
        self.block_exact = blk_exact;
        self.vs_source = self.vs_source.max(vs);
        self.leaves.extend(leaves);
        if let Some(h) = &mut self.hasher {
            h.update(bytes);
        }
        write_all(&mut self.w, bytes, &self.path)
    }
}

fn check_dtypes(dtypes: &[DType]) -> Result<Vec<DType>> {
    let mut out: Vec<DType> = Vec::new();
    for &d in dtypes {
        if !d.is_castable_float() {
            return Err(PackError::Dtype(format!(
                "{d} is not one of f32, f16, bf16"
            )));
        }
        if out.contains(&d) {
            return Err(PackError::Dtype(format!("{d} given twice")));
        }
        out.push(d);
    }
    if out.is_empty() {
        out.push(DType::F32);
    }
    Ok(out)
}

/// Casts a chunk of whole rows in parallel. Returns the bytes and the merged report.
fn cast_rows(src: &[u8], from: DType, to: DType, row_bytes: usize) -> (Vec<u8>, CastReport) {
    const ROWS_PER_TASK: usize = 256;
    let per_task = row_bytes.max(1) * ROWS_PER_TASK;
    let parts: Vec<(Vec<u8>, CastReport)> = src
        .par_chunks(per_task)
        .map(|c| {
            let mut out =
                Vec::with_capacity(c.len() / from.itemsize() as usize * to.itemsize() as usize);
            let r = cast_row(c, from, to, &mut out).expect("role dtypes are castable floats");
            (out, r)
        })
        .collect();
    let mut report = CastReport::default();
    let mut bytes = Vec::with_capacity(parts.iter().map(|p| p.0.len()).sum());
    let elems_per_task = per_task / from.itemsize() as usize;
    for (i, (b, r)) in parts.into_iter().enumerate() {
        report.merge(r, i * elems_per_task);
        bytes.extend_from_slice(&b);
    }
    (bytes, report)
}

fn overflow_error(
    tensor: &str,
    src: &[u8],
    from: DType,
    to: DType,
    first_row: u64,
    cols: u64,
    idx: usize,
) -> PackError {
    let size = from.itemsize() as usize;
    let mut v = Vec::new();
    gkq_format::decode_f32(&src[idx * size..(idx + 1) * size], from, &mut v);
    PackError::CastOverflow {
        tensor: tensor.to_owned(),
        row: first_row + idx as u64 / cols,
        col: idx as u64 % cols,
        value: v.first().copied().unwrap_or(f32::NAN),
        to: to.to_string(),
    }
}

/// Builds the knot header (payload lengths set; offsets and digests come
/// from the writer).
fn plan(
    cfg: &ModelConfig,
    src: &SourceModel,
    roles: &Roles,
    dtypes: &[DType],
    identity: (Option<&str>, Option<&str>),
    companions: &[Companion],
    factored: &[spectral::Factored],
) -> Result<Header> {
    // Digests of the source files are only known at the end; the header's
    // size does not depend on their values, so plan with placeholders.
    let placeholder = vec!["0".repeat(64); src.files.len()];
    let mut metadata = plan_metadata(cfg, src, roles, &placeholder, identity, companions);
    if !factored.is_empty() {
        let list = |f: &dyn Fn(&spectral::SpectralReport) -> String| {
            Value::StrList(factored.iter().map(|x| f(&x.report)).collect())
        };
        metadata.insert(keys::SPECTRAL_BLOCKS.into(), list(&|r| r.tensor.clone()));
        metadata.insert(
            keys::SPECTRAL_REL_ERROR.into(),
            list(&|r| gkq_format::decimal(r.rel_frobenius_error)),
        );
        metadata.insert(
            keys::SPECTRAL_ENERGY.into(),
            list(&|r| gkq_format::decimal(r.energy_kept)),
        );
    }
    Ok(Header {
        blocks: plan_blocks(src, roles, dtypes, factored)?,
        metadata,
    })
}

/// The block table: every tensor dense in its dtype, the role tensors in
/// the first `--dtype` with their row files, a tied lm_head as an alias,
/// the `--spectral` tensors as their factored blocks.
fn plan_blocks(
    src: &SourceModel,
    roles: &Roles,
    dtypes: &[DType],
    factored: &[spectral::Factored],
) -> Result<Vec<Block>> {
    let d0 = dtypes[0];
    let mut blocks = Vec::new();
    let mut embed_index = 0u32;
    for t in &src.tensors {
        let is_embed = t.name == roles.embed;
        let is_lm = roles.lm_head.as_deref() == Some(t.name.as_str());
        if roles.tied && roles.lm_head_block.as_deref() == Some(t.name.as_str()) {
            continue; // identical lm_head: recorded as the alias below
        }
        if let Some(f) = factored.iter().find(|f| f.block.name == t.name) {
            blocks.push(f.block.clone());
            continue;
        }
        if !(is_embed || is_lm) {
            blocks.push(
                Block::dense(t.name.clone(), t.dtype, t.shape.clone()).ok_or_else(|| {
                    PackError::Source(gkq_source::SourceError::Safetensors {
                        path: src.file_of(t).path.clone(),
                        reason: format!("tensor {:?}: shape {:?} overflows", t.name, t.shape),
                    })
                })?,
            );
            continue;
        }
        if !t.dtype.is_castable_float() {
            return Err(PackError::NotCastable {
                tensor: t.name.clone(),
                from: t.dtype.to_string(),
                to: d0.to_string(),
            });
        }
        let role = if is_embed {
            gkq_format::Role::TokenEmbd
        } else {
            gkq_format::Role::LmHead
        };
        let mut b =
            Block::dense(t.name.clone(), d0, t.shape.clone()).expect("2-D shape checked by roles");
        b.flags = COLUMNAR_ELIGIBLE;
        let (rows, cols) = (t.shape[0], t.shape[1]);
        for &d in dtypes {
            b.columnar.push(
                ColumnarDescriptor::for_shape(rows, cols, d, rows_object_name(role, d))
                    .expect("shape checked"),
            );
        }
        if is_embed {
            embed_index = u32::try_from(blocks.len()).expect("block count is limited");
        }
        blocks.push(b);
    }
    if let (true, Some(lm_head_block)) = (roles.tied, &roles.lm_head_block) {
        let e = &blocks[embed_index as usize];
        blocks.push(Block {
            name: lm_head_block.clone(),
            dtype: e.dtype,
            flags: e.flags,
            shape: e.shape.clone(),
            encoding: Encoding::Alias {
                target: embed_index,
            },
            columnar: Vec::new(),
        });
    }
    Ok(blocks)
}

/// The metadata section (docs/FORMAT.md 3.1).
fn plan_metadata(
    cfg: &ModelConfig,
    src: &SourceModel,
    roles: &Roles,
    source_sha: &[String],
    identity: (Option<&str>, Option<&str>),
    companions: &[Companion],
) -> Metadata {
    let embed = src.tensor(&roles.embed).expect("role tensor exists");
    let mut md = Metadata::new();
    md.insert(keys::TOOL.into(), Value::Str(TOOL.into()));
    md.insert(
        keys::ARCHITECTURE.into(),
        Value::Str(cfg.architecture.clone()),
    );
    md.insert(keys::MODEL_TYPE.into(), Value::Str(cfg.model_type.clone()));
    md.insert(keys::VOCAB_SIZE.into(), Value::U64(embed.shape[0]));
    md.insert(keys::HIDDEN_SIZE.into(), Value::U64(embed.shape[1]));
    md.insert(
        keys::ROLE_TOKEN_EMBD.into(),
        Value::Str(roles.embed.clone()),
    );
    // A model without an output projection has no lm_head role at all.
    if let Some(lm_head_block) = &roles.lm_head_block {
        md.insert(keys::TIE_WORD_EMBEDDINGS.into(), Value::Bool(roles.tied));
        md.insert(keys::ROLE_LM_HEAD.into(), Value::Str(lm_head_block.clone()));
    }
    if let Some(id) = identity.0 {
        md.insert(keys::SOURCE_MODEL_ID.into(), Value::Str(id.to_owned()));
    }
    if let Some(rev) = identity.1 {
        md.insert(keys::SOURCE_REVISION.into(), Value::Str(rev.to_owned()));
    }
    md.insert(
        keys::SOURCE_FILES.into(),
        Value::StrList(src.files.iter().map(|f| f.name.clone()).collect()),
    );
    md.insert(
        keys::SOURCE_SHA256.into(),
        Value::StrList(source_sha.to_vec()),
    );
    if !companions.is_empty() {
        md.insert(
            keys::PACKAGE_FILES.into(),
            Value::StrList(companions.iter().map(|c| c.name.clone()).collect()),
        );
        md.insert(
            keys::PACKAGE_SHA256.into(),
            Value::StrList(companions.iter().map(|c| c.sha256.clone()).collect()),
        );
    }
    md
}

/// Packs `opts.model_dir` into `opts.out_dir`.
pub fn pack(opts: &PackOptions, progress: &dyn Progress) -> Result<PackReport> {
    let started = Instant::now();
    let dtypes = check_dtypes(&opts.dtypes)?;
    if opts.out_dir.exists() && !opts.force {
        return Err(PackError::OutDirExists {
            path: opts.out_dir.clone(),
        });
    }
    let located = hub::locate(&opts.model_dir)?;
    check_out_outside(&located.dir, &opts.out_dir)?;
    let model_id = opts.model_id.clone().or(located.model_id);
    let revision = opts.revision.clone().or(located.revision);
    let cfg = ModelConfig::read(&located.dir)?;
    let src = SourceModel::open(&located.dir)?;
    let roles = roles::decide(
        &cfg,
        &src,
        opts.embed_tensor.as_deref(),
        opts.lm_head_tensor.as_deref(),
    )?;
    let companions = find_companions(&located.dir)?;
    let factored = spectral::factor_all(&src, &roles, &opts.spectral)?;
    let header = plan(
        &cfg,
        &src,
        &roles,
        &dtypes,
        (model_id.as_deref(), revision.as_deref()),
        &companions,
        &factored,
    )?;
    let (spectral_reports, spectral_payloads): (Vec<_>, Vec<_>) = factored
        .into_iter()
        .map(|f| (f.report, (f.block.name, f.payload)))
        .unzip();

    let mut out = Output::prepare(&opts.out_dir, opts.force)?;
    let mut companion_files = Vec::new();
    for c in &companions {
        companion_files.push(copy_companion(&mut out, c)?);
    }
    let mut run = Run::start(opts, progress, &mut out, header, &roles.embed, &src)?;
    run.spectral = spectral_payloads.into_iter().collect();
    run.tensors(&src)?;
    let done = run.finish(&mut out)?;
    // fsync every file before the commit, several at once
    done.files
        .par_iter()
        .chain(companion_files.par_iter())
        .try_for_each(|(f, p)| f.sync_all().at(p))?;
    let knot_bytes = std::fs::metadata(&done.knot_path)
        .at(&done.knot_path)?
        .len();
    out.commit()?;
    Ok(PackReport {
        knot_id: done.knot_id,
        knot: KnotFile {
            path: opts.out_dir.join(KNOT_NAME),
            bytes: knot_bytes,
        },
        columnar: done.columnar,
        companions: companion_reports(&companions, &opts.out_dir),
        tied: roles.tied,
        tensors: done.tensors,
        source_bytes: src.total_bytes(),
        seconds: started.elapsed().as_secs_f64(),
        casts: done.casts,
        spectral: spectral_reports,
        architecture: cfg.architecture,
        token_embd: roles.embed,
        lm_head: roles.lm_head_block,
        model_id,
        revision,
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// The companion files' lines of the report.
fn companion_reports(companions: &[Companion], out_dir: &Path) -> Vec<CompanionReport> {
    companions
        .iter()
        .map(|c| CompanionReport {
            name: c.name.clone(),
            path: out_dir.join(&c.name),
            bytes: c.bytes,
            sha256: c.sha256.clone(),
        })
        .collect()
}

/// A gkq-format error while writing the knot at `path`.
fn format_err(path: &Path, source: gkq_format::Error) -> PackError {
    match source {
        gkq_format::Error::Io(error) => PackError::Io {
            path: path.to_owned(),
            error,
        },
        error => PackError::Format {
            path: path.to_owned(),
            error: Box::new(error),
        },
    }
}

/// Closes a row file: writes its proof object (FORMAT.md 7a) and records
/// digest, exactness flags and Merkle root in its descriptor. Returns its
/// report (paths relative to the package, tensor and role left empty) and
/// the files to sync before commit.
fn finish_row_file<W: Write + std::io::Seek>(
    out: &mut Output,
    writer: &mut KnotWriter<W>,
    block: usize,
    f: RowSink,
    knot_tmp: &Path,
) -> Result<(ColumnarReport, Vec<(File, PathBuf)>)> {
    let file = flush_file(f.w, &f.path)?;
    let fmt = |e| format_err(knot_tmp, e);
    let d = writer.columnar_mut(block, f.dtype).map_err(fmt)?;
    if let Some(h) = f.hasher {
        d.sha256 = h.finalize().into();
    }
    d.flags =
        if f.source_exact { SOURCE_EXACT } else { 0 } | if f.block_exact { BLOCK_EXACT } else { 0 };
    let height = d.proof.map_or(0, |p| p.height);
    let proof_name = merkle::proof_object_name(&d.object);
    let (proof_path, mut pw) = out.create(&proof_name)?;
    let root = merkle::write_proof(&f.leaves, height, &mut pw)
        .at(&proof_path)?
        .ok_or_else(|| PackError::Dtype(format!("{}: no rows to prove", d.object)))?;
    d.proof = Some(RowProof { height, root });
    let d = d.clone();
    let proof_file = flush_file(pw, &proof_path)?;
    let (proof_len, proof_sha) = hash_file(&proof_path)?;
    let report = ColumnarReport {
        tensor: String::new(),
        role: String::new(),
        dtype: d.dtype.to_string(),
        path: PathBuf::from(&d.object),
        rows: d.rows,
        row_bytes: d.row_bytes,
        bytes: d.byte_len,
        sha256: gkq_format::hex(&d.sha256),
        max_abs_error_vs_source: f.vs_source,
        source_exact: f.source_exact,
        block_exact: f.block_exact,
        merkle_root: gkq_format::hex(&root),
        proof: FileReport {
            path: PathBuf::from(&proof_name),
            bytes: proof_len,
            sha256: proof_sha,
        },
        proof_height: height,
    };
    Ok((report, vec![(file, f.path), (proof_file, proof_path)]))
}

/// Largest error of `out` (row file bytes, `to`) against `src` (source
/// bytes, `from`), for whole rows of `src_row_bytes`, in parallel.
fn loss_vs_source(src: &[u8], from: DType, out: &[u8], to: DType, src_row_bytes: usize) -> f64 {
    const ROWS_PER_TASK: usize = 256;
    let per = src_row_bytes.max(1) * ROWS_PER_TASK;
    let out_per = per / from.itemsize() as usize * to.itemsize() as usize;
    src.par_chunks(per)
        .zip(out.par_chunks(out_per.max(1)))
        .map(|(a, b)| gkq_format::max_abs_diff(a, from, b, to).unwrap_or(f64::NAN))
        .reduce(|| 0.0, f64::max)
}

/// Refuses an output directory inside the model directory (packing would
/// read its own output next time, and `--force` could delete source files).
fn check_out_outside(model: &Path, out: &Path) -> Result<()> {
    let abs = |p: &Path| {
        p.canonicalize().unwrap_or_else(|_| {
            std::env::current_dir()
                .map(|c| c.join(p))
                .unwrap_or_else(|_| p.to_path_buf())
        })
    };
    let (m, o) = (abs(model), abs(out));
    // `out` may not exist yet: compare its nearest existing ancestor too
    let o_parent = out
        .ancestors()
        .find(|a| !a.as_os_str().is_empty() && a.exists())
        .map(abs);
    if o.starts_with(&m) || o_parent.is_some_and(|p| p.starts_with(&m)) {
        return Err(PackError::OutInsideModel {
            out: out.to_path_buf(),
            model: model.to_path_buf(),
        });
    }
    Ok(())
}

/// A companion file of the model directory.
struct Companion {
    name: String,
    path: PathBuf,
    bytes: u64,
    sha256: String,
}

/// The companion files present in `dir` (regular files only), hashed.
fn find_companions(dir: &Path) -> Result<Vec<Companion>> {
    let mut out = Vec::new();
    for name in COMPANION_FILES {
        let path = dir.join(name);
        // a snapshot's files are symlinks into blobs/: follow them
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => {
                let (bytes, sha256) = hash_file(&path)?;
                out.push(Companion {
                    name: (*name).to_owned(),
                    path,
                    bytes,
                    sha256,
                });
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Copies a companion file into the package, checking that it did not
/// change since it was hashed for the header.
fn copy_companion(out: &mut Output, c: &Companion) -> Result<(File, PathBuf)> {
    let (path, mut w) = out.create(&c.name)?;
    let mut src = File::open(&c.path).at(&c.path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = src.read(&mut buf).at(&c.path)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        write_all(&mut w, &buf[..n], &path)?;
    }
    let digest = gkq_format::hex(&h.finalize());
    if digest != c.sha256 {
        return Err(PackError::Changed {
            path: c.path.clone(),
        });
    }
    Ok((flush_file(w, &path)?, path))
}

fn hash_file(path: &Path) -> Result<(u64, String)> {
    let mut f = File::open(path).at(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf).at(path)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        total += n as u64;
    }
    Ok((total, gkq_format::hex(&h.finalize())))
}
