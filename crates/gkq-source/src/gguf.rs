//! A GGUF model: one `.gguf` file, or the shards of one
//! (`NAME-00001-of-0000N.gguf`), opened as a [`crate::SourceModel`] whose
//! tensors keep their types and bytes; the metadata of the first file, and
//! what packing derives from it (the roles, a `config.json` for the
//! architectures gkq-decode runs).

use std::fs::File;
use std::path::{Path, PathBuf};

use gkq_format::arch::{self, Derived};
use gkq_format::gguf::{Gguf, GgufValue};
use serde_json::{Value, json};

use crate::config::ModelConfig;
use crate::error::{IoContext, Result, SourceError};
use crate::tensors::{SourceFile, SourceTensor};

/// What a GGUF source adds to the model: each file's parsed header.
#[derive(Debug)]
pub struct GgufModel {
    /// The header of each file, in shard order.
    pub headers: Vec<Gguf>,
}

/// Whether `path` names a GGUF file.
pub fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// `(stem, n, count)` of a shard name `STEM-0000n-of-0000N.gguf`.
fn shard_of(name: &str) -> Option<(&str, u32, u32)> {
    let base = name.strip_suffix(".gguf")?;
    let (rest, count) = base.rsplit_once("-of-")?;
    let (stem, n) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(n) || !digits(count) {
        return None;
    }
    Some((stem, n.parse().ok()?, count.parse().ok()?))
}

/// The GGUF files to open for `path` (a `.gguf` file, or a directory
/// holding one GGUF or one set of shards), as names in `dir`.
pub fn files_of(path: &Path) -> Result<Option<(PathBuf, Vec<String>)>> {
    let (dir, named) = if path.is_file() {
        if !is_gguf(path) {
            return Ok(None);
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        (dir.to_path_buf(), name)
    } else {
        (path.to_path_buf(), None)
    };
    let mut all: Vec<String> = std::fs::read_dir(&dir)
        .at(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| is_gguf(Path::new(n)))
        .collect();
    all.sort();
    let err = |reason: String| SourceError::Gguf {
        path: dir.clone(),
        reason,
    };
    let first = match &named {
        Some(n) => n.clone(),
        None => match all.as_slice() {
            [] => return Ok(None),
            [one] => one.clone(),
            many => {
                let stems: std::collections::BTreeSet<_> = many
                    .iter()
                    .map(|n| shard_of(n).map_or(n.as_str(), |s| s.0))
                    .collect();
                if stems.len() > 1 {
                    return Err(err(format!(
                        "{} GGUF files ({}): name the one to pack",
                        many.len(),
                        many.join(", ")
                    )));
                }
                many[0].clone()
            }
        },
    };
    let Some((stem, _, count)) = shard_of(&first) else {
        return Ok(Some((dir, vec![first])));
    };
    let names: Vec<String> = (1..=count)
        .map(|k| format!("{stem}-{k:05}-of-{count:05}.gguf"))
        .collect();
    if let Some(missing) = names.iter().find(|n| !all.contains(n)) {
        return Err(err(format!("shard {missing} of {first} is missing")));
    }
    Ok(Some((dir, names)))
}

/// Opens one GGUF file: its header (checked), its tensors in offset order
/// with the bytes between them, and the file.
pub(crate) fn open_gguf(
    dir: &Path,
    name: &str,
    index: usize,
) -> Result<(SourceFile, Vec<SourceTensor>, Gguf)> {
    let path = dir.join(name);
    if std::fs::metadata(&path).is_ok_and(|m| !m.is_file()) {
        return Err(SourceError::Gguf {
            path,
            reason: "not a regular file".into(),
        });
    }
    let file = File::open(&path).at(&path)?;
    let len = file.metadata().at(&path)?.len();
    // SAFETY: a read-only map, used only while the header is parsed and
    // checked; tensor bytes are then read with pread (the contract of every
    // mmap-based loader: the file must not be truncated meanwhile).
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }.at(&path)?;
    let g = Gguf::parse(&map).map_err(|e| SourceError::Gguf {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    drop(map);
    let mut tensors: Vec<SourceTensor> = g
        .tensors
        .iter()
        .map(|t| SourceTensor {
            name: t.name.clone(),
            file: index,
            dtype: t.dtype,
            shape: t.shape.clone(),
            offset: t.offset,
            len: t.len,
            pad: 0,
        })
        .collect();
    tensors.sort_by_key(|t| t.offset);
    let ends: Vec<u64> = tensors
        .iter()
        .skip(1)
        .map(|t| t.offset)
        .chain(std::iter::once(len))
        .collect();
    for (t, next) in tensors.iter_mut().zip(ends) {
        t.pad = next.saturating_sub(t.offset.saturating_add(t.len));
    }
    let data_start = tensors.first().map_or(len, |t| t.offset);
    let f = SourceFile::new(name.to_owned(), path, file, len, data_start);
    Ok((f, tensors, g))
}

/// A `split.*` key of a GGUF, as llama.cpp reads it.
fn split_key(g: &Gguf, key: &str) -> Option<u64> {
    g.get(key).and_then(GgufValue::as_u64)
}

/// Checks the `split.*` keys of a GGUF or of its shards as llama.cpp's
/// loader does: each shard's `split.no` is its place (0 for the first),
/// `split.count` is the number of files, and the first file's
/// `split.tensors.count` the tensors of all of them; a lone file that says
/// it is one of several is refused. The message names the shard and key.
pub(crate) fn check_splits(
    dir: &Path,
    names: &[String],
    headers: &[Gguf],
    tensors: usize,
) -> Result<()> {
    let bad = |i: usize, reason: String| SourceError::Gguf {
        path: dir.join(names.get(i).map_or("", String::as_str)),
        reason,
    };
    let Some(first) = headers.first() else {
        return Ok(());
    };
    let count = split_key(first, "split.count");
    if headers.len() == 1 {
        return match count {
            Some(n) if n > 1 => Err(bad(
                0,
                format!(
                    "split.count is {n}: this file is one of {n} shards; give the first shard (NAME-00001-of-{n:05}.gguf) with the others beside it"
                ),
            )),
            _ => Ok(()),
        };
    }
    for (i, g) in headers.iter().enumerate() {
        match split_key(g, "split.no") {
            Some(no) if no == i as u64 => {}
            Some(no) => {
                return Err(bad(
                    i,
                    format!(
                        "split.no is {no}, but this is shard {} of {}",
                        i + 1,
                        headers.len()
                    ),
                ));
            }
            None => {
                return Err(bad(
                    i,
                    "split.no is missing: not a shard of a split GGUF".into(),
                ));
            }
        }
        match split_key(g, "split.count") {
            Some(n) if n == headers.len() as u64 => {}
            Some(n) => {
                return Err(bad(
                    i,
                    format!("split.count is {n}, but there are {} shards", headers.len()),
                ));
            }
            None if i == 0 => return Err(bad(i, "split.count is missing".into())),
            None => {}
        }
    }
    match split_key(first, "split.tensors.count") {
        Some(n) if n == tensors as u64 => Ok(()),
        Some(n) => Err(bad(
            0,
            format!("split.tensors.count is {n}, but the shards hold {tensors} tensors"),
        )),
        None => Err(bad(0, "split.tensors.count is missing".into())),
    }
}

impl GgufModel {
    /// The first file's header (the one with the model's metadata).
    pub fn first(&self) -> &Gguf {
        self.headers.first().expect("a GGUF model has a file")
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> &str {
        self.first().architecture().unwrap_or("")
    }

    /// The first file's metadata as a GGUF of its own, with no tensors:
    /// the version, the key/value pairs verbatim (`metadata.gguf`, which a
    /// package carries so that an export gives the same metadata back).
    pub fn metadata_file(&self) -> Vec<u8> {
        let g = self.first();
        let kv = gkq_format::gguf::encode_kv(&g.kv);
        gkq_format::gguf::write_gguf(g.version, (g.kv.len() as u64, &kv), &[], g.alignment)
            .expect("no tensors to place")
    }

    /// `{arch}.KEY` as a number.
    fn num(&self, key: &str) -> Option<f64> {
        let g = self.first();
        g.get(&format!("{}.{key}", self.architecture()))
            .and_then(GgufValue::as_f64)
    }

    /// The `config.json` gkq-decode needs, for the architectures it runs
    /// (the table's keys, `gkq_format::arch`); `None` for the others.
    /// `embed` is the token embedding's shape.
    pub fn derived_config(&self, embed: &[u64], tied: bool) -> Result<Option<Value>> {
        let Some(arch) = arch::by_gguf(self.architecture()) else {
            return Ok(None);
        };
        let Some(decoder) = arch.decoder else {
            return Ok(None);
        };
        let need = |key: &str| {
            self.num(key).ok_or_else(|| SourceError::Gguf {
                path: PathBuf::from("metadata"),
                reason: format!(
                    "{}.{key} is missing: gkq-decode needs it to run the model",
                    self.architecture()
                ),
            })
        };
        self.check_rope(decoder)?;
        let heads = need("attention.head_count")?;
        let hidden = need("embedding_length")?;
        let mut cfg = json!({
            "architectures": [arch.hf_class],
            "model_type": arch.hf_model_types.first(),
            "hidden_size": hidden as u64,
            "intermediate_size": need("feed_forward_length")? as u64,
            "num_hidden_layers": need("block_count")? as u64,
            "num_attention_heads": heads as u64,
            "num_key_value_heads": self.num("attention.head_count_kv").unwrap_or(heads) as u64,
            "rms_norm_eps": need("attention.layer_norm_rms_epsilon")?,
            "rope_theta": self.num("rope.freq_base").unwrap_or(10_000.0),
            "max_position_embeddings": self.num("context_length").unwrap_or(2048.0) as u64,
            "vocab_size": embed.first().copied().unwrap_or(0),
            "tie_word_embeddings": tied,
            "gguf_architecture": self.architecture(),
        });
        if let Some(hd) = self.num("attention.key_length") {
            cfg["head_dim"] = json!(hd as u64);
        }
        for key in decoder.derived {
            let value = match (self.num(key.gguf), key.default) {
                (Some(v), _) | (None, Derived::Value(v)) => v,
                (None, Derived::HeadDim) => hidden / heads,
                (None, Derived::Omit) => continue,
            };
            cfg[key.config] = if key.integer {
                json!(value as u64)
            } else {
                json!(value)
            };
        }
        for (key, value) in decoder.derived_constants {
            cfg[*key] = serde_json::from_str(value).expect("the table's constants are JSON");
        }
        Ok(Some(cfg))
    }

    /// Refuses a rope scaling the architecture's row does not implement:
    /// `{arch}.rope.scaling.type`, or the per-dimension frequency factors
    /// llama.cpp's converter stores as `rope_freqs.weight` for Llama 3's.
    fn check_rope(&self, decoder: &arch::Decoder) -> Result<()> {
        let key = format!("{}.rope.scaling.type", self.architecture());
        let kind = self.first().get(&key).and_then(GgufValue::as_str);
        let freqs = "rope_freqs.weight";
        let checked = match kind {
            Some(k) => decoder.check_rope_scaling(&key, k, &format!("{k:?}")),
            None if self
                .headers
                .iter()
                .any(|h| h.tensors.iter().any(|t| t.name == freqs)) =>
            {
                decoder.check_rope_scaling(freqs, "llama3", "present (Llama 3's rope scaling)")
            }
            None => Ok(()),
        };
        checked.map_err(|u| SourceError::Gguf {
            path: PathBuf::from("metadata"),
            reason: format!("{u}: a package of it would decode wrong text"),
        })
    }

    /// What packing needs of a config: the roles come from llama.cpp's
    /// tensor names (`token_embd.weight`, `output.weight`).
    pub fn model_config(&self, path: &Path, embed: Option<&[u64]>, tied: bool) -> ModelConfig {
        let name = self.architecture();
        let arch = arch::by_gguf(name);
        ModelConfig {
            path: path.to_path_buf(),
            architecture: arch.map_or_else(|| format!("gguf:{name}"), |a| a.hf_class.to_owned()),
            model_type: name.to_owned(),
            arch,
            roles: Some(arch::GGUF_ROLES),
            from_gguf: true,
            vocab_size: embed.and_then(|s| s.first()).copied().unwrap_or(0),
            hidden_size: embed.and_then(|s| s.get(1)).copied(),
            tie_word_embeddings: tied,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names() {
        assert_eq!(shard_of("m-00002-of-00003.gguf"), Some(("m", 2, 3)));
        assert_eq!(
            shard_of("qwen-q4-00001-of-00010.gguf"),
            Some(("qwen-q4", 1, 10))
        );
        assert_eq!(shard_of("m.gguf"), None);
        assert_eq!(shard_of("m-2-of-3.gguf"), None);
    }
}
