//! The files and tensors of a source model, whatever its format: what the
//! safetensors reader (`source.rs`) and the GGUF reader (`gguf.rs`) both
//! produce.

use std::fs::File;
use std::path::PathBuf;

use gkq_format::DType;

/// One weights file (safetensors or GGUF).
#[derive(Debug)]
pub struct SourceFile {
    /// File name relative to the model directory.
    pub name: String,
    /// Full path.
    pub path: PathBuf,
    pub(crate) file: File,
    /// File length.
    pub len: u64,
    /// Where tensor data starts: `8 + header length` in safetensors, the
    /// first tensor's offset in GGUF (the bytes before are the header).
    pub data_start: u64,
}

impl SourceFile {
    pub(crate) fn new(name: String, path: PathBuf, file: File, len: u64, data_start: u64) -> Self {
        SourceFile {
            name,
            path,
            file,
            len,
            data_start,
        }
    }
}

/// One tensor of the source model.
#[derive(Clone, Debug)]
pub struct SourceTensor {
    /// Tensor name.
    pub name: String,
    /// Index into [`SourceModel::files`](crate::SourceModel::files).
    pub file: usize,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// Absolute offset of its bytes in the file.
    pub offset: u64,
    /// Byte length.
    pub len: u64,
    /// Bytes after it that belong to no tensor, up to the next tensor or
    /// the end of the file (a GGUF's alignment padding; 0 in safetensors,
    /// whose tensors are contiguous). A file's digest covers them.
    pub pad: u64,
}
