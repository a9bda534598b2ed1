//! The tokenizers of the real GGUFs (SmolLM2's and Qwen2.5's byte-level
//! BPE, Gemma 3's SentencePiece), built from their `tokenizer.ggml.*` keys, give
//! llama.cpp's ids on a varied text set (fixtures/tokenizer: English,
//! code, numbers, accents, CJK, Cyrillic, emoji, runs of white space,
//! special-token strings), and decode back to the text.

use gkq_text::Tokenizer;

fn tokenizer(path: &std::path::Path) -> Tokenizer {
    let bytes = std::fs::read(path).expect("gguf");
    let g = gkq_format::gguf::Gguf::parse(&bytes).expect("parse");
    Tokenizer::from_gguf(&g, 1 << 20).expect("tokenizer")
}

/// `t`'s ids against llama.cpp's on both text sets (`texts`, `edge`).
fn check(model: &str, t: &Tokenizer) {
    let mut wrong = Vec::new();
    for set in ["texts", "edge"] {
        for (name, text, want) in fixtures::tokenizer_set_cases(set, model) {
            let got = t.encode(&text).expect("encode");
            if got != want {
                wrong.push(format!("{set} {name}: got {got:?}\n  llama.cpp {want:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{model}:\n{}", wrong.join("\n"));
}

/// Issue 57: the tokenizer of SmolLM2's metadata changed as llama.cpp users
/// meet it (J7: `tokenizer.ggml.pre` `default`, or absent, split as
/// llama.cpp's default, not GPT-2's regex; J8: a token of the unknown type
/// matched whole), and the code points Unicode assigned after llama.cpp's
/// tables (U+10D40, a Garay digit, is no number to llama.cpp: it split as
/// `[256, …]` where llama.cpp gives `[216, 216, …]`), against llama.cpp.
#[test]
fn tokenizer_variants_equal_llama_cpp() {
    for variant in fixtures::TOKENIZER_VARIANTS {
        let bytes = std::fs::read(fixtures::tokenizer_model(variant)).expect("gguf");
        let mut g = gkq_format::gguf::Gguf::parse(&bytes).expect("parse");
        fixtures::tokenizer_variant(variant, &mut g.kv);
        let t = Tokenizer::from_gguf(&g, 1 << 20).expect("tokenizer");
        check(variant, &t);
    }
}

/// Issue 57, J9: what llama.cpp would take and tokenize by chance is
/// refused, naming the key: a token type outside 1..6, a NaN score.
#[test]
fn nan_scores_and_unknown_token_types_are_refused() {
    use gkq_format::gguf::{GgufArray, GgufValue};
    let bytes = std::fs::read(fixtures::gemma3()).expect("gguf");
    let g = gkq_format::gguf::Gguf::parse(&bytes).expect("parse");
    let edit = |key: &str, f: &dyn Fn(&mut GgufArray)| {
        let mut g = g.clone();
        for (k, v) in g.kv.iter_mut() {
            if k == key
                && let GgufValue::Array(a) = v
            {
                f(a);
            }
        }
        Tokenizer::from_gguf(&g, 1 << 20)
            .expect_err(key)
            .to_string()
    };
    let e = edit("tokenizer.ggml.scores", &|a| {
        if let GgufArray::F32(s) = a {
            s[300] = f32::NAN;
        }
    });
    assert!(e.contains("tokenizer.ggml.scores[300] is NaN"), "{e}");
    let e = edit("tokenizer.ggml.token_type", &|a| {
        if let GgufArray::I32(t) = a {
            t[7] = 9;
        }
    });
    assert!(e.contains("tokenizer.ggml.token_type[7] is 9"), "{e}");
}

#[test]
fn smollm2_ids_equal_llama_cpp() {
    let t = tokenizer(&fixtures::smollm2());
    check("smollm2", &t);
    // text out: the pieces give the text back; control tokens render as nothing
    let ids = t.encode("Café 🤖\n\tdone").expect("encode");
    assert_eq!(t.decode(&ids), "Café 🤖\n\tdone");
    let im_end = t.encode("<|im_end|>").expect("encode");
    assert_eq!(im_end, [2]);
    assert!(
        t.is_eog(2) && t.is_eog(0),
        "<|im_end|> and <|endoftext|> end a generation"
    );
    assert_eq!(t.decode(&im_end), "");
}

#[test]
fn gemma3_ids_equal_llama_cpp() {
    let t = tokenizer(&fixtures::gemma3());
    check("gemma3", &t);
    let ids = t.encode("Hello world").expect("encode");
    assert_eq!(ids[0], 2, "BOS added, as the GGUF says");
    assert_eq!(t.decode(&ids), "Hello world");
    let eot = t.encode("<end_of_turn>").expect("encode");
    assert!(
        t.is_eog(*eot.last().expect("id")),
        "<end_of_turn> ends a generation"
    );
}

/// The second oracle: Hugging Face's `tokenizers` and `jinja2`
/// (scripts/hf_tokenize.py) give the same ids for the texts, and the same
/// rendered chat and ids for conversations through the GGUF's template.
#[test]
fn smollm2_ids_and_chat_equal_hugging_face() {
    use gkq_text::ChatMessage;
    let path = fixtures::smollm2();
    let t = tokenizer(&path);
    let cases = fixtures::tokenizer_cases("smollm2");
    let chats: Vec<Vec<ChatMessage>> = vec![
        vec![ChatMessage::new("user", "What is the capital of France?")],
        vec![
            ChatMessage::new("system", "You answer in one word."),
            ChatMessage::new("user", "Café, 東京 or Москва? 🤖"),
            ChatMessage::new("assistant", "Tokyo"),
            ChatMessage::new("user", "Why?\n\n  Explain."),
        ],
    ];
    let mut requests: Vec<serde_json::Value> = cases
        .iter()
        .map(|(_, text, _)| serde_json::json!({ "text": text }))
        .collect();
    for c in &chats {
        let m: Vec<_> = c
            .iter()
            .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
            .collect();
        requests.push(serde_json::json!({ "messages": m }));
    }
    let answers = fixtures::gguf::hf_tokenize(&path, &requests).expect("hf_tokenize.py");
    assert_eq!(answers.len(), requests.len());
    for ((name, text, _), a) in cases.iter().zip(&answers) {
        let want: Vec<u32> = serde_json::from_value(a["ids"].clone()).expect("ids");
        assert_eq!(t.encode(text).expect("encode"), want, "{name}");
    }
    for (c, a) in chats.iter().zip(&answers[cases.len()..]) {
        let (rendered, ids) = t.encode_chat(c, true, 8192).expect("chat");
        assert_eq!(rendered, a["rendered"].as_str().expect("rendered"));
        let want: Vec<u32> = serde_json::from_value(a["ids"].clone()).expect("ids");
        assert_eq!(ids, want, "{rendered}");
    }
}

/// Issue 54: Qwen2.5-Coder-0.5B's tokenizer (byte-level BPE, pre-tokenizer
/// `qwen2`, 151,936 rows, no BOS) gives llama.cpp's ids on both text sets;
/// `<|im_end|>` is 151645 and ends a generation.
#[test]
fn qwen05_ids_equal_llama_cpp() {
    let t = tokenizer(&fixtures::qwen05());
    check("qwen05", &t);
    assert_eq!(t.added_bos(), None, "no BOS on raw text");
    assert_eq!(t.encode("<|im_end|>").expect("encode"), [151645]);
    assert!(t.is_eog(151645));
}
