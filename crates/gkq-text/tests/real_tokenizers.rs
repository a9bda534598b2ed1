//! The tokenizers of the real GGUFs (SmolLM2's byte-level BPE, Gemma 3's
//! SentencePiece), built from their `tokenizer.ggml.*` keys, give
//! llama.cpp's ids on a varied text set (fixtures/tokenizer: English,
//! code, numbers, accents, CJK, Cyrillic, emoji, runs of white space,
//! special-token strings), and decode back to the text.

use gkq_text::Tokenizer;

fn tokenizer(path: &std::path::Path) -> Tokenizer {
    let bytes = std::fs::read(path).expect("gguf");
    let g = gkq_format::gguf::Gguf::parse(&bytes).expect("parse");
    Tokenizer::from_gguf(&g, 1 << 20).expect("tokenizer")
}

fn check(model: &str, t: &Tokenizer) {
    let mut wrong = Vec::new();
    for (name, text, want) in fixtures::tokenizer_cases(model) {
        let got = t.encode(&text).expect("encode");
        if got != want {
            wrong.push(format!("{name}: got {got:?}\n  llama.cpp {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "{model}:\n{}", wrong.join("\n"));
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
