//! `gkq-export --gguf`: a knot (local or remote, read through the verified
//! reader and its disk cache) written as a GGUF llama.cpp loads.
//!
//! - A knot packed from a GGUF carries that GGUF's metadata
//!   (`metadata.gguf`): it is written back verbatim (without the `split.*`
//!   keys of a shard), with the tensors under their names, in their types
//!   and bytes, in table order, aligned as gguf-py aligns them; a knot of a
//!   canonically written GGUF gives back the same bytes.
//! - A knot packed from safetensors (llama, qwen2) gets llama.cpp's tensor
//!   names, Llama's q/k rows permuted to llama.cpp's rotary layout, and
//!   the hyper-parameters from its `config.json`, and its tokenizer.json
//!   as the `tokenizer.ggml.*` keys llama.cpp's converter writes.
//!
//! The file is written next to `OUT` and renamed into place: an error
//! leaves nothing behind.

use std::io::Write;
use std::path::{Path, PathBuf};

use gkq_format::arch::{self, Arch, Part};
use gkq_format::gguf::{self, Gguf, GgufTensorOut, GgufValue};
use gkq_format::{Block, DType, Encoding};
use gkq_reader::{PullPlan, Pulled, Reader};

use crate::NodeError;
use serde::Serialize;

/// What was written.
#[derive(Clone, Debug, Serialize)]
pub struct ExportReport {
    /// The GGUF.
    pub path: PathBuf,
    /// Its length.
    pub bytes: u64,
    /// Its tensors.
    pub tensors: usize,
    /// Its key/value pairs.
    pub metadata_keys: usize,
    /// Where they came from.
    pub metadata_from: String,
    /// The knot id of the knot exported.
    pub knot_id: String,
    /// Payload bytes the reader moved over the network (0 for a local
    /// knot, or when the disk cache held every block).
    pub fetched_bytes: u64,
}

/// A tensor to write: its name in the GGUF, the knot block it comes from,
/// and whether its rows are permuted (Llama's q and k from safetensors).
struct Planned {
    name: String,
    block: String,
    permute_heads: Option<usize>,
    /// Widened exactly to f32 on the way out: a 1-D f16/bf16 block of a
    /// safetensors-born package (norms, biases), which llama.cpp's
    /// converter writes as F32 and its CPU kernels need as F32.
    widen: bool,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> NodeError + '_ {
    move |error| NodeError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Rows (or, for a 1-D bias, values) of `bytes` reordered as llama.cpp's
/// `permute(w, heads)`: within each head, the row `s·(d/2) + j` moves to
/// `2j + s`, so that rotary pairs become adjacent.
fn permute_rows(bytes: &[u8], rows: usize, heads: usize) -> Option<Vec<u8>> {
    let rb = bytes.len().checked_div(rows)?;
    let hd = rows.checked_div(heads)?;
    if hd % 2 != 0 || hd == 0 || rb.checked_mul(rows)? != bytes.len() {
        return None;
    }
    let mut out = vec![0u8; bytes.len()];
    for h in 0..heads {
        for s in 0..2 {
            for j in 0..hd / 2 {
                let from = h * hd + s * (hd / 2) + j;
                let to = h * hd + 2 * j + s;
                out.get_mut(to * rb..(to + 1) * rb)?
                    .copy_from_slice(bytes.get(from * rb..(from + 1) * rb)?);
            }
        }
    }
    Some(out)
}

/// A GGUF's key/value pairs.
type Kv = Vec<(String, GgufValue)>;

/// The architectures an export maps, as `llama and qwen2 (and mistral,
/// as llama)`: those llama.cpp names as they are, then the others.
fn exported_names() -> String {
    let exported = arch::ARCHS
        .iter()
        .filter(|a| a.decoder.is_some_and(|d| d.export));
    let (mut same, mut other): (Vec<&Arch>, Vec<&Arch>) =
        exported.partition(|a| a.gguf == Some(a.name));
    same.sort_by_key(|a| a.name);
    other.sort_by_key(|a| a.name);
    let same: Vec<&str> = same.iter().map(|a| a.name).collect();
    let mut text = same.join(" and ");
    for a in other {
        text += &format!(" (and {}, as {})", a.name, a.gguf.unwrap_or("?"));
    }
    text
}

/// The GGUF metadata of a knot packed from safetensors: the
/// hyper-parameters gguf-py writes for llama and qwen2.
fn derived_kv(config: &serde_json::Value) -> Result<(&'static Arch, Kv), NodeError> {
    let model_type = config["model_type"].as_str().unwrap_or_default();
    let exported = |a: &Arch| a.decoder.is_some_and(|d| d.export);
    let table = arch::by_hf(model_type).filter(|a| exported(a));
    let (Some(table), Some(arch)) = (table, table.and_then(|a| a.gguf)) else {
        return Err(NodeError::Unsupported(format!(
            "the knot came from safetensors of model_type {model_type:?}: gkq-export maps {} to llama.cpp's names (and any knot packed from a GGUF back to it)",
            exported_names()
        )));
    };
    let arch = arch.to_owned();
    let u = |k: &str| config[k].as_u64().map(|v| GgufValue::U32(v as u32));
    let f = |k: &str, d: f64| GgufValue::F32(config[k].as_f64().unwrap_or(d) as f32);
    let need =
        |k: &str| u(k).ok_or_else(|| NodeError::Unsupported(format!("config.json has no {k}")));
    let heads = need("num_attention_heads")?;
    let kv = vec![
        (
            "general.architecture".to_owned(),
            GgufValue::Str(arch.clone()),
        ),
        (
            format!("{arch}.context_length"),
            u("max_position_embeddings").unwrap_or(GgufValue::U32(2048)),
        ),
        (format!("{arch}.embedding_length"), need("hidden_size")?),
        (format!("{arch}.block_count"), need("num_hidden_layers")?),
        (
            format!("{arch}.feed_forward_length"),
            need("intermediate_size")?,
        ),
        (format!("{arch}.attention.head_count"), heads.clone()),
        (
            format!("{arch}.attention.head_count_kv"),
            u("num_key_value_heads").unwrap_or(heads),
        ),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            f("rms_norm_eps", 1e-6),
        ),
        (format!("{arch}.rope.freq_base"), f("rope_theta", 10_000.0)),
        (format!("{arch}.vocab_size"), need("vocab_size")?),
    ];
    Ok((table, kv))
}

/// The metadata and the tensors to write, from the package.
fn plan(r: &Reader) -> Result<(Gguf, Vec<Planned>, String), NodeError> {
    let header = r.knot().header().header().clone();
    let blocks: Vec<&Block> = header
        .blocks
        .iter()
        .filter(|b| !matches!(b.encoding, Encoding::Alias { .. }))
        .collect();
    let files = header.package_file_names();
    if files.iter().any(|f| f == "metadata.gguf") {
        let bytes = r.package_file("metadata.gguf")?;
        let mut g = Gguf::parse(&bytes)?;
        g.kv.retain(|(k, _)| !k.starts_with("split."));
        let tensors = blocks
            .iter()
            .map(|b| Planned {
                name: b.name.clone(),
                block: b.name.clone(),
                permute_heads: None,
                widen: false,
            })
            .collect();
        return Ok((
            g,
            tensors,
            "the package's metadata.gguf (the source GGUF's)".into(),
        ));
    }
    let config: serde_json::Value = serde_json::from_slice(&r.package_file("config.json")?)
        .map_err(|e| NodeError::Unsupported(format!("config.json: {e}")))?;
    let (arch, mut kv) = derived_kv(&config)?;
    if files.iter().any(|f| f == "tokenizer.json") {
        // llama.cpp needs the vocabulary: the package's tokenizer as its converter writes it
        let json = r.package_file("tokenizer.json")?;
        let cfg = files
            .iter()
            .any(|f| f == "tokenizer_config.json")
            .then(|| r.package_file("tokenizer_config.json"))
            .transpose()?;
        // padded to the embedding's rows (the knot's, not a claimed size)
        let vocab = header
            .meta_str(gkq_format::keys::ROLE_TOKEN_EMBD)
            .and_then(|n| header.blocks.iter().find(|b| b.name == n))
            .and_then(|b| b.shape.first().copied())
            .map_or(0, |v| v as usize);
        kv.extend(gkq_text::gguf_tokenizer_keys(&json, cfg.as_deref(), vocab)?);
    }
    let heads = config["num_attention_heads"].as_u64().unwrap_or(1) as usize;
    let kv_heads = config["num_key_value_heads"]
        .as_u64()
        .map_or(heads, |v| v as usize);
    let mut tensors = Vec::new();
    for b in blocks {
        let name = arch.gguf_name(&b.name).ok_or_else(|| {
            NodeError::Unsupported(format!("tensor {:?} has no llama.cpp name", b.name))
        })?;
        let pairs = arch.decoder.is_some_and(|d| d.gguf_rope_pairs);
        let permute_heads = match arch.layer_part(&b.name) {
            Some((_, Part::Q)) if pairs => Some(heads),
            Some((_, Part::K)) if pairs => Some(kv_heads),
            _ => None,
        };
        tensors.push(Planned {
            name,
            block: b.name.clone(),
            permute_heads,
            widen: b.shape.len() == 1 && matches!(b.dtype, DType::F16 | DType::BF16),
        });
    }
    let g = Gguf {
        version: 3,
        kv,
        kv_bytes: (0, 0),
        tensors: Vec::new(),
        alignment: gguf::DEFAULT_ALIGNMENT,
        data_offset: 0,
    };
    Ok((g, tensors, "derived from config.json".into()))
}

/// Writes the knot `r` reads as the GGUF `out`.
pub fn export_gguf(r: &Reader, out: &Path) -> Result<ExportReport, NodeError> {
    let (meta, planned, from) = plan(r)?;
    let header = r.knot().header().header();
    let mut infos = Vec::new();
    for p in &planned {
        let b = header.block(&p.block).expect("planned from the table");
        let dtype = if p.widen { DType::F32 } else { b.dtype };
        if gguf::ggml_of_dtype(dtype).is_none() {
            return Err(NodeError::Unsupported(format!(
                "tensor {:?} is {dtype}, which GGUF has no type for",
                b.name
            )));
        }
        let len = gkq_format::shape_bytes(&b.shape, dtype).unwrap_or(0);
        infos.push((p.name.clone(), b.shape.clone(), dtype, len));
    }
    let outs: Vec<GgufTensorOut<'_>> = infos
        .iter()
        .map(|(name, shape, dtype, len)| GgufTensorOut {
            name,
            shape,
            dtype: *dtype,
            len: *len,
        })
        .collect();
    let kv = gguf::encode_kv(&meta.kv);
    let head = gguf::write_gguf(
        meta.version,
        (meta.kv.len() as u64, &kv),
        &outs,
        meta.alignment,
    )?;
    let tmp = out.with_file_name(format!(
        ".{}.gkq-tmp",
        out.file_name()
            .map_or_else(|| "out".into(), |n| n.to_string_lossy())
    ));
    let written = write_file(r, &tmp, &head, &planned, meta.alignment);
    let bytes = match written {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, out).map_err(io(out))?;
    Ok(ExportReport {
        path: out.to_path_buf(),
        bytes,
        tensors: planned.len(),
        metadata_keys: meta.kv.len(),
        metadata_from: from,
        knot_id: r.knot_id(),
        fetched_bytes: r.net_stats().payload_bytes,
    })
}

/// The header, then each tensor's verified bytes (pulled in parallel, in
/// order, within the pull's memory budget) and its padding; synced.
fn write_file(
    r: &Reader,
    tmp: &Path,
    head: &[u8],
    planned: &[Planned],
    alignment: u64,
) -> Result<u64, NodeError> {
    let file = std::fs::File::create(tmp).map_err(io(tmp))?;
    let mut w = std::io::BufWriter::with_capacity(8 << 20, file);
    w.write_all(head).map_err(io(tmp))?;
    let mut total = head.len() as u64;
    let plan = planned
        .iter()
        .fold(PullPlan::new().budget(256 << 20), |p, t| {
            p.block(t.block.clone())
        });
    for (p, item) in planned.iter().zip(r.pull(plan)) {
        let Pulled::Block { block, bytes } = item?.1 else {
            return Err(NodeError::Unsupported("the pull gave an lm_head".into()));
        };
        let mut widened = Vec::new();
        let bytes: &[u8] = match p.widen {
            true => {
                gkq_format::cast_row(&bytes, block.dtype, DType::F32, &mut widened).ok_or_else(
                    || NodeError::Unsupported(format!("tensor {:?}: not widened", block.name)),
                )?;
                &widened
            }
            false => &bytes,
        };
        let data = match p.permute_heads {
            Some(heads) => {
                let rows = block.shape.first().copied().unwrap_or(1) as usize;
                permute_rows(bytes, rows, heads).ok_or_else(|| {
                    NodeError::Unsupported(format!(
                        "tensor {:?}: {rows} rows are not whole pairs of {heads} heads",
                        block.name
                    ))
                })?
            }
            None => bytes.to_vec(),
        };
        w.write_all(&data).map_err(io(tmp))?;
        let pad = gguf::padding(data.len() as u64, alignment);
        w.write_all(&vec![0u8; pad]).map_err(io(tmp))?;
        total += (data.len() + pad) as u64;
    }
    let file = w.into_inner().map_err(|e| io(tmp)(e.into_error()))?;
    file.sync_all().map_err(io(tmp))?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permute_matches_llama_cpp() {
        // 1 head of 4 rows (one byte each): rows 0, 1 | 2, 3 → 0, 2, 1, 3
        assert_eq!(permute_rows(&[0, 1, 2, 3], 4, 1), Some(vec![0, 2, 1, 3]));
        // 2 heads of 4
        assert_eq!(
            permute_rows(&[0, 1, 2, 3, 4, 5, 6, 7], 8, 2),
            Some(vec![0, 2, 1, 3, 4, 6, 5, 7])
        );
        assert_eq!(permute_rows(&[0, 1, 2], 3, 1), None);
    }
}
