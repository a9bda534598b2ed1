//! A package's tokenizer, as a node uses it (feature `tokenizer`), from
//! whatever the package carries: a `tokenizer.json` (with its
//! `tokenizer_config.json`: the chat template, BOS and EOS), or, for a
//! GGUF-born package, the GGUF's own `tokenizer.ggml.*` keys kept in
//! `metadata.gguf` ([`Tokenizer::from_gguf`]): ids equal llama.cpp's for
//! the same text. Text in ([`Tokenizer::encode`], [`Tokenizer::encode_chat`])
//! and text out ([`Tokenizer::piece`], [`TextStream`], the end-of-generation
//! ids).

mod chat;
mod gguf;
mod spm;
mod to_gguf;
mod vocab;

use std::path::Path;

use gkq_format::gguf::Gguf;

pub use chat::{ChatMessage, MAX_RENDERED_BYTES, TEMPLATE_FUEL};
pub use to_gguf::gguf_tokenizer_keys;
pub use vocab::TextStream;

use crate::{MAX_TOKENIZER_BYTES, Result, TextError, Workload};
use vocab::{Render, Vocab};

/// How ids are found.
enum Engine {
    /// Hugging Face's tokenizers: a `tokenizer.json`, or a GGUF's BPE
    /// rebuilt as one; `post`: its own post-processor adds the specials.
    Hf {
        t: Box<tokenizers::Tokenizer>,
        post: bool,
    },
    /// llama.cpp's SentencePiece, with its special tokens.
    Spm(Box<(spm::Spm, spm::Specials)>),
}

/// A tokenizer (see the module docs).
pub struct Tokenizer {
    engine: Engine,
    vocab: Vocab,
    template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("ids", &self.vocab.len())
            .field("template", &self.template.is_some())
            .finish()
    }
}

fn tok_err(e: impl std::fmt::Display) -> TextError {
    TextError::Tokenizer(e.to_string())
}

/// A token's text in `tokenizer_config.json`: a string, or `{"content": …}`.
fn token_text(v: &serde_json::Value) -> Option<String> {
    v.as_str()
        .or_else(|| v["content"].as_str())
        .map(str::to_owned)
}

/// The chat template of `tokenizer_config.json`: a string, or a list of
/// named templates of which the `default` one.
fn config_template(v: &serde_json::Value) -> Option<String> {
    match &v["chat_template"] {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_owned),
        _ => None,
    }
}

impl Tokenizer {
    /// The tokenizer of `tokenizer.json` bytes, for an embedding of `rows`
    /// rows: padding and truncation off; more ids than rows is
    /// [`TextError::TokenizerVocab`].
    pub fn from_bytes(json: &[u8], rows: u64) -> Result<Tokenizer> {
        Tokenizer::from_json(json, None, None, rows)
    }

    /// As [`Tokenizer::from_bytes`], with the package's
    /// `tokenizer_config.json` (chat template, BOS and EOS) and
    /// `generation_config.json` (more end-of-generation ids) when it has them.
    pub fn from_json(
        json: &[u8],
        config: Option<&[u8]>,
        generation: Option<&[u8]>,
        rows: u64,
    ) -> Result<Tokenizer> {
        let mut t = tokenizers::Tokenizer::from_bytes(json).map_err(tok_err)?;
        t.with_padding(None);
        t.with_truncation(None).map_err(tok_err)?;
        let ids = t.get_vocab_size(true) as u64;
        if ids > rows {
            return Err(TextError::TokenizerVocab { ids, rows });
        }
        let doc: serde_json::Value = serde_json::from_slice(json).map_err(tok_err)?;
        let cfg: serde_json::Value = match config {
            Some(c) => serde_json::from_slice(c)
                .map_err(|e| tok_err(format!("tokenizer_config.json: {e}")))?,
            None => serde_json::Value::Null,
        };
        let vocab = json_vocab(&t, &doc, &cfg, generation);
        Ok(Tokenizer {
            engine: Engine::Hf {
                t: Box::new(t),
                post: true,
            },
            vocab,
            template: config_template(&cfg),
        })
    }

    /// The tokenizer in the `tokenizer.json` file `path` (at most
    /// [`MAX_TOKENIZER_BYTES`]), as [`Tokenizer::from_bytes`].
    pub fn from_file(path: &Path, rows: u64) -> Result<Tokenizer> {
        let json = gkq_files::read_bounded(
            path,
            MAX_TOKENIZER_BYTES,
            "a tokenizer.json",
            gkq_files::Follow::Yes,
        )?;
        Tokenizer::from_bytes(&json, rows)
    }

    /// The tokenizer of a GGUF's bytes (`metadata.gguf`), as
    /// [`Tokenizer::from_gguf`].
    pub fn from_gguf_bytes(bytes: &[u8], rows: u64) -> Result<Tokenizer> {
        let g = Gguf::parse(bytes).map_err(|e| tok_err(format!("metadata.gguf: {e}")))?;
        Tokenizer::from_gguf(&g, rows)
    }

    /// The tokenizer of a package whose files are `listed`
    /// (`package.files`), read with `read`: its `tokenizer.json` (with
    /// `tokenizer_config.json` and `generation_config.json`), else its
    /// `metadata.gguf`'s GGUF tokenizer.
    pub fn from_package<E: std::fmt::Display>(
        listed: &[String],
        read: impl Fn(&str) -> std::result::Result<Vec<u8>, E>,
        rows: u64,
    ) -> Result<Tokenizer> {
        let read = |n: &str| {
            // the file is listed, so this is the network or damage, not a
            // package without a tokenizer
            read(n).map_err(|e| TextError::PackageRead(format!("reading the package's {n}: {e}")))
        };
        let has = |n: &str| listed.iter().any(|f| f == n);
        let opt = |n: &str| -> Result<Option<Vec<u8>>> { has(n).then(|| read(n)).transpose() };
        if has("tokenizer.json") {
            let json = read("tokenizer.json")?;
            let cfg = opt("tokenizer_config.json")?;
            let gen_cfg = opt("generation_config.json")?;
            return Tokenizer::from_json(&json, cfg.as_deref(), gen_cfg.as_deref(), rows);
        }
        if has("metadata.gguf") {
            return Tokenizer::from_gguf_bytes(&read("metadata.gguf")?, rows);
        }
        Err(TextError::Tokenizer(format!(
            "the package carries no tokenizer: neither tokenizer.json nor a GGUF's metadata.gguf (package.files: {})",
            listed.join(", ")
        )))
    }

    /// The tokenizer a node uses: the file `file` (`--tokenizer`) when
    /// given, else the package's ([`Tokenizer::from_package`]).
    pub fn of_package<E: std::fmt::Display>(
        file: Option<&Path>,
        listed: &[String],
        read: impl Fn(&str) -> std::result::Result<Vec<u8>, E>,
        rows: u64,
    ) -> Result<Tokenizer> {
        match file {
            Some(p) => Tokenizer::from_file(p, rows),
            None => Tokenizer::from_package(listed, read, rows),
        }
    }

    /// Uses `template` as the chat template, whatever the package carries
    /// (`--chat-template`).
    pub fn with_template(mut self, template: String) -> Tokenizer {
        self.template = Some(template);
        self
    }

    /// Uses `template` when the package carries no chat template (an
    /// architecture's standard one; see gkq-decode's table).
    pub fn or_template(mut self, template: Option<&str>) -> Tokenizer {
        if self.template.is_none() {
            self.template = template.map(str::to_owned);
        }
        self
    }

    /// The ids of `text` as a prompt: special tokens in the text are parsed
    /// as specials, and BOS/EOS added as the model adds them (llama.cpp's
    /// `llama-tokenize` defaults; Hugging Face's `add_special_tokens`).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, true)
    }

    fn encode_with(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let v = &self.vocab;
        if add_special && v.add_bos {
            out.extend(v.bos);
        }
        match &self.engine {
            Engine::Hf { t, post } => {
                let enc = t.encode(text, add_special && *post).map_err(tok_err)?;
                out.extend_from_slice(enc.get_ids());
            }
            Engine::Spm(s) => {
                let (spm, specials) = s.as_ref();
                spm.encode(&specials.partition(text, true), &mut out)?;
            }
        }
        if add_special && v.add_eos {
            out.extend(v.eos);
        }
        Ok(out)
    }

    /// `messages` rendered with the model's chat template (and the prompt of
    /// the assistant's turn when `add_generation_prompt`), and its ids:
    /// specials parsed, nothing added beyond what the template writes (as
    /// `apply_chat_template(tokenize=True)` does). The prompt must fit
    /// `positions` tokens (the model's context): the rendering stops, an
    /// error, once it passes `positions` × the longest token's bytes
    /// (or [`MAX_RENDERED_BYTES`]), before anything is tokenized; and the
    /// ids must be no more than `positions`.
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        positions: usize,
    ) -> Result<(String, Vec<u32>)> {
        let text = self.render(messages, add_generation_prompt, positions)?;
        self.encode_rendered(text, positions)
    }

    /// What the last message of a chat adds to a decoder that answered the
    /// one before it, and its ids (specials parsed, nothing added; bounded
    /// as [`Tokenizer::encode_chat`]'s). Such a decoder holds the chat
    /// before its reply rendered with the assistant's prompt, then the
    /// reply's tokens (not the end token it stopped at); what it lacks is
    /// `messages` rendered with the assistant's prompt, less that. `None`
    /// when that is not where the rendering begins (a template that trims
    /// a reply or rewrites an earlier turn), or when the message before the
    /// last is not the assistant's: the caller renders the whole chat
    /// again.
    pub fn encode_chat_turn(
        &self,
        messages: &[ChatMessage],
        positions: usize,
    ) -> Result<Option<(String, Vec<u32>)>> {
        let Some((reply, before)) = messages
            .len()
            .checked_sub(2)
            .map(|i| (&messages[i], &messages[..i]))
            .filter(|(r, _)| r.role == "assistant")
        else {
            return Ok(None);
        };
        let held = self.render(before, true, positions)? + &reply.content;
        let all = self.render(messages, true, positions)?;
        match all.strip_prefix(held.as_str()) {
            Some(turn) => Ok(Some(self.encode_rendered(turn.to_owned(), positions)?)),
            None => Ok(None),
        }
    }

    /// `messages` rendered with the model's chat template, bounded by
    /// `positions` × the longest token's bytes.
    fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        positions: usize,
    ) -> Result<String> {
        let template = self.template.as_deref().ok_or_else(|| {
            TextError::Template(
                "the package carries no chat template (tokenizer.chat_template, or chat_template in tokenizer_config.json): give the prompt as raw text".into(),
            )
        })?;
        let v = &self.vocab;
        let max = positions.saturating_mul(v.longest().max(1));
        chat::render(
            template,
            messages,
            add_generation_prompt,
            (&v.bos_text, &v.eos_text),
            max,
        )
    }

    /// The ids of a rendered chat, at most `positions` of them.
    fn encode_rendered(&self, text: String, positions: usize) -> Result<(String, Vec<u32>)> {
        let ids = self.encode_with(&text, false)?;
        if ids.len() > positions {
            return Err(TextError::Template(format!(
                "the rendered chat prompt is {} tokens, more than the model's {positions} positions",
                ids.len()
            )));
        }
        Ok((text, ids))
    }

    /// Whether the package carries a chat template.
    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// The bytes `id` renders as (nothing for a control token).
    pub fn piece(&self, id: u32) -> &[u8] {
        self.vocab.piece(id)
    }

    /// The text of `ids`, control tokens left out.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut s = TextStream::default();
        let mut out: String = ids.iter().map(|&i| s.push(self.piece(i))).collect();
        out.push_str(&s.finish());
        out
    }

    /// The BOS id a prompt starts with, when the model adds one.
    pub fn added_bos(&self) -> Option<u32> {
        self.vocab.bos.filter(|_| self.vocab.add_bos)
    }

    /// Whether `id` ends a generation (EOS, end-of-turn, …).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// The ids that end a generation.
    pub fn eog(&self) -> Vec<u32> {
        self.vocab.eog.iter().copied().collect()
    }

    /// Every session of every workload, tokenized: `(name, ids per session)`.
    pub fn encode_all(&self, workloads: &[Workload]) -> Result<Vec<(String, Vec<Vec<u32>>)>> {
        workloads
            .iter()
            .map(|w| {
                let ids: Result<Vec<Vec<u32>>> =
                    w.sessions.iter().map(|s| self.encode(s)).collect();
                Ok((w.name.clone(), ids?))
            })
            .collect()
    }
}

/// The pieces and specials of a `tokenizer.json` (and its config).
fn json_vocab(
    t: &tokenizers::Tokenizer,
    doc: &serde_json::Value,
    cfg: &serde_json::Value,
    generation: Option<&[u8]>,
) -> Vocab {
    let byte_level = doc["decoder"]["type"] == "ByteLevel";
    let special: std::collections::HashSet<u32> = doc["added_tokens"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|x| x["special"] == true)
                .filter_map(|x| x["id"].as_u64().and_then(|i| u32::try_from(i).ok()))
                .collect()
        })
        .unwrap_or_default();
    let mut v = Vocab::default();
    let n = u32::try_from(t.get_vocab_size(true)).unwrap_or(u32::MAX);
    for id in 0..n {
        let text = t.id_to_token(id).unwrap_or_default();
        let render = if special.contains(&id) {
            Render::Hidden
        } else {
            Render::Bytes
        };
        let bytes = if special.contains(&id) {
            text.into_bytes()
        } else if byte_level {
            gguf_byte_level(&text)
        } else if let Some(b) = text
            .strip_prefix("<0x")
            .and_then(|h| h.strip_suffix('>'))
            .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            vec![b]
        } else {
            text.replace('\u{2581}', " ").into_bytes()
        };
        v.push(&bytes, render);
    }
    let id_of = |s: Option<String>| s.and_then(|s| t.token_to_id(&s));
    v.bos_text = token_text(&cfg["bos_token"]).unwrap_or_default();
    v.eos_text = token_text(&cfg["eos_token"]).unwrap_or_default();
    v.bos = id_of(token_text(&cfg["bos_token"]));
    v.eos = id_of(token_text(&cfg["eos_token"]));
    if let Some(g) = generation.and_then(|g| serde_json::from_slice::<serde_json::Value>(g).ok()) {
        let ids = match &g["eos_token_id"] {
            serde_json::Value::Array(a) => a.iter().filter_map(|x| x.as_u64()).collect(),
            x => x.as_u64().into_iter().collect::<Vec<u64>>(),
        };
        v.eog
            .extend(ids.into_iter().filter_map(|i| u32::try_from(i).ok()));
    }
    let texts: Vec<(u32, String)> = (0..n)
        .filter_map(|i| t.id_to_token(i).map(|s| (i, s)))
        .filter(|(_, s)| vocab::EOG_TEXTS.contains(&s.as_str()))
        .collect();
    v.find_eog(texts.iter().map(|(i, s)| (*i, s.as_str())));
    v
}

/// The bytes of a byte-level token (see the `gguf` module).
fn gguf_byte_level(token: &str) -> Vec<u8> {
    gguf::byte_level_bytes(token)
}
