//! The `tokenizer.ggml.*` keys of a byte-level BPE `tokenizer.json` (Qwen2,
//! Llama 3, GPT-2, SmolLM), as llama.cpp's converter writes them, so that a
//! GGUF exported from a safetensors-born package loads in llama.cpp: the
//! tokens in id order, their types (control for special added tokens,
//! user-defined for the others), the merges, the pre-tokenizer's name,
//! BOS/EOS and the chat template of `tokenizer_config.json`.

use gkq_format::gguf::{GgufArray, GgufStrings, GgufValue};
use serde_json::Value;

use crate::{Result, TextError};

fn bad(why: impl std::fmt::Display) -> TextError {
    TextError::Tokenizer(format!("tokenizer.json to GGUF: {why}"))
}

/// llama.cpp's name of the pre-tokenizer of `doc` (`tokenizer.ggml.pre`),
/// from the split it makes: Qwen2's regex, Llama 3's, GPT-2's byte-level
/// split, or SmolLM's digits then GPT-2's.
fn pre_name(doc: &Value) -> Result<&'static str> {
    let text = doc["pre_tokenizer"].to_string();
    if !text.contains("ByteLevel") {
        return Err(bad(
            "only byte-level BPE tokenizers are written as GGUF keys",
        ));
    }
    Ok(if text.contains(r"\\p{N}{1,3}") {
        "llama-bpe"
    } else if text.contains(r"\\p{N}|") || text.contains(r"\\p{N}| ?") {
        "qwen2"
    } else if text.contains("Digits") {
        "smollm"
    } else {
        "gpt2"
    })
}

fn id(v: &Value) -> Option<usize> {
    v.as_u64().and_then(|i| usize::try_from(i).ok())
}

/// The GGUF key/values of the tokenizer `json` (with `config`, its
/// `tokenizer_config.json`, when the package has one), its tokens padded
/// to `vocab` (the embedding's rows, the model's `vocab_size`) with unused
/// `[PAD{i}]` tokens as llama.cpp's converter writes them: llama.cpp
/// refuses a token list shorter than the embedding.
pub fn gguf_tokenizer_keys(
    json: &[u8],
    config: Option<&[u8]>,
    vocab: usize,
) -> Result<Vec<(String, GgufValue)>> {
    let doc: Value = serde_json::from_slice(json).map_err(bad)?;
    let cfg: Value = config
        .map(serde_json::from_slice)
        .transpose()
        .map_err(bad)?
        .unwrap_or(Value::Null);
    let model = &doc["model"];
    if model["type"] != "BPE" {
        return Err(bad(format!("a {} model, not BPE", model["type"])));
    }
    let pre = pre_name(&doc)?;
    let (strings, types) = vocab_of(&doc, vocab)?;
    let strings: GgufStrings = strings.iter().map(String::as_str).collect();
    let merges = merges_of(model)?;
    let token_id = |key: &str| {
        let text = cfg[key].as_str().or_else(|| cfg[key]["content"].as_str())?;
        let i = strings.iter().position(|t| t == text)?;
        u32::try_from(i).ok()
    };
    let specials: Vec<(&str, u32)> = [
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("pad_token", "padding_token_id"),
    ]
    .into_iter()
    .filter_map(|(key, name)| Some((name, token_id(key)?)))
    .collect();
    let mut kv = vec![
        (
            "tokenizer.ggml.model".to_owned(),
            GgufValue::Str("gpt2".into()),
        ),
        ("tokenizer.ggml.pre".to_owned(), GgufValue::Str(pre.into())),
        (
            "tokenizer.ggml.tokens".to_owned(),
            GgufValue::Array(GgufArray::Str(strings)),
        ),
        (
            "tokenizer.ggml.token_type".to_owned(),
            GgufValue::Array(GgufArray::I32(types)),
        ),
        (
            "tokenizer.ggml.merges".to_owned(),
            GgufValue::Array(GgufArray::Str(merges.iter().map(String::as_str).collect())),
        ),
    ];
    for (name, i) in specials {
        kv.push((format!("tokenizer.ggml.{name}"), GgufValue::U32(i)));
    }
    let add_bos = cfg["add_bos_token"].as_bool().unwrap_or(false);
    kv.push((
        "tokenizer.ggml.add_bos_token".to_owned(),
        GgufValue::Bool(add_bos),
    ));
    if let Some(t) = cfg["chat_template"].as_str() {
        kv.push((
            "tokenizer.chat_template".to_owned(),
            GgufValue::Str(t.to_owned()),
        ));
    }
    Ok(kv)
}

/// Every id's token text and llama.cpp token type (1 normal, 3 control, 4
/// user-defined, 5 unused): the vocabulary, then the added tokens.
fn vocab_of(doc: &Value, rows: usize) -> Result<(Vec<String>, Vec<i32>)> {
    let model = &doc["model"];
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| bad("no model.vocab"))?;
    let added = doc["added_tokens"].as_array().map_or(0, Vec::len);
    // an id past the embedding's rows (or, without them, past every token
    // listed) is refused, not allocated for
    let limit = if rows > 0 { rows } else { vocab.len() + added };
    let mut tokens: Vec<Option<String>> = Vec::new();
    let mut types: Vec<i32> = Vec::new();
    let mut put = |i: usize, t: &str, ty: i32| {
        if i >= limit {
            return Err(bad(format!(
                "token {t:?} has id {i}, past the {limit} rows of the embedding"
            )));
        }
        if tokens.len() <= i {
            tokens.resize(i + 1, None);
            types.resize(i + 1, 1);
        }
        tokens[i] = Some(t.to_owned());
        types[i] = ty;
        Ok(())
    };
    for (t, i) in vocab {
        put(
            id(i).ok_or_else(|| bad(format!("token {t:?} has no id")))?,
            t,
            1,
        )?;
    }
    for a in doc["added_tokens"].as_array().into_iter().flatten() {
        let (Some(i), Some(t)) = (id(&a["id"]), a["content"].as_str()) else {
            continue;
        };
        put(i, t, if a["special"] == true { 3 } else { 4 })?;
    }
    if tokens.len() < rows {
        tokens.resize(rows, None);
        types.resize(rows, 1);
    }
    // ids the tokenizer leaves unused (llama.cpp's converter pads them so)
    let strings: Vec<String> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| t.clone().unwrap_or_else(|| format!("[PAD{i}]")))
        .collect();
    for (i, t) in tokens.iter().enumerate() {
        if t.is_none() {
            types[i] = 5;
        }
    }
    Ok((strings, types))
}

/// The merges, as "a b" strings (either of tokenizer.json's spellings).
fn merges_of(model: &Value) -> Result<Vec<String>> {
    let merges: Vec<String> = model["merges"]
        .as_array()
        .ok_or_else(|| bad("no model.merges"))?
        .iter()
        .filter_map(|m| match m {
            Value::String(s) => Some(s.clone()),
            Value::Array(p) => Some(format!("{} {}", p.first()?.as_str()?, p.get(1)?.as_str()?)),
            _ => None,
        })
        .collect();
    Ok(merges)
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: &str = r#"{
        "pre_tokenizer": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
        "added_tokens": [{"id": 3, "content": "<|end|>", "special": true}]
    }"#;

    fn tokens(kv: &[(String, GgufValue)]) -> (Vec<String>, Vec<i32>) {
        let get = |k: &str| kv.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let Some(GgufValue::Array(GgufArray::Str(t))) = get("tokenizer.ggml.tokens") else {
            panic!("tokens")
        };
        let Some(GgufValue::Array(GgufArray::I32(ty))) = get("tokenizer.ggml.token_type") else {
            panic!("types")
        };
        (t.iter().map(str::to_owned).collect(), ty)
    }

    /// llama.cpp refuses a token list shorter than the embedding: padded
    /// with unused [PAD{i}] tokens to its rows, as its converter does.
    #[test]
    fn tokens_are_padded_to_the_embedding_rows() {
        let kv = gguf_tokenizer_keys(JSON.as_bytes(), None, 6).expect("keys");
        let (t, ty) = tokens(&kv);
        assert_eq!(t, ["a", "b", "ab", "<|end|>", "[PAD4]", "[PAD5]"]);
        assert_eq!(ty, [1, 1, 1, 3, 5, 5]);
    }

    /// An id past the embedding's rows is refused, never allocated for.
    #[test]
    fn an_id_past_the_rows_is_refused() {
        let json = JSON.replace(r#""ab": 2"#, r#""ab": 4000000000000"#);
        let e = gguf_tokenizer_keys(json.as_bytes(), None, 6)
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains("\"ab\" has id 4000000000000, past the 6 rows"),
            "{e}"
        );
        let e = gguf_tokenizer_keys(json.as_bytes(), None, 0).expect_err("refused");
        assert!(e.to_string().contains("past the 4 rows"), "{e}");
    }
}
