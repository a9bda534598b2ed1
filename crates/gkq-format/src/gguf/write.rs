//! Writing a GGUF header the way gguf-py's `GGUFWriter` lays it out: the
//! key/value pairs (given already encoded, so that a GGUF's metadata is
//! written back verbatim), the tensor infos with offsets aligned in order,
//! zeros up to the data; each tensor's bytes are then followed by zeros to
//! the next multiple of the alignment ([`padding`]).

use super::{GgufArray, GgufValue, MAGIC, ggml_of_dtype};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A tensor to write.
#[derive(Clone, Copy, Debug)]
pub struct GgufTensorOut<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its shape, outermost first.
    pub shape: &'a [u64],
    /// Its dtype.
    pub dtype: DType,
    /// Its byte length.
    pub len: u64,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_of(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::Str(_) => 8,
        GgufValue::Array(..) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn put_array(out: &mut Vec<u8>, a: &GgufArray) {
    out.extend_from_slice(&a.elem_type().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    fn each<T: Copy, const N: usize>(out: &mut Vec<u8>, v: &[T], f: fn(T) -> [u8; N]) {
        for &x in v {
            out.extend_from_slice(&f(x));
        }
    }
    match a {
        GgufArray::U8(v) => out.extend_from_slice(v),
        GgufArray::I8(v) => each(out, v, i8::to_le_bytes),
        GgufArray::U16(v) => each(out, v, u16::to_le_bytes),
        GgufArray::I16(v) => each(out, v, i16::to_le_bytes),
        GgufArray::U32(v) => each(out, v, u32::to_le_bytes),
        GgufArray::I32(v) => each(out, v, i32::to_le_bytes),
        GgufArray::F32(v) => each(out, v, f32::to_le_bytes),
        GgufArray::Bool(v) => each(out, v, |b| [u8::from(b)]),
        GgufArray::Str(v) => v.iter().for_each(|s| put_str(out, s)),
        GgufArray::U64(v) => each(out, v, u64::to_le_bytes),
        GgufArray::I64(v) => each(out, v, i64::to_le_bytes),
        GgufArray::F64(v) => each(out, v, f64::to_le_bytes),
    }
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::Str(s) => put_str(out, s),
        GgufValue::Array(a) => put_array(out, a),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// The key/value pairs encoded as a GGUF holds them.
pub fn encode_kv(kv: &[(String, GgufValue)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in kv {
        put_str(&mut out, k);
        out.extend_from_slice(&type_of(v).to_le_bytes());
        put_value(&mut out, v);
    }
    out
}

/// Zeros after `len` bytes up to the next multiple of `alignment`.
pub fn padding(len: u64, alignment: u64) -> usize {
    let rem = len.checked_rem(alignment).unwrap_or(0);
    usize::try_from(
        alignment
            .saturating_sub(rem)
            .checked_rem(alignment)
            .unwrap_or(0),
    )
    .unwrap_or(0)
}

/// The header of a GGUF of `version` whose `kv_count` pairs are `kv`
/// (encoded), and whose tensors are `tensors` in this order, each at the
/// next multiple of `alignment` after the one before: everything up to
/// the first tensor's bytes.
pub fn write_gguf(
    version: u32,
    (kv_count, kv): (u64, &[u8]),
    tensors: &[GgufTensorOut<'_>],
    alignment: u64,
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&kv_count.to_le_bytes());
    out.extend_from_slice(kv);
    let mut offset = 0u64;
    for t in tensors {
        let code = ggml_of_dtype(t.dtype).ok_or_else(|| Error::GgufTensor {
            tensor: t.name.to_owned(),
            reason: format!("dtype {} has no GGUF type", t.dtype),
        })?;
        put_str(&mut out, t.name);
        out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for d in t.shape.iter().rev() {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&code.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        let pad = padding(t.len, alignment) as u64;
        offset = offset
            .checked_add(t.len)
            .and_then(|o| o.checked_add(pad))
            .ok_or_else(|| Error::GgufTensor {
                tensor: t.name.to_owned(),
                reason: "the data offsets overflow".into(),
            })?;
    }
    let pad = padding(out.len() as u64, alignment);
    out.resize(out.len().saturating_add(pad), 0);
    Ok(out)
}
