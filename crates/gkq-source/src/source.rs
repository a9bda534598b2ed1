//! A Hugging Face model directory: one `model.safetensors`, or shards listed
//! in `model.safetensors.index.json`.
//!
//! Headers are parsed and validated by the `safetensors` crate over a memory
//! map (only the header pages are touched). Tensor bytes are then read with
//! positioned reads into caller buffers, so memory stays bounded by the
//! buffer size whatever the model size.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use gkq_format::DType;
use safetensors::{Dtype, SafeTensors};

use crate::error::{IoContext, Result, SourceError};

pub use crate::tensors::{SourceFile, SourceTensor};

/// The model's safetensors files and their tensors.
#[derive(Debug)]
pub struct SourceModel {
    /// The model directory.
    pub dir: PathBuf,
    /// Files in name order (a GGUF's shards in shard order).
    pub files: Vec<SourceFile>,
    /// The GGUF headers, when the model is GGUF.
    pub gguf: Option<crate::gguf::GgufModel>,
    /// Tensors in file order, then offset order: the order of their bytes.
    pub tensors: Vec<SourceTensor>,
    by_name: HashMap<String, usize>,
}

/// Maps a safetensors dtype to the knot's, if GKQ v2 carries it.
pub fn map_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::U8,
        Dtype::I8 => DType::I8,
        Dtype::F8_E5M2 => DType::F8E5M2,
        Dtype::F8_E4M3 => DType::F8E4M3,
        Dtype::I16 => DType::I16,
        Dtype::U16 => DType::U16,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::U32 => DType::U32,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::I64 => DType::I64,
        Dtype::U64 => DType::U64,
        _ => return None,
    })
}

/// The tensors a safetensors file declares (validated by the `safetensors`
/// crate: offsets in order, within the file, matching the shapes), and where
/// its data starts; `path` only names the file in errors.
fn parse_header(path: &Path, bytes: &[u8]) -> Result<(u64, Vec<SourceTensor>)> {
    let (n, meta) =
        SafeTensors::read_metadata(bytes).map_err(|source| SourceError::SafetensorsHeader {
            path: path.to_path_buf(),
            source,
        })?;
    let data_start = 8u64.saturating_add(n as u64);
    let infos = meta.tensors();
    let mut tensors = Vec::with_capacity(infos.len());
    for name in meta.offset_keys() {
        let Some(info) = infos.get(&name) else {
            continue;
        };
        let dtype = map_dtype(info.dtype).ok_or_else(|| SourceError::UnsupportedDtype {
            path: path.to_path_buf(),
            tensor: name.clone(),
            dtype: format!("{:?}", info.dtype),
        })?;
        let (s, e) = info.data_offsets;
        tensors.push(SourceTensor {
            name,
            file: 0,
            dtype,
            shape: info.shape.iter().map(|&d| d as u64).collect(),
            offset: data_start.saturating_add(s as u64),
            len: e.saturating_sub(s) as u64,
            pad: 0,
        });
    }
    tensors.sort_by_key(|t| t.offset);
    Ok((data_start, tensors))
}

/// The tensors of a whole safetensors file held in memory (what
/// [`SourceModel::open`] reads from each file's header; for fuzzing and
/// tools that have the bytes).
pub fn header_tensors(bytes: &[u8]) -> Result<Vec<SourceTensor>> {
    parse_header(Path::new("<bytes>"), bytes).map(|(_, t)| t)
}

fn open_file(dir: &Path, name: &str) -> Result<(SourceFile, Vec<SourceTensor>)> {
    let path = dir.join(name);
    // A FIFO or device would block or never end: refuse it before opening.
    match std::fs::metadata(&path) {
        Ok(m) if !m.is_file() => {
            return Err(SourceError::Safetensors {
                path,
                reason: "not a regular file".into(),
            });
        }
        _ => {}
    }
    let file = File::open(&path).at(&path)?;
    let len = file.metadata().at(&path)?.len();
    // SAFETY: the map is read-only and only used to let the safetensors crate
    // parse and validate the header; tensor bytes are read with pread. The
    // file must not be truncated while packing (the same contract as every
    // mmap-based safetensors loader).
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }.at(&path)?;
    let (data_start, tensors) = parse_header(&path, &map)?;
    drop(map);
    Ok((
        SourceFile {
            name: name.to_owned(),
            path,
            file,
            len,
            data_start,
        },
        tensors,
    ))
}

/// The longest `model.safetensors.index.json` read: 16 MiB (one of a model
/// of 100,000 tensors is about 10 MiB).
pub const MAX_INDEX_BYTES: u64 = 16 << 20;

/// `model.safetensors.index.json`: its weight map (tensor → shard), each
/// shard a plain file name that exists in `dir`.
fn read_index(dir: &Path, index_path: &Path) -> Result<BTreeMap<String, String>> {
    let err = |reason: String| SourceError::Index {
        path: index_path.to_path_buf(),
        reason,
    };
    let text = gkq_files::read_text(
        index_path,
        MAX_INDEX_BYTES,
        "a safetensors index",
        gkq_files::Follow::Yes,
    )?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| SourceError::IndexJson {
            path: index_path.to_path_buf(),
            source,
        })?;
    let map = v["weight_map"]
        .as_object()
        .ok_or_else(|| err("weight_map is missing or not an object".into()))?;
    let mut wm = BTreeMap::new();
    for (t, f) in map {
        let f = f
            .as_str()
            .ok_or_else(|| err(format!("weight_map[{t:?}] is not a string")))?;
        if f.contains('/') || f.starts_with('.') {
            return Err(err(format!("shard name {f:?} is not a plain file name")));
        }
        wm.insert(t.clone(), f.to_owned());
    }
    for s in wm.values().collect::<BTreeSet<_>>() {
        let p = dir.join(s);
        if !p.is_file() {
            return Err(SourceError::MissingShard {
                index: index_path.to_path_buf(),
                shard: s.clone(),
                path: p,
            });
        }
    }
    Ok(wm)
}

/// No safetensors in `dir`: say so, and what to do with pickled weights.
fn no_weights(dir: &Path) -> SourceError {
    let pickled = ["pytorch_model.bin", "pytorch_model.bin.index.json"]
        .iter()
        .find(|n| dir.join(n).is_file());
    SourceError::NoWeights {
        dir: dir.to_path_buf(),
        hint: pickled.map_or_else(String::new, |n| {
            format!(
                "; found {n}: gkq-pack reads safetensors only (pickled PyTorch weights can run code when loaded). Convert with transformers: AutoModel.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)"
            )
        }),
    }
}

impl SourceModel {
    /// Opens and validates a model: `path` is a directory of safetensors
    /// files (or, without them, of one GGUF or its shards), or a `.gguf`
    /// file (with its shards, when it is one).
    pub fn open(path: &Path) -> Result<SourceModel> {
        let safetensors = path.is_dir()
            && (path.join("model.safetensors").is_file()
                || path.join("model.safetensors.index.json").exists());
        if !safetensors && let Some((dir, names)) = crate::gguf::files_of(path)? {
            return SourceModel::open_gguf(&dir, &names);
        }
        SourceModel::open_safetensors(path)
    }

    /// Opens GGUF files `names` of `dir`, in shard order.
    fn open_gguf(dir: &Path, names: &[String]) -> Result<SourceModel> {
        let mut files = Vec::new();
        let mut tensors: Vec<SourceTensor> = Vec::new();
        let mut headers = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (i, name) in names.iter().enumerate() {
            let (f, ts, g) = crate::gguf::open_gguf(dir, name, i)?;
            for t in ts {
                if by_name.insert(t.name.clone(), tensors.len()).is_some() {
                    return Err(SourceError::Gguf {
                        path: f.path.clone(),
                        reason: format!("tensor {:?} is in two shards", t.name),
                    });
                }
                tensors.push(t);
            }
            files.push(f);
            headers.push(g);
        }
        crate::gguf::check_splits(dir, names, &headers, tensors.len())?;
        Ok(SourceModel {
            dir: dir.to_path_buf(),
            files,
            gguf: Some(crate::gguf::GgufModel { headers }),
            tensors,
            by_name,
        })
    }

    /// Opens and validates every safetensors file of `dir`.
    fn open_safetensors(dir: &Path) -> Result<SourceModel> {
        let index_path = dir.join("model.safetensors.index.json");
        let mut expected: Option<BTreeMap<String, String>> = None;
        let names: Vec<String> = if index_path.exists() {
            let wm = read_index(dir, &index_path)?;
            let shards: BTreeSet<String> = wm.values().cloned().collect();
            expected = Some(wm);
            shards.into_iter().collect()
        } else if dir.join("model.safetensors").is_file() {
            vec!["model.safetensors".to_owned()]
        } else {
            return Err(no_weights(dir));
        };
        let mut files = Vec::new();
        let mut tensors: Vec<SourceTensor> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (i, name) in names.iter().enumerate() {
            let (file, ts) = open_file(dir, name)?;
            for mut t in ts {
                t.file = i;
                if let Some(&prev) = by_name.get(&t.name) {
                    let first = tensors
                        .get(prev)
                        .and_then(|p| files.get(p.file))
                        .map_or_else(PathBuf::new, |f: &SourceFile| f.path.clone());
                    return Err(SourceError::DuplicateTensor {
                        tensor: t.name,
                        first,
                        second: file.path.clone(),
                    });
                }
                by_name.insert(t.name.clone(), tensors.len());
                tensors.push(t);
            }
            files.push(file);
        }
        if let Some(wm) = expected {
            for (t, shard) in wm {
                let found = by_name
                    .get(&t)
                    .and_then(|&i| tensors.get(i))
                    .and_then(|x| files.get(x.file))
                    .is_some_and(|f| f.name == shard);
                if !found {
                    return Err(SourceError::IndexTensorMissing {
                        index: index_path.clone(),
                        tensor: t,
                        shard,
                    });
                }
            }
        }
        Ok(SourceModel {
            dir: dir.to_path_buf(),
            files,
            gguf: None,
            tensors,
            by_name,
        })
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&SourceTensor> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// Sum of the source file sizes.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }

    /// The file holding `t`.
    pub fn file_of(&self, t: &SourceTensor) -> &SourceFile {
        self.files
            .get(t.file)
            .expect("tensor file index is set by open()")
    }

    /// Reads `buf.len()` bytes of `t` starting `at` bytes into the tensor.
    pub fn read(&self, t: &SourceTensor, at: u64, buf: &mut [u8]) -> Result<()> {
        let f = self.file_of(t);
        f.file
            .read_exact_at(buf, t.offset.saturating_add(at))
            .at(&f.path)
    }

    /// Reads the bytes after `t` that belong to no tensor (`t.pad`).
    pub fn read_pad(&self, t: &SourceTensor) -> Result<Vec<u8>> {
        let f = self.file_of(t);
        let mut buf = vec![0u8; usize::try_from(t.pad).unwrap_or(0)];
        f.file
            .read_exact_at(&mut buf, t.offset.saturating_add(t.len))
            .at(&f.path)?;
        Ok(buf)
    }

    /// Reads the first `data_start` bytes of file `i` (its header).
    pub fn read_header(&self, i: usize) -> Result<Vec<u8>> {
        let f = self.files.get(i).expect("file index in range");
        let mut buf = vec![0u8; usize::try_from(f.data_start).expect("header fits in memory")];
        f.file.read_exact_at(&mut buf, 0).at(&f.path)?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(dir: &Path, json: &str) -> Result<BTreeMap<String, String>> {
        let p = dir.join("model.safetensors.index.json");
        std::fs::write(&p, json).expect("write");
        read_index(dir, &p)
    }

    #[test]
    fn shard_index_rules() {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        std::fs::write(d.join("a.safetensors"), b"").expect("shard");
        let wm = index(
            d,
            r#"{"weight_map":{"x":"a.safetensors","y":"a.safetensors"}}"#,
        )
        .expect("valid");
        assert_eq!(wm.len(), 2);
        let err = |json: &str| index(d, json).expect_err(json).to_string();
        assert!(err("{").contains("invalid JSON"));
        assert!(err(r#"{"metadata":{}}"#).contains("weight_map is missing"));
        assert!(err(r#"{"weight_map":{"x":1}}"#).contains("is not a string"));
        assert!(
            err(r#"{"weight_map":{"x":"../a.safetensors"}}"#).contains("not a plain file name")
        );
        let missing = index(d, r#"{"weight_map":{"x":"b.safetensors"}}"#).expect_err("missing");
        assert!(
            matches!(missing, SourceError::MissingShard { .. }),
            "{missing}"
        );
    }

    #[test]
    fn pickled_weights_get_a_conversion_hint() {
        let dir = tempfile::tempdir().expect("tmp");
        assert!(!no_weights(dir.path()).to_string().contains("pickled"));
        std::fs::write(dir.path().join("pytorch_model.bin"), b"").expect("bin");
        let e = no_weights(dir.path()).to_string();
        assert!(
            e.contains("pytorch_model.bin") && e.contains("safe_serialization=True"),
            "{e}"
        );
    }
}
