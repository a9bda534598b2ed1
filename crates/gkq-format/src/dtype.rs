use std::fmt;
use std::str::FromStr;

/// Element type of a block or a row file (docs/FORMAT.md section 3.3): an
/// element type (its values one by one), or one of ggml's block-quantized
/// types (section 3.5: blocks of 32 or 256 values with their scales inline).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
#[allow(non_camel_case_types)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE 754 binary64.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// One byte, 0 or 1.
    Bool,
    /// 8-bit float, 5 exponent bits.
    F8E5M2,
    /// 8-bit float, 4 exponent bits.
    F8E4M3,
    /// ggml Q4_0: blocks of 32, an f16 scale, 4-bit codes.
    Q4_0,
    /// ggml Q4_1: blocks of 32, f16 scale and minimum, 4-bit codes.
    Q4_1,
    /// ggml Q5_0: blocks of 32, an f16 scale, 5-bit codes.
    Q5_0,
    /// ggml Q5_1: blocks of 32, f16 scale and minimum, 5-bit codes.
    Q5_1,
    /// ggml Q8_0: blocks of 32, an f16 scale, 8-bit codes.
    Q8_0,
    /// ggml Q4_K: super-blocks of 256, eight 6-bit scales and minimums, 4-bit codes.
    Q4_K,
    /// ggml Q5_K: super-blocks of 256, eight 6-bit scales and minimums, 5-bit codes.
    Q5_K,
    /// ggml Q6_K: super-blocks of 256, sixteen 8-bit scales, 6-bit codes.
    Q6_K,
}

const ALL: [DType; 23] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F64,
    DType::I8,
    DType::U8,
    DType::I16,
    DType::U16,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U64,
    DType::Bool,
    DType::F8E5M2,
    DType::F8E4M3,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
];

impl DType {
    /// Every dtype, in code order.
    pub const ALL: [DType; 23] = ALL;

    /// The on-disk code.
    pub fn code(self) -> u8 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 2,
            DType::F64 => 3,
            DType::I8 => 4,
            DType::U8 => 5,
            DType::I16 => 6,
            DType::U16 => 7,
            DType::I32 => 8,
            DType::U32 => 9,
            DType::I64 => 10,
            DType::U64 => 11,
            DType::Bool => 12,
            DType::F8E5M2 => 13,
            DType::F8E4M3 => 14,
            DType::Q4_0 => 15,
            DType::Q4_1 => 16,
            DType::Q5_0 => 17,
            DType::Q5_1 => 18,
            DType::Q8_0 => 19,
            DType::Q4_K => 20,
            DType::Q5_K => 21,
            DType::Q6_K => 22,
        }
    }

    /// The dtype of an on-disk code, if it is one.
    pub fn from_code(code: u8) -> Option<DType> {
        ALL.get(usize::from(code)).copied()
    }

    /// Bytes per element of an element type; 0 for a block type, whose
    /// sizes [`DType::row_bytes`] and [`DType::block`] give.
    pub fn itemsize(self) -> u64 {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 | DType::Bool | DType::F8E5M2 | DType::F8E4M3 => 1,
            _ => 0,
        }
    }

    /// One of ggml's block types.
    pub fn is_quantized(self) -> bool {
        self.block().is_some()
    }

    /// Bytes of a row of `cols` values: `cols × itemsize`, or for a block
    /// type `cols / values × bytes` when `cols` is a whole number of
    /// blocks; `None` when it is not, or on overflow.
    pub fn row_bytes(self, cols: u64) -> Option<u64> {
        match self.block() {
            Some((n, b)) if cols.is_multiple_of(n) => cols.checked_div(n)?.checked_mul(b),
            Some(_) => None,
            None => cols.checked_mul(self.itemsize()),
        }
    }

    /// Which of the knot's versions carries this dtype first: the block
    /// types came with layout version 4.
    pub fn since_version(self) -> u32 {
        if self.is_quantized() { 4 } else { 2 }
    }

    /// One of ggml's block types by name (`q4_0`, `Q4_K`, …), for flags.
    pub fn parse_quantized(s: &str) -> Result<DType, String> {
        match s.trim().parse::<DType>() {
            Ok(d) if d.is_quantized() => Ok(d),
            _ => Err(format!(
                "{s:?} is not a quantized type: one of {}",
                DType::quantized_names()
            )),
        }
    }

    /// A row file dtype by name: a float dtype (as [`DType::parse_float`])
    /// or a block type (as [`DType::parse_quantized`]).
    pub fn parse_row(s: &str) -> Result<DType, String> {
        DType::parse_float(s).or_else(|_| {
            DType::parse_quantized(s).map_err(|_| {
                format!(
                    "{s:?} is not a row dtype: f32, f16, bf16 (or fp32, float16, half, bfloat16…), or a quantized type: {}",
                    DType::quantized_names()
                )
            })
        })
    }

    /// F32, F16 or BF16: the dtypes that may be cast into one another.
    pub fn is_castable_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// One of the row dtypes (`f32`, `f16`, `bf16`) from its name or a
    /// common alias (`fp32`, `float32`, `float`, `fp16`, `float16`, `half`,
    /// `bfloat16`), case-insensitive: the one parser of every tool's dtype flags.
    pub fn parse_float(s: &str) -> Result<DType, String> {
        let canonical = match s.trim().to_ascii_lowercase().as_str() {
            "fp32" | "float32" | "float" => "f32".to_owned(),
            "fp16" | "float16" | "half" => "f16".to_owned(),
            "bfloat16" => "bf16".to_owned(),
            other => other.to_owned(),
        };
        match canonical.parse::<DType>() {
            Ok(d) if d.is_castable_float() => Ok(d),
            _ => Err(format!(
                "{s:?} is not one of f32, f16, bf16 (aliases: fp32, float32, fp16, float16, half, bfloat16)"
            )),
        }
    }

    /// Lowercase name, as used in row file names (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::Bool => "bool",
            DType::F8E5M2 => "f8_e5m2",
            DType::F8E4M3 => "f8_e4m3",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q4_K => "q4_k",
            DType::Q5_K => "q5_k",
            DType::Q6_K => "q6_k",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    /// Accepts the lowercase names and the safetensors names (`F32`, `BF16`, `F8_E4M3`, ...).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        ALL.iter()
            .copied()
            .find(|d| d.name() == lower)
            .ok_or_else(|| format!("unknown dtype {s:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_aliases() {
        for (s, d) in [
            ("f32", DType::F32),
            ("FP32", DType::F32),
            ("float", DType::F32),
            ("fp16", DType::F16),
            ("half", DType::F16),
            ("float16", DType::F16),
            ("bf16", DType::BF16),
            ("bfloat16", DType::BF16),
        ] {
            assert_eq!(DType::parse_float(s), Ok(d), "{s}");
        }
        assert!(DType::parse_float("i8").is_err());
        assert!(DType::parse_float("f8").is_err());
    }

    #[test]
    fn codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
            assert_eq!(d.name().parse::<DType>(), Ok(d));
        }
        assert_eq!(DType::from_code(23), None);
        assert_eq!(DType::from_code(19), Some(DType::Q8_0));
        assert_eq!("F8_E4M3".parse::<DType>(), Ok(DType::F8E4M3));
    }
}
