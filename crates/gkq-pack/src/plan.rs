//! The plan of a knot before a byte is written: the block table (every
//! tensor dense in its dtype, the role tensors in the first `--dtype` with
//! their row files, a tied lm_head as an alias, the `--spectral` tensors as
//! their factored blocks) and the metadata (docs/FORMAT.md 3.1).

use gkq_format::{
    Block, COLUMNAR_ELIGIBLE, ColumnarDescriptor, DType, Encoding, Header, Metadata, Role, Value,
    keys, rows_object_name,
};
use gkq_source::{ModelConfig, SourceModel, SourceTensor};

use crate::companions::Companion;
use crate::error::{PackError, Result};
use crate::options::TOOL;
use crate::quantize::figure;
use crate::roles::RolePlan;
use crate::spectral;
use crate::types::TypePlan;

/// Builds the knot header (payload lengths set; offsets and digests come
/// from the writer).
pub(crate) fn plan(
    cfg: &ModelConfig,
    src: &SourceModel,
    roles: &RolePlan,
    (dtypes, types, lm_head_rows): (&[DType], &TypePlan, bool),
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
    let blocks = plan_blocks(src, roles, (dtypes, lm_head_rows), factored, types)?;
    // quant.* (FORMAT.md 3.5): the figures are measured as the blocks are
    // written; they are written at a fixed width, so plan with zeros
    let quantized: Vec<String> = blocks
        .iter()
        .filter(|b| b.dtype.is_quantized() && matches!(b.encoding, Encoding::Dense(_)))
        // quantized here: a GGUF's own blocks are its source's bytes
        .filter(|b| src.tensor(&b.name).is_some_and(|t| t.dtype != b.dtype))
        .map(|b| b.name.clone())
        .collect();
    if !quantized.is_empty() {
        let zeros = Value::StrList(vec![figure(0.0); quantized.len()]);
        metadata.insert(keys::QUANT_RMSE.into(), zeros.clone());
        metadata.insert(keys::QUANT_MAX_ABS_ERROR.into(), zeros);
        metadata.insert(keys::QUANT_BLOCKS.into(), Value::StrList(quantized));
    }
    // the row file a node given the base URL fetches gets a runs object
    // (FORMAT.md 7b), if it has path records: the narrowest of those
    // certainly exact (the others would add storage no node reads)
    let mut runs: Vec<String> = blocks
        .iter()
        .filter_map(|b| {
            let source = src.tensor(&b.name)?.dtype;
            b.columnar
                .iter()
                .filter(|d| certainly_exact(d.dtype, b.dtype, source))
                .min_by_key(|d| d.row_bytes)
        })
        .filter(|d| d.proof.is_some_and(|p| p.height > 0))
        .map(|d| d.object.clone())
        .collect();
    runs.sort();
    if !runs.is_empty() {
        metadata.insert(keys::COLUMNAR_RUNS.into(), Value::StrList(runs));
    }
    Ok(Header { blocks, metadata })
}

/// Whether rows of `rows` dtype are `BLOCK_EXACT` for a block of `block`
/// dtype cast from a `source` tensor, whatever its values: the payload's
/// own dtype, or two dtypes that both hold every `source` value.
fn certainly_exact(rows: DType, block: DType, source: DType) -> bool {
    let holds =
        |d: DType| d == source || (d == DType::F32 && matches!(source, DType::F16 | DType::BF16));
    rows == block || (holds(rows) && holds(block))
}

/// The block table: every tensor dense in its stored type (its own, or the
/// one `types` decides), the role tensors with their row files, a tied
/// lm_head as an alias, the `--spectral` tensors as their factored blocks.
fn plan_blocks(
    src: &SourceModel,
    roles: &RolePlan,
    (dtypes, lm_head_rows): (&[DType], bool),
    factored: &[spectral::Factored],
    types: &TypePlan,
) -> Result<Vec<Block>> {
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
            let dtype = types.of(&t.name).unwrap_or(t.dtype);
            blocks.push(
                Block::dense(t.name.clone(), dtype, t.shape.clone()).ok_or_else(|| {
                    PackError::Source(gkq_source::SourceError::Safetensors {
                        path: src.file_of(t).path.clone(),
                        reason: format!("tensor {:?}: shape {:?} overflows", t.name, t.shape),
                    })
                })?,
            );
            continue;
        }
        if is_embed {
            embed_index = u32::try_from(blocks.len()).expect("block count is limited");
        }
        let role = if is_embed {
            Role::TokenEmbd
        } else {
            Role::LmHead
        };
        // a GGUF's tensors keep their types: its role blocks too, unless asked
        let default = src.gguf.as_ref().map(|_| t.dtype);
        let mut b = role_block(t, role, (dtypes, default), types)?;
        if is_lm && b.dtype.is_quantized() && !lm_head_rows {
            // resident, pulled as its block: its rows would be the block's
            // bytes again, which no node reads (--lm-head-rows writes them)
            b.flags &= !COLUMNAR_ELIGIBLE;
            b.columnar.clear();
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

/// The embedding's or lm_head's block: in its stored type (`types`, else
/// `default` when no `--dtype` is given, else the first `--dtype`, else
/// f32), with a row file in that type first and
/// one in each other `--dtype`. A block type's rows are its own blocks only
/// (FORMAT.md 3.4).
fn role_block(
    t: &SourceTensor,
    role: Role,
    (dtypes, default): (&[DType], Option<DType>),
    types: &TypePlan,
) -> Result<Block> {
    let dtype = types
        .of(&t.name)
        .or(default.filter(|_| dtypes.is_empty()))
        .or(dtypes.first().copied())
        .unwrap_or(DType::F32);
    // a block-type source in another type only as decided (--allow-requantize)
    let requantized = t.dtype.is_quantized() && types.of(&t.name) == Some(dtype);
    if dtype != t.dtype && !t.dtype.is_castable_float() && !requantized {
        return Err(PackError::NotCastable {
            tensor: t.name.clone(),
            from: t.dtype.to_string(),
            to: dtype.to_string(),
        });
    }
    let others: Vec<DType> = dtypes.iter().copied().filter(|&d| d != dtype).collect();
    if dtype.is_quantized()
        && let Some(d) = others.first()
    {
        return Err(PackError::Dtype(format!(
            "the {} {:?} is stored in {dtype}, whose rows are its own blocks: a {d} row file cannot be made of it (drop --dtype {d}, or give the role a float type)",
            role.describe(),
            t.name
        )));
    }
    let (rows, cols) = (t.shape[0], t.shape[1]);
    let mut b = Block::dense(t.name.clone(), dtype, t.shape.clone()).ok_or_else(|| {
        let per = dtype.block().map_or(1, |b| b.0);
        PackError::QuantShape {
            tensor: t.name.clone(),
            dtype,
            cols,
            per,
        }
    })?;
    b.flags = COLUMNAR_ELIGIBLE;
    for d in std::iter::once(dtype).chain(others) {
        let descriptor = ColumnarDescriptor::for_shape(rows, cols, d, rows_object_name(role, d))
            .ok_or_else(|| PackError::QuantShape {
                tensor: t.name.clone(),
                dtype: d,
                cols,
                per: d.block().map_or(1, |b| b.0),
            })?;
        b.columnar.push(descriptor);
    }
    Ok(b)
}

/// The metadata section (docs/FORMAT.md 3.1).
fn plan_metadata(
    cfg: &ModelConfig,
    src: &SourceModel,
    roles: &RolePlan,
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
