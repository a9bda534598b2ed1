//! llama-quantize's file types as `--quant` presets (`Q4_K_M`, `Q5_0`, …):
//! each is a base type for the 2-D weight matrices and a mix, the
//! per-tensor rules of llama.cpp's `llama_tensor_get_type_impl`
//! (src/llama-quant.cpp of the llama-cpp-python 0.3.36 sdist) for the
//! parts of our architectures. The roles (token embedding, lm_head) and
//! the fallbacks of rows that are not whole blocks are the type plan's
//! (`types.rs`), as for a single `--quant` type.

use gkq_format::DType;
use gkq_format::arch::Part;

/// The per-tensor rules of a preset, on top of its base type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mix {
    /// Every weight matrix in the base type (a single type, and the
    /// `Q4_0`…`Q8_0`, `Q5_K_S` and `Q6_K` presets).
    #[default]
    None,
    /// `Q4_K_S`: `attn_v` of the first 4 layers and `ffn_down` of the
    /// first eighth in Q5_K.
    SmallK,
    /// `Q4_K_M`, `Q5_K_M`: `attn_v` and `ffn_down` of llama.cpp's
    /// "use more bits" layers (the first and last eighth, every third
    /// between) in Q6_K.
    MediumK,
    /// llama-quantize's `--pure`: every tensor a type is asked for, the
    /// roles too, in the base type.
    Pure,
}

/// llama-quantize's file types: name, base type, mix.
const PRESETS: &[(&str, DType, Mix)] = &[
    ("q4_0", DType::Q4_0, Mix::None),
    ("q4_1", DType::Q4_1, Mix::None),
    ("q5_0", DType::Q5_0, Mix::None),
    ("q5_1", DType::Q5_1, Mix::None),
    ("q8_0", DType::Q8_0, Mix::None),
    ("q4_k_s", DType::Q4_K, Mix::SmallK),
    ("q4_k_m", DType::Q4_K, Mix::MediumK),
    // llama-quantize's aliases: Q4_K is Q4_K_M, Q5_K is Q5_K_M
    ("q4_k", DType::Q4_K, Mix::MediumK),
    ("q5_k_s", DType::Q5_K, Mix::None),
    ("q5_k_m", DType::Q5_K, Mix::MediumK),
    ("q5_k", DType::Q5_K, Mix::MediumK),
    ("q6_k", DType::Q6_K, Mix::None),
];

/// llama-quantize's file types as `--quant` takes them (`Q4_K_M`, …), in
/// the table's order: for help and messages.
pub fn preset_names() -> Vec<String> {
    PRESETS.iter().map(|(n, _, _)| n.to_uppercase()).collect()
}

/// llama-quantize's types that gkq-pack does not write.
const UNSUPPORTED: &[&str] = &[
    "q2_k",
    "q2_k_s",
    "q3_k",
    "q3_k_s",
    "q3_k_m",
    "q3_k_l",
    "iq1_s",
    "iq1_m",
    "iq2_xxs",
    "iq2_xs",
    "iq2_s",
    "iq2_m",
    "iq3_xxs",
    "iq3_xs",
    "iq3_s",
    "iq3_m",
    "iq4_nl",
    "iq4_xs",
    "tq1_0",
    "tq2_0",
    "mxfp4_moe",
];

/// `--quant`: a preset (case-insensitive) or a single block type.
pub fn parse_quant(s: &str) -> Result<(DType, Mix), String> {
    let lower = s.trim().to_ascii_lowercase();
    if let Some((_, d, m)) = PRESETS.iter().find(|(n, _, _)| *n == lower) {
        return Ok((*d, *m));
    }
    let supported = preset_names().join(", ");
    if UNSUPPORTED.contains(&lower.as_str()) {
        return Err(format!(
            "{s} is one of llama-quantize's types that gkq-pack does not write (FORMAT.md 3.5 has no layout for it): give one of {supported}"
        ));
    }
    if matches!(lower.as_str(), "f32" | "f16" | "bf16" | "copy") {
        return Err(format!(
            "{s} is not a quantized type: the float types are --dtype's (--dtype f16), and a tensor is copied as it is when no --quant is given"
        ));
    }
    DType::parse_quantized(s)
        .map(|d| (d, Mix::None))
        .map_err(|e| {
            format!(
                "{e}; or one of llama-quantize's file types: {}",
                preset_names().join(", ")
            )
        })
}

/// llama.cpp's `use_more_bits`.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The type of a weight matrix that is `part` of layer `layer` (of
/// `layers`) under `mix`, whose base type is `base`.
pub(crate) fn mixed(base: DType, mix: Mix, part: Option<(usize, Part)>, layers: usize) -> DType {
    let Some((i, part)) = part else { return base };
    match (mix, part) {
        (Mix::MediumK, Part::V | Part::Down) if use_more_bits(i, layers) => DType::Q6_K,
        (Mix::SmallK, Part::V) if i < 4 => DType::Q5_K,
        (Mix::SmallK, Part::Down) if i < layers / 8 => DType::Q5_K,
        _ => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_and_single_types() {
        assert_eq!(parse_quant("Q4_K_M"), Ok((DType::Q4_K, Mix::MediumK)));
        assert_eq!(parse_quant("q5_k_s"), Ok((DType::Q5_K, Mix::None)));
        // llama-quantize's aliases
        assert_eq!(parse_quant("q4_k"), Ok((DType::Q4_K, Mix::MediumK)));
        assert_eq!(parse_quant("Q5_K"), Ok((DType::Q5_K, Mix::MediumK)));
        let e = parse_quant("IQ4_XS").expect_err("unsupported");
        assert!(
            e.contains("IQ4_XS is one of llama-quantize's types that gkq-pack does not write"),
            "{e}"
        );
        assert!(
            parse_quant("Q2_K")
                .expect_err("unsupported")
                .contains("does not write")
        );
        assert!(
            parse_quant("F16")
                .expect_err("float")
                .contains("--dtype f16")
        );
        let e = parse_quant("Q3_K_M").expect_err("not offered");
        assert!(e.contains("Q4_K_M"), "{e}");
    }

    #[test]
    fn more_bits_as_llama_cpp_for_24_layers() {
        // Qwen2.5-0.5B: 24 layers; llama.cpp gives Q6_K to these
        let six: Vec<usize> = (0..24)
            .filter(|&i| mixed(DType::Q4_K, Mix::MediumK, Some((i, Part::Down)), 24) == DType::Q6_K)
            .collect();
        assert_eq!(six, [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]);
        assert_eq!(
            mixed(DType::Q4_K, Mix::MediumK, Some((5, Part::Q)), 24),
            DType::Q4_K
        );
        assert_eq!(
            mixed(DType::Q4_K, Mix::SmallK, Some((3, Part::V)), 24),
            DType::Q5_K
        );
        assert_eq!(
            mixed(DType::Q4_K, Mix::SmallK, Some((3, Part::Down)), 24),
            DType::Q4_K
        );
    }
}
