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
    /// Type 9: an array of one element type (never of arrays: llama.cpp
    /// and gguf-py read none), held as one vector of that type.
    Array(GgufArray),
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

    /// The array, if it is one.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A metadata array: its elements in one vector of their type, so that an
/// array costs about as much memory as its bytes in the file (a string
/// array is one buffer of text and one end offset per string).
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    /// Of type 0.
    U8(Vec<u8>),
    /// Of type 1.
    I8(Vec<i8>),
    /// Of type 2.
    U16(Vec<u16>),
    /// Of type 3.
    I16(Vec<i16>),
    /// Of type 4.
    U32(Vec<u32>),
    /// Of type 5.
    I32(Vec<i32>),
    /// Of type 6.
    F32(Vec<f32>),
    /// Of type 7.
    Bool(Vec<bool>),
    /// Of type 8.
    Str(GgufStrings),
    /// Of type 10.
    U64(Vec<u64>),
    /// Of type 11.
    I64(Vec<i64>),
    /// Of type 12.
    F64(Vec<f64>),
}

impl GgufArray {
    /// The GGUF value type of the elements.
    pub fn elem_type(&self) -> u32 {
        match self {
            GgufArray::U8(_) => 0,
            GgufArray::I8(_) => 1,
            GgufArray::U16(_) => 2,
            GgufArray::I16(_) => 3,
            GgufArray::U32(_) => 4,
            GgufArray::I32(_) => 5,
            GgufArray::F32(_) => 6,
            GgufArray::Bool(_) => 7,
            GgufArray::Str(_) => 8,
            GgufArray::U64(_) => 10,
            GgufArray::I64(_) => 11,
            GgufArray::F64(_) => 12,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::Str(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The strings, for an array of strings.
    pub fn strings(&self) -> Option<&GgufStrings> {
        match self {
            GgufArray::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Element `i` as an integer, for an array of integers (a negative
    /// one is `None`).
    pub fn u64_at(&self, i: usize) -> Option<u64> {
        match self {
            GgufArray::U8(v) => v.get(i).map(|&x| u64::from(x)),
            GgufArray::U16(v) => v.get(i).map(|&x| u64::from(x)),
            GgufArray::U32(v) => v.get(i).map(|&x| u64::from(x)),
            GgufArray::U64(v) => v.get(i).copied(),
            GgufArray::I8(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            GgufArray::I16(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            GgufArray::I32(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            GgufArray::I64(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            _ => None,
        }
    }

    /// Element `i` as a float, for an array of numbers.
    pub fn f64_at(&self, i: usize) -> Option<f64> {
        match self {
            GgufArray::F32(v) => v.get(i).map(|&x| f64::from(x)),
            GgufArray::F64(v) => v.get(i).copied(),
            _ => self.u64_at(i).map(|x| x as f64),
        }
    }
}

/// The strings of a string array: their text back to back, and where each ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GgufStrings {
    text: String,
    ends: Vec<usize>,
}

impl GgufStrings {
    /// An empty list with room for `n` strings.
    pub fn with_capacity(n: usize) -> GgufStrings {
        GgufStrings {
            text: String::new(),
            ends: Vec::with_capacity(n),
        }
    }

    /// Appends `s`.
    pub fn push(&mut self, s: &str) {
        self.text.push_str(s);
        self.ends.push(self.text.len());
    }

    /// The number of strings.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// String `i`.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = match i.checked_sub(1) {
            Some(p) => *self.ends.get(p)?,
            None => 0,
        };
        self.text.get(start..end)
    }

    /// The strings in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

impl<'a> FromIterator<&'a str> for GgufStrings {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> GgufStrings {
        let mut out = GgufStrings::default();
        for s in iter {
            out.push(s);
        }
        out
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
    if let Some(d) = crate::quant::of_ggml(code) {
        return Some(d);
    }
    Some(match code {
        0 => DType::F32,
        1 => DType::F16,
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
