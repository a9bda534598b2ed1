//! GGUF, llama.cpp's file format (versions 2 and 3, little-endian), as
//! gguf-py and ggml define it: the header (magic, version, tensor and
//! key/value counts), the key/value metadata of every value type, the
//! tensor infos, and the tensor data at `general.alignment` (default 32).
//! [`Gguf::parse`] checks what a hostile file can get wrong before any
//! count is trusted; [`write`] writes one back (the metadata verbatim).
//!
//! Tensor shapes are given outermost first here, as in the knot (GGUF lists
//! `ne[0]`, the innermost dimension, first).

mod parse;
mod write;

pub use write::{GgufTensorOut, encode_kv, padding, write_gguf};

use crate::dtype::DType;

/// `"GGUF"`.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's limit on a tensor's dimensions.
pub const MAX_DIMS: u32 = 4;

/// A metadata value (gguf-py's `GGUFValueType`).
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7 (one byte, 0 or 1).
    Bool(bool),
    /// Type 8.
    Str(String),
    /// Type 9: the element type and the elements.
    Array(u32, Vec<GgufValue>),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(u64::from(v)),
            GgufValue::U16(v) => Some(u64::from(v)),
            GgufValue::U32(v) => Some(u64::from(v)),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(f64::from(v)),
            GgufValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// One tensor info.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensor {
    /// The name (`token_embd.weight`, `blk.0.attn_q.weight`, …).
    pub name: String,
    /// The shape, outermost first.
    pub shape: Vec<u64>,
    /// ggml's type code.
    pub ggml_type: u32,
    /// The knot dtype of that type.
    pub dtype: DType,
    /// Absolute offset of its bytes in the file.
    pub offset: u64,
    /// Its byte length.
    pub len: u64,
}

/// A parsed GGUF header.
#[derive(Clone, Debug)]
pub struct Gguf {
    /// 2 or 3.
    pub version: u32,
    /// The key/value pairs, in file order.
    pub kv: Vec<(String, GgufValue)>,
    /// Where the key/value pairs lie in the file (`start..end`), verbatim.
    pub kv_bytes: (u64, u64),
    /// The tensors, in the order of their infos.
    pub tensors: Vec<GgufTensor>,
    /// `general.alignment`, or 32.
    pub alignment: u64,
    /// Absolute offset of the tensor data.
    pub data_offset: u64,
}

impl Gguf {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(GgufValue::as_str)
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// The knot dtype of ggml type `code`, if the knot has it.
pub fn dtype_of_ggml(code: u32) -> Option<DType> {
    Some(match code {
        0 => DType::F32,
        1 => DType::F16,
        2 => DType::Q4_0,
        3 => DType::Q4_1,
        6 => DType::Q5_0,
        7 => DType::Q5_1,
        8 => DType::Q8_0,
        12 => DType::Q4_K,
        13 => DType::Q5_K,
        14 => DType::Q6_K,
        24 => DType::I8,
        25 => DType::I16,
        26 => DType::I32,
        27 => DType::I64,
        28 => DType::F64,
        30 => DType::BF16,
        _ => return None,
    })
}

/// ggml's type code of a knot dtype, if GGUF has it.
pub fn ggml_of_dtype(dtype: DType) -> Option<u32> {
    (0..=30).find(|&c| dtype_of_ggml(c) == Some(dtype))
}

/// ggml's name of type `code` (for messages).
pub fn ggml_type_name(code: u32) -> String {
    match code {
        9 => "Q8_1".into(),
        10 => "Q2_K".into(),
        11 => "Q3_K".into(),
        15 => "Q8_K".into(),
        16..=23 | 29 | 31..=39 => format!("type {code} (an IQ, TQ or MXFP type)"),
        c => {
            dtype_of_ggml(c).map_or_else(|| format!("type {c}"), |d| d.name().to_ascii_uppercase())
        }
    }
}

#[cfg(test)]
mod tests;
