//! The prompt's ids: given, or text tokenized with the package's own
//! tokenizer (its tokenizer.json, or the tokenizer of the GGUF it was packed
//! from), raw or rendered with the model's chat template.

use std::path::PathBuf;

use gkq_text::{ChatMessage, Tokenizer};

use super::RunOptions;
use gkq_decode::Stage;
use gkq_decode::{DecodeError, Result};

/// The prompt a run decodes after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Prompt {
    /// Token ids (`--prompt-ids`): ids out, no tokenizer, no end token.
    Ids(Vec<u32>),
    /// Raw text (`--prompt`, `--file`): tokenized as the model's tokenizer
    /// tokenizes a prompt (BOS as the model adds it, special-token strings
    /// parsed).
    Text(String),
    /// A chat turn (`--chat`, with `--system`), rendered with the model's
    /// chat template, ending with the assistant's turn.
    Chat {
        /// The system message.
        system: Option<String>,
        /// The user's message.
        user: String,
    },
    /// Hidden states an input stage wrote (`--roles output --hidden-in`).
    HiddenIn(PathBuf),
    /// Conversation mode (`-cnv`): the turns come from stdin.
    Conversation {
        /// The system message (`--system`, or `-p`/`-f` as llama-cli takes
        /// them in conversation mode).
        system: Option<String>,
        /// The first turn (`--chat`), before the ones read.
        first: Option<String>,
    },
}

/// A prompt made: its ids, the tokenizer (text in or out), the rendered chat.
pub(crate) struct Made {
    pub(crate) ids: Vec<u32>,
    pub(crate) tokenizer: Option<Tokenizer>,
    pub(crate) rendered: Option<String>,
}

/// The tokenizer of the package read by `stage` (or `--tokenizer`), with
/// the architecture's chat template when the package carries none.
pub(crate) fn tokenizer(o: &RunOptions, stage: &Stage) -> Result<Tokenizer> {
    let vocab = stage.reader().embedding()?.vocab();
    let r = stage.reader();
    let listed = r.knot().header().header().package_file_names();
    let read = |name: &str| r.package_file(name).map(|b| b.to_vec());
    let t = Tokenizer::of_package(o.tokenizer.as_deref(), listed, read, vocab)?;
    let t = match &o.chat_template {
        Some(template) => t.with_template(template.clone()),
        None => t,
    };
    Ok(t.or_template(stage.config().decoder.chat_template))
}

/// ChatML, as Hugging Face's templates and llama.cpp's `chatml` write it.
const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The templates `--chat-template` knows by name, as llama.cpp's do.
const NAMED_TEMPLATES: &[(&str, &str)] = &[
    ("chatml", CHATML),
    ("gemma", gkq_format::arch::GEMMA3_CHAT_TEMPLATE),
];

/// Most bytes of a template file.
const MAX_TEMPLATE_FILE: u64 = 1 << 20;

/// `--chat-template NAME|FILE`: a named template, else a file's text.
pub(crate) fn chat_template(given: &str) -> Result<String> {
    if let Some((_, t)) = NAMED_TEMPLATES.iter().find(|(n, _)| *n == given) {
        return Ok((*t).to_owned());
    }
    let path = std::path::Path::new(given);
    if !path.exists() {
        let names: Vec<&str> = NAMED_TEMPLATES.iter().map(|(n, _)| *n).collect();
        return Err(DecodeError::Usage(format!(
            "--chat-template {given}: neither a template this tool names ({}) nor a file",
            names.join(", ")
        )));
    }
    let bytes = gkq_files::read_bounded(
        path,
        MAX_TEMPLATE_FILE,
        "chat template",
        gkq_files::Follow::Yes,
    )
    .map_err(|e| DecodeError::Usage(e.to_string()))?;
    String::from_utf8(bytes)
        .map_err(|_| DecodeError::Usage(format!("--chat-template {given}: not UTF-8 text")))
}

/// The prompt of `o`, for the chain whose first stage is `stage`.
pub(crate) fn make(o: &RunOptions, stage: &Stage) -> Result<Made> {
    match &o.prompt {
        Prompt::Ids(ids) => Ok(Made {
            ids: ids.clone(),
            tokenizer: None,
            rendered: None,
        }),
        Prompt::Text(text) => {
            let t = tokenizer(o, stage)?;
            Ok(Made {
                ids: t.encode(text)?,
                tokenizer: Some(t),
                rendered: None,
            })
        }
        Prompt::Chat { system, user } => {
            let t = tokenizer(o, stage)?;
            let mut messages = Vec::new();
            if let Some(s) = system {
                messages.push(ChatMessage::new("system", s));
            }
            messages.push(ChatMessage::new("user", user));
            let positions = stage.config().position_limit();
            let (rendered, ids) = t.encode_chat(&messages, true, positions)?;
            Ok(Made {
                ids,
                tokenizer: Some(t),
                rendered: Some(rendered),
            })
        }
        Prompt::HiddenIn(_) => Err(DecodeError::Usage(
            "--hidden-in is read by an output stage (--roles output)".into(),
        )),
        Prompt::Conversation { .. } => Err(DecodeError::Usage(
            "a conversation (-cnv) runs the whole model: --roles all, without --hidden-out".into(),
        )),
    }
}
