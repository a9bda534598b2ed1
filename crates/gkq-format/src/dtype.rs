use std::fmt;
use std::str::FromStr;

/// Element type of a block or a row file (docs/FORMAT.md section 3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
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
}

const ALL: [DType; 15] = [
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
];

impl DType {
    /// Every dtype, in code order.
    pub const ALL: [DType; 15] = ALL;

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
        }
    }

    /// The dtype of an on-disk code, if it is one.
    pub fn from_code(code: u8) -> Option<DType> {
        ALL.get(usize::from(code)).copied()
    }

    /// Bytes per element.
    pub fn itemsize(self) -> u64 {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 | DType::Bool | DType::F8E5M2 | DType::F8E4M3 => 1,
        }
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
        assert_eq!(DType::from_code(15), None);
        assert_eq!("F8_E4M3".parse::<DType>(), Ok(DType::F8E4M3));
    }
}
