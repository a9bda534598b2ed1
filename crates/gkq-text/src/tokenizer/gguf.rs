//! A tokenizer from the `tokenizer.ggml.*` keys a GGUF carries (kept whole
//! in a GGUF-born package's `metadata.gguf`), as llama.cpp builds its own:
//!
//! - `gpt2`: byte-level BPE from `tokens` and `merges`, split first as
//!   `tokenizer.ggml.pre` names (the regexes of llama.cpp's
//!   `llm_tokenizer_bpe`, expressed as Hugging Face pre-tokenizers);
//! - `llama`: llama.cpp's SentencePiece from `tokens` and `scores`
//!   ([`super::spm`]), with byte fallback;
//! - control (type 3) and user-defined (type 4) tokens are matched whole in
//!   the text before it is split; `add_bos_token`, `add_eos_token`, and the
//!   end-of-generation ids as llama.cpp finds them.

use gkq_format::gguf::{Gguf, GgufArray, GgufStrings, GgufValue};
use serde_json::{Value, json};

use super::spm::{Specials, Spm, kind};
use super::vocab::{Render, Vocab};
use super::{Engine, Tokenizer};
use crate::{Result, TextError};

fn bad(reason: impl Into<String>) -> TextError {
    TextError::Tokenizer(format!("metadata.gguf: {}", reason.into()))
}

fn array<'a>(g: &'a Gguf, key: &str) -> Option<&'a GgufArray> {
    g.get(key).and_then(GgufValue::as_array)
}

fn num(g: &Gguf, key: &str) -> Option<u32> {
    g.get(key)
        .and_then(GgufValue::as_u64)
        .and_then(|v| u32::try_from(v).ok())
}

fn flag(g: &Gguf, key: &str) -> Option<bool> {
    match g.get(key) {
        Some(GgufValue::Bool(b)) => Some(*b),
        _ => None,
    }
}

/// GPT-2's split, as llama.cpp writes it (no final `\s+`: what no
/// alternative matches is a piece of its own all the same).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Qwen2's split, llama.cpp's adaptation (the contractions spelled out
/// instead of `(?i:…)`, which also folds `ſ`).
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's split, llama.cpp's adaptation.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's pre-tokenizers of byte-level BPE (`llm_tokenizer_bpe` in
/// `llama-vocab.cpp`): the `tokenizer.ggml.pre` names that choose each,
/// its splits in order (each cuts every piece of the one before into what
/// it matches and what it does not), and whether a word that is a token
/// skips the merges. No key, or `default`, is llama.cpp's default.
const PRE_TOKENIZERS: &[(&[&str], &[&str], bool)] = &[
    (
        &["default"],
        &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
        false,
    ),
    (
        &[
            "smollm",
            "starcoder",
            "refact",
            "command-r",
            "codeshell",
            "exaone",
            "minerva-7b",
        ],
        &[r"\p{N}", GPT2],
        false,
    ),
    (
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "roberta-bpe",
            "jina-v1-en",
            "jina-v2-code",
            "mpt",
            "olmo",
            "jais",
            "trillion",
        ],
        &[GPT2],
        false,
    ),
    (
        &["qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan"],
        &[QWEN2],
        false,
    ),
    (
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
        ],
        &[LLAMA3],
        true,
    ),
    (&["dbrx", "smaug-bpe"], &[LLAMA3], false),
];

/// The Unicode version of llama.cpp's character classes
/// (`unicode-data.cpp`): the regex crate's tables are newer, and the 5,185
/// code points assigned since (Garay digits among them, `\p{N}` to the
/// regex crate) are no letter, number, mark, punctuation or symbol to
/// llama.cpp. Every class of a split is held to this version.
const LLAMA_CPP_UNICODE: &str = "V15_1";

/// `re` with each Unicode class (`\p{L}`, `\p{N}`, …) held to the code
/// points assigned by [`LLAMA_CPP_UNICODE`].
fn pinned(re: &str) -> String {
    let mut out = String::with_capacity(re.len() * 2);
    let mut rest = re;
    while let Some(at) = rest.find(r"\p{") {
        out.push_str(&rest[..at]);
        let Some(close) = rest[at..].find('}') else {
            break;
        };
        let class = &rest[at..at + close + 1];
        out.push_str(&format!("[{class}&&\\p{{Age={LLAMA_CPP_UNICODE}}}]"));
        rest = &rest[at + close + 1..];
    }
    out.push_str(rest);
    out
}

/// The pre-tokenizer of `tokenizer.ggml.pre` (absent: llama.cpp's default)
/// for byte-level BPE, as a Hugging Face pre-tokenizer, and whether merges
/// are skipped for whole-vocabulary words.
fn pre_tokenizer(pre: Option<&str>) -> Result<(Value, bool)> {
    let name = pre.unwrap_or("default");
    let Some((_, splits, ignore_merges)) = PRE_TOKENIZERS.iter().find(|(n, ..)| n.contains(&name))
    else {
        let known: Vec<&str> = PRE_TOKENIZERS
            .iter()
            .flat_map(|(n, ..)| n.iter().copied())
            .collect();
        return Err(bad(format!(
            "tokenizer.ggml.pre is {name:?}, a pre-tokenizer gkq does not know as llama.cpp does (it knows {})",
            known.join(", ")
        )));
    };
    let mut steps: Vec<Value> = splits
        .iter()
        .map(|re| {
            json!({"type": "Split", "pattern": {"Regex": pinned(re)}, "behavior": "Isolated", "invert": false})
        })
        .collect();
    steps.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));
    Ok((
        json!({"type": "Sequence", "pretokenizers": steps}),
        *ignore_merges,
    ))
}

/// The bytes GPT-2's byte-level alphabet spells as `c` (its inverse).
fn byte_of(c: char) -> Option<u8> {
    let u = c as u32;
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    if printable(u) {
        return u8::try_from(u).ok();
    }
    // the others were shifted to 256 + their rank among the unprintable
    let rank = u.checked_sub(256)?;
    (0u32..=255)
        .filter(|&b| !printable(b))
        .nth(rank as usize)
        .and_then(|b| u8::try_from(b).ok())
}

/// The bytes a byte-level BPE token stands for.
pub(super) fn byte_level_bytes(token: &str) -> Vec<u8> {
    match token.chars().map(byte_of).collect::<Option<Vec<u8>>>() {
        Some(b) => b,
        // not in the byte alphabet (an added token): its UTF-8 as is
        None => token.as_bytes().to_vec(),
    }
}

/// A BPE `tokenizer.json` (as Hugging Face's converter writes one) of the
/// GGUF's vocabulary.
fn bpe_json(
    tokens: &GgufStrings,
    types: &[u32],
    merges: &GgufStrings,
    pre: Option<&str>,
) -> Result<Value> {
    let (pre_tok, ignore_merges) = pre_tokenizer(pre)?;
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        vocab.insert(t.to_owned(), json!(id));
        let ty = types.get(id).copied().unwrap_or(1);
        // llama.cpp matches control, user-defined and unknown tokens whole
        if matches!(ty, kind::CONTROL | kind::USER_DEFINED | kind::UNKNOWN) {
            added.push(
                json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty != kind::USER_DEFINED}),
            );
        }
    }
    let merges: Vec<&str> = merges.iter().collect();
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added, "normalizer": null, "pre_tokenizer": pre_tok,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges},
    }))
}

/// The types of the tokens (1, normal, when the key is absent): each one
/// of llama.cpp's, 1 (normal) to 6 (byte); another is refused, naming the
/// key and the id (llama.cpp would take it as undefined and tokenize with
/// it).
fn token_types(g: &Gguf, n: usize) -> Result<Vec<u32>> {
    let Some(types) = array(g, "tokenizer.ggml.token_type") else {
        return Ok(vec![1; n]);
    };
    (0..n)
        .map(|i| match types.u64_at(i) {
            Some(t @ 1..=6) => Ok(t as u32),
            Some(t) => Err(bad(format!(
                "tokenizer.ggml.token_type[{i}] is {t}: a token type is 1 (normal) to 6 (byte)"
            ))),
            None => Err(bad(format!(
                "tokenizer.ggml.token_type has no integer for token {i} of {n}"
            ))),
        })
        .collect()
}

/// SentencePiece's scores: a NaN score is refused, naming the id (merges
/// compare scores, and NaN has no order).
fn scores(g: &Gguf, n: usize) -> Result<Vec<f32>> {
    let scores = array(g, "tokenizer.ggml.scores");
    (0..n)
        .map(|i| {
            let s = scores.and_then(|a| a.f64_at(i)).unwrap_or(0.0) as f32;
            if s.is_nan() {
                return Err(bad(format!("tokenizer.ggml.scores[{i}] is NaN")));
            }
            Ok(s)
        })
        .collect()
}

impl Tokenizer {
    /// The tokenizer a GGUF's metadata describes (see the module docs), for
    /// an embedding of `rows` rows.
    pub fn from_gguf(meta: &Gguf, rows: u64) -> Result<Tokenizer> {
        let model = meta
            .get("tokenizer.ggml.model")
            .and_then(GgufValue::as_str)
            .ok_or_else(|| bad("no tokenizer.ggml.model: the GGUF carries no tokenizer"))?;
        let tokens = array(meta, "tokenizer.ggml.tokens")
            .and_then(GgufArray::strings)
            .ok_or_else(|| bad("no tokenizer.ggml.tokens"))?;
        if tokens.len() as u64 > rows {
            return Err(TextError::TokenizerVocab {
                ids: tokens.len() as u64,
                rows,
            });
        }
        let types = token_types(meta, tokens.len())?;
        let engine = match model {
            "gpt2" => {
                let merges = array(meta, "tokenizer.ggml.merges")
                    .and_then(GgufArray::strings)
                    .ok_or_else(|| bad("a gpt2 tokenizer without tokenizer.ggml.merges"))?;
                let pre = meta.get("tokenizer.ggml.pre").and_then(GgufValue::as_str);
                let json = bpe_json(tokens, &types, merges, pre)?;
                let t = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes())
                    .map_err(|e| bad(format!("the BPE tokenizer: {e}")))?;
                Engine::Hf {
                    t: Box::new(t),
                    post: false,
                }
            }
            "llama" => {
                let scores = scores(meta, tokens.len())?;
                let mut spm = Spm::new(tokens.iter().zip(scores));
                spm.add_space_prefix =
                    flag(meta, "tokenizer.ggml.add_space_prefix").unwrap_or(true);
                let specials = Specials::new(
                    tokens
                        .iter()
                        .enumerate()
                        .map(|(i, t)| (i as u32, t, types.get(i).copied().unwrap_or(1))),
                );
                Engine::Spm(Box::new((spm, specials)))
            }
            other => {
                return Err(bad(format!(
                    "tokenizer.ggml.model is {other:?}: gkq tokenizes gpt2 (byte-level BPE) and llama (SentencePiece)"
                )));
            }
        };
        let vocab = vocab_of(meta, tokens, &types, model == "gpt2");
        let template = meta
            .get("tokenizer.chat_template")
            .and_then(GgufValue::as_str)
            .map(str::to_owned);
        Ok(Tokenizer {
            engine,
            vocab,
            template,
        })
    }
}

/// The pieces and specials of a GGUF's vocabulary.
fn vocab_of(meta: &Gguf, tokens: &GgufStrings, types: &[u32], byte_level: bool) -> Vocab {
    let mut v = Vocab::default();
    for (i, t) in tokens.iter().enumerate() {
        let ty = types.get(i).copied().unwrap_or(1);
        // llama.cpp renders control, unknown and unused tokens as nothing
        let hidden = matches!(ty, kind::CONTROL | kind::UNKNOWN | kind::UNUSED);
        let render = if hidden || super::vocab::EOG_TEXTS.contains(&t) {
            Render::Hidden
        } else {
            Render::Bytes
        };
        let bytes = if ty == kind::BYTE {
            // <0xAB>
            t.get(3..5)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .map_or_else(Vec::new, |b| vec![b])
        } else if ty == kind::USER_DEFINED {
            t.as_bytes().to_vec()
        } else if byte_level {
            byte_level_bytes(t)
        } else {
            t.replace('\u{2581}', " ").into_bytes()
        };
        v.push(&bytes, render);
    }
    v.bos = num(meta, "tokenizer.ggml.bos_token_id");
    v.eos = num(meta, "tokenizer.ggml.eos_token_id");
    // llama.cpp: a SentencePiece vocabulary adds BOS unless it says not to
    v.add_bos = flag(meta, "tokenizer.ggml.add_bos_token").unwrap_or(!byte_level);
    v.add_eos = flag(meta, "tokenizer.ggml.add_eos_token").unwrap_or(false);
    let text = |id: Option<u32>| {
        id.and_then(|i| tokens.get(i as usize))
            .unwrap_or_default()
            .to_owned()
    };
    v.bos_text = text(v.bos);
    v.eos_text = text(v.eos);
    if let Some(eot) = num(meta, "tokenizer.ggml.eot_token_id") {
        v.eog.insert(eot);
    }
    v.find_eog(tokens.iter().enumerate().map(|(i, t)| (i as u32, t)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_level_alphabet_inverts() {
        assert_eq!(byte_level_bytes("Ġhello"), b" hello");
        assert_eq!(byte_level_bytes("Ċ"), b"\n");
        assert_eq!(byte_level_bytes("Ã©"), "é".as_bytes());
        assert_eq!(byte_level_bytes("<|im_end|>"), b"<|im_end|>");
        assert!((0u8..=255).all(|b| {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
            let c = if printable {
                char::from(b)
            } else {
                let rank = (0u8..b)
                    .filter(|&x| !((33..=126).contains(&x) || (161..=172).contains(&x) || x >= 174))
                    .count();
                char::from_u32(256 + rank as u32).expect("char")
            };
            byte_of(c) == Some(b)
        }));
    }
}
