//! Reading a GGUF header. Every count is checked against the bytes left
//! before anything is allocated for it, every length before it is read.

use std::collections::HashSet;

use super::{
    DEFAULT_ALIGNMENT, Gguf, GgufArray, GgufStrings, GgufTensor, GgufValue, MAGIC, MAX_DIMS,
    dtype_of_ggml,
};
use crate::error::{Error, Result};

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

fn header_err(at: usize, reason: impl Into<String>) -> Error {
    Error::Gguf {
        at: at as u64,
        reason: reason.into(),
    }
}

impl<'a> Cursor<'a> {
    fn left(&self) -> usize {
        self.b.len().saturating_sub(self.at)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let Some(end) = end else {
            return Err(header_err(
                self.at,
                format!(
                    "truncated: {what} needs {n} bytes, {} are left",
                    self.left()
                ),
            ));
        };
        let s = self.b.get(self.at..end).unwrap_or_default();
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A string: a u64 length, then that many bytes of UTF-8.
    fn string(&mut self, what: &str) -> Result<String> {
        self.str_slice(what).map(str::to_owned)
    }

    /// A string, borrowed from the bytes.
    fn str_slice(&mut self, what: &str) -> Result<&'a str> {
        let at = self.at;
        let n = self.u64(what)?;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.left())
            .ok_or_else(|| {
                header_err(
                    at,
                    format!(
                        "{what}: a string of {n} bytes, past the end ({} left)",
                        self.left()
                    ),
                )
            })?;
        let s = self.take(n, what)?;
        std::str::from_utf8(s).map_err(|_| header_err(at, format!("{what} is not UTF-8")))
    }
}

/// `n` elements of a fixed size read with `f`, into one vector.
fn fixed<T, const N: usize>(
    c: &mut Cursor<'_>,
    n: usize,
    key: &str,
    f: fn([u8; N]) -> T,
) -> Result<Vec<T>> {
    let bytes = c.take(n.saturating_mul(N), key)?;
    Ok(bytes
        .chunks_exact(N)
        .map(|b| {
            let mut a = [0u8; N];
            a.copy_from_slice(b);
            f(a)
        })
        .collect())
}

/// An array's element type, count and elements, each count checked
/// against the bytes left before anything is allocated for it; an array
/// of arrays is refused, as llama.cpp refuses it.
fn array(c: &mut Cursor<'_>, key: &str) -> Result<GgufArray> {
    let bad = |reason: String| Error::GgufKey {
        key: key.to_owned(),
        reason,
    };
    let elem = c.u32(key)?;
    if elem == 9 {
        return Err(bad(
            "an array of arrays (llama.cpp and gguf-py read none)".into()
        ));
    }
    let min = min_size(elem).ok_or_else(|| bad(format!("unknown array element type {elem}")))?;
    let n = c.u64(key)?;
    let Some(n) = usize::try_from(n)
        .ok()
        .filter(|&n| Some(n) <= c.left().checked_div(min))
    else {
        return Err(bad(format!(
            "an array of {n} elements cannot fit in the {} bytes left",
            c.left()
        )));
    };
    Ok(match elem {
        0 => GgufArray::U8(fixed(c, n, key, u8::from_le_bytes)?),
        1 => GgufArray::I8(fixed(c, n, key, i8::from_le_bytes)?),
        2 => GgufArray::U16(fixed(c, n, key, u16::from_le_bytes)?),
        3 => GgufArray::I16(fixed(c, n, key, i16::from_le_bytes)?),
        4 => GgufArray::U32(fixed(c, n, key, u32::from_le_bytes)?),
        5 => GgufArray::I32(fixed(c, n, key, i32::from_le_bytes)?),
        6 => GgufArray::F32(fixed(c, n, key, f32::from_le_bytes)?),
        7 => {
            let raw = fixed(c, n, key, |[b]: [u8; 1]| b)?;
            if let Some(b) = raw.iter().find(|&&b| b > 1) {
                return Err(bad(format!("a bool of byte {b}, not 0 or 1")));
            }
            GgufArray::Bool(raw.into_iter().map(|b| b == 1).collect())
        }
        8 => {
            let mut out = GgufStrings::with_capacity(n);
            for _ in 0..n {
                out.push(c.str_slice(key)?);
            }
            GgufArray::Str(out)
        }
        10 => GgufArray::U64(fixed(c, n, key, u64::from_le_bytes)?),
        11 => GgufArray::I64(fixed(c, n, key, i64::from_le_bytes)?),
        _ => GgufArray::F64(fixed(c, n, key, f64::from_le_bytes)?),
    })
}

/// The fewest bytes one value of type `t` takes (to bound a count).
fn min_size(t: u32) -> Option<usize> {
    Some(match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}

fn value(c: &mut Cursor<'_>, t: u32, key: &str) -> Result<GgufValue> {
    let bad = |reason: String| Error::GgufKey {
        key: key.to_owned(),
        reason,
    };
    Ok(match t {
        0 => GgufValue::U8(u8::from_le_bytes(c.array(key)?)),
        1 => GgufValue::I8(i8::from_le_bytes(c.array(key)?)),
        2 => GgufValue::U16(u16::from_le_bytes(c.array(key)?)),
        3 => GgufValue::I16(i16::from_le_bytes(c.array(key)?)),
        4 => GgufValue::U32(c.u32(key)?),
        5 => GgufValue::I32(i32::from_le_bytes(c.array(key)?)),
        6 => GgufValue::F32(f32::from_le_bytes(c.array(key)?)),
        7 => match c.array::<1>(key)? {
            [0] => GgufValue::Bool(false),
            [1] => GgufValue::Bool(true),
            [b] => return Err(bad(format!("a bool of byte {b}, not 0 or 1"))),
        },
        8 => GgufValue::Str(c.string(key)?),
        9 => GgufValue::Array(array(c, key)?),
        10 => GgufValue::U64(c.u64(key)?),
        11 => GgufValue::I64(i64::from_le_bytes(c.array(key)?)),
        12 => GgufValue::F64(f64::from_le_bytes(c.array(key)?)),
        other => return Err(bad(format!("unknown value type {other}"))),
    })
}

/// The count at the cursor, refused when that many items of at least
/// `min` bytes cannot fit in what is left.
fn count(c: &mut Cursor<'_>, what: &str, min: usize) -> Result<usize> {
    let at = c.at;
    let n = c.u64(what)?;
    usize::try_from(n)
        .ok()
        .filter(|&n| Some(n) <= c.left().checked_div(min))
        .ok_or_else(|| {
            header_err(
                at,
                format!(
                    "{what} is {n}: that many cannot fit in the {} bytes left",
                    c.left()
                ),
            )
        })
}

fn key_values(c: &mut Cursor<'_>, n: usize) -> Result<Vec<(String, GgufValue)>> {
    let mut kv = Vec::new();
    let mut seen = HashSet::new();
    for _ in 0..n {
        let key = c.string("a metadata key")?;
        if !seen.insert(key.clone()) {
            return Err(Error::GgufKey {
                key,
                reason: "given twice".into(),
            });
        }
        let t = c.u32(&key)?;
        let v = value(c, t, &key)?;
        kv.push((key, v));
    }
    Ok(kv)
}

/// One tensor info; `offset` relative to the data, `len` computed.
fn tensor_info(c: &mut Cursor<'_>) -> Result<GgufTensor> {
    let name = c.string("a tensor name")?;
    let bad = |reason: String| Error::GgufTensor {
        tensor: name.clone(),
        reason,
    };
    let n_dims = c.u32(&name)?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(bad(format!("{n_dims} dimensions (1 to {MAX_DIMS})")));
    }
    let mut ne = Vec::new();
    for _ in 0..n_dims {
        ne.push(c.u64(&name)?);
    }
    let ggml_type = c.u32(&name)?;
    let dtype = dtype_of_ggml(ggml_type).ok_or_else(|| {
        let blocks: Vec<String> = crate::QUANTIZED
            .iter()
            .map(|d| d.name().to_ascii_uppercase())
            .collect();
        bad(format!(
            "{} is not a type a knot holds (it holds F32, F16, BF16, F64, I8 to I64, {})",
            super::ggml_type_name(ggml_type),
            blocks.join(", ")
        ))
    })?;
    let offset = c.u64(&name)?;
    ne.reverse();
    let shape = ne;
    let cols = shape.last().copied().unwrap_or(1);
    let row = dtype.row_bytes(cols).ok_or_else(|| {
        let per = dtype.block().map_or(1, |b| b.0);
        bad(format!(
            "{cols} values per row are not whole {} blocks of {per} (or the size overflows)",
            dtype.name()
        ))
    })?;
    let rows = shape
        .iter()
        .rev()
        .skip(1)
        .try_fold(1u64, |a, &d| a.checked_mul(d));
    let len = rows
        .and_then(|r| r.checked_mul(row))
        .ok_or_else(|| bad(format!("the shape {shape:?} overflows")))?;
    Ok(GgufTensor {
        name,
        shape,
        ggml_type,
        dtype,
        offset,
        len,
    })
}

/// `general.alignment`: a u32 power of two, or the default.
fn alignment(kv: &[(String, GgufValue)]) -> Result<u64> {
    match kv.iter().find(|(k, _)| k == "general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some((_, GgufValue::U32(a))) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some((k, v)) => Err(Error::GgufKey {
            key: k.clone(),
            reason: format!("{v:?} is not a u32 power of two"),
        }),
    }
}

/// Places every tensor in the data section: aligned, within the file,
/// not overlapping another.
fn place(
    tensors: &mut [GgufTensor],
    data_offset: u64,
    alignment: u64,
    file_len: u64,
) -> Result<()> {
    for t in tensors.iter_mut() {
        let bad = |reason: String| Error::GgufTensor {
            tensor: t.name.clone(),
            reason,
        };
        if !t.offset.is_multiple_of(alignment) {
            return Err(bad(format!(
                "offset {} is not a multiple of the alignment {alignment}",
                t.offset
            )));
        }
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.len));
        match (start, end) {
            (Some(s), Some(e)) if e <= file_len => t.offset = s,
            _ => {
                return Err(bad(format!(
                    "its {} bytes at data offset {} end past the end of the {file_len}-byte file",
                    t.len, t.offset
                )));
            }
        }
    }
    let mut order: Vec<&GgufTensor> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        if let [a, b] = w
            && a.offset.saturating_add(a.len) > b.offset
        {
            return Err(Error::GgufTensor {
                tensor: b.name.clone(),
                reason: format!("its bytes overlap those of {:?}", a.name),
            });
        }
    }
    Ok(())
}

impl Gguf {
    /// Parses the GGUF file `bytes` (a memory map of it): the header, and
    /// where every tensor's bytes are, checked to lie within the file.
    pub fn parse(bytes: &[u8]) -> Result<Gguf> {
        let mut c = Cursor { b: bytes, at: 0 };
        let magic = c.array::<4>("the magic")?;
        if magic != MAGIC {
            return Err(header_err(
                0,
                format!("bad magic {magic:02x?}: not a GGUF file"),
            ));
        }
        let version = c.u32("the version")?;
        if !(2..=3).contains(&version) {
            let hint = if version == 1 {
                " (version 1, from 2023, has 32-bit counts: convert it with a current llama.cpp)"
            } else {
                ""
            };
            return Err(header_err(
                4,
                format!("unsupported GGUF version {version}; versions 2 and 3 are read{hint}"),
            ));
        }
        let n_tensors = count(&mut c, "the tensor count", 24)?;
        let n_kv = count(&mut c, "the key/value count", 13)?;
        let kv_start = c.at as u64;
        let kv = key_values(&mut c, n_kv)?;
        let kv_end = c.at as u64;
        let mut tensors = Vec::new();
        let mut names = HashSet::new();
        for _ in 0..n_tensors {
            let t = tensor_info(&mut c)?;
            if !names.insert(t.name.clone()) {
                return Err(Error::GgufTensor {
                    tensor: t.name,
                    reason: "named twice".into(),
                });
            }
            tensors.push(t);
        }
        let alignment = alignment(&kv)?;
        let data_offset = (c.at as u64)
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| header_err(c.at, "the data offset overflows"))?;
        place(&mut tensors, data_offset, alignment, bytes.len() as u64)?;
        Ok(Gguf {
            version,
            kv,
            kv_bytes: (kv_start, kv_end),
            tensors,
            alignment,
            data_offset,
        })
    }
}
