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

/// The pre-tokenizer of `tokenizer.ggml.pre` for byte-level BPE, and
/// whether merges are skipped for whole-vocabulary words (llama 3).
fn pre_tokenizer(pre: &str) -> Result<(Value, bool)> {
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |re: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]})
    };
    Ok(match pre {
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            (
                json!({"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": true},
                    byte_level(true),
                ]}),
                false,
            )
        }
        "gpt-2" | "gpt2" | "default" | "mpt" | "olmo" | "jais" | "trillion" => {
            (byte_level(true), false)
        }
        "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "hunyuan" => (split(QWEN2), false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "dbrx" | "smaug-bpe" | "pixtral" => {
            (split(LLAMA3), true)
        }
        other => {
            return Err(bad(format!(
                "tokenizer.ggml.pre is {other:?}, a pre-tokenizer gkq does not know (it knows smollm, starcoder, gpt2, qwen2, llama-bpe and their aliases)"
            )));
        }
    })
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
fn bpe_json(tokens: &GgufStrings, types: &[u32], merges: &GgufStrings, pre: &str) -> Result<Value> {
    let (pre_tok, ignore_merges) = pre_tokenizer(pre)?;
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        vocab.insert(t.to_owned(), json!(id));
        let ty = types.get(id).copied().unwrap_or(1);
        if ty == kind::CONTROL || ty == kind::USER_DEFINED {
            added.push(
                json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty == kind::CONTROL}),
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

/// The types of the tokens (1, normal, when the key is absent).
fn token_types(g: &Gguf, n: usize) -> Vec<u32> {
    let types = array(g, "tokenizer.ggml.token_type");
    (0..n)
        .map(|i| {
            types
                .and_then(|a| a.u64_at(i))
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(1)
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
        let types = token_types(meta, tokens.len());
        let engine = match model {
            "gpt2" => {
                let merges = array(meta, "tokenizer.ggml.merges")
                    .and_then(GgufArray::strings)
                    .ok_or_else(|| bad("a gpt2 tokenizer without tokenizer.ggml.merges"))?;
                let pre = meta
                    .get("tokenizer.ggml.pre")
                    .and_then(GgufValue::as_str)
                    .unwrap_or("default");
                let json = bpe_json(tokens, &types, merges, pre)?;
                let t = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes())
                    .map_err(|e| bad(format!("the BPE tokenizer: {e}")))?;
                Engine::Hf {
                    t: Box::new(t),
                    post: false,
                }
            }
            "llama" => {
                let scores = array(meta, "tokenizer.ggml.scores");
                let score = |i: usize| scores.and_then(|a| a.f64_at(i)).unwrap_or(0.0) as f32;
                let mut spm = Spm::new(tokens.iter().enumerate().map(|(i, t)| (t, score(i))));
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
        let render = if ty == kind::CONTROL || super::vocab::EOG_TEXTS.contains(&t) {
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
