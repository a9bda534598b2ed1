//! Chat templates: the model's Jinja template (`tokenizer.chat_template`
//! in a GGUF, `chat_template` in tokenizer_config.json) rendered with
//! minijinja the way Hugging Face's `apply_chat_template` renders it with
//! jinja2: `trim_blocks` and `lstrip_blocks`, Python's string and dict
//! methods (minijinja-contrib's pycompat), `raise_exception`, and the
//! context `messages`, `add_generation_prompt`, `bos_token`, `eos_token`.

use serde::Serialize;

use crate::{Result, TextError};

/// One message of a chat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// Its text.
    pub content: String,
}

impl ChatMessage {
    /// A message of `role`.
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.to_owned(),
            content: content.to_owned(),
        }
    }
}

fn raise_exception(msg: String) -> std::result::Result<String, minijinja::Error> {
    Err(minijinja::Error::new(
        minijinja::ErrorKind::InvalidOperation,
        msg,
    ))
}

/// `template` rendered for `messages`.
pub(crate) fn render(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    (bos, eos): (&str, &str),
) -> Result<String> {
    let bad = |e: minijinja::Error| {
        let mut why = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            why.push_str(&format!(": {c}"));
            cause = c.source();
        }
        TextError::Template(why)
    };
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_template("chat", template).map_err(bad)?;
    let ctx = minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos,
        eos_token => eos,
    };
    env.get_template("chat")
        .map_err(bad)?
        .render(ctx)
        .map_err(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

    #[test]
    fn chatml_with_its_default_system_prompt() {
        let out = render(
            CHATML,
            &[ChatMessage::new("user", "Hi")],
            true,
            ("<|im_start|>", "<|im_end|>"),
        )
        .expect("render");
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_methods_and_raise_exception_work() {
        let t = "{% if messages[0]['role'] == 'bad' %}{{ raise_exception('no ' + messages[0]['role']) }}{% endif %}{{ messages[0]['content'].strip() | upper }}";
        assert_eq!(
            render(t, &[ChatMessage::new("user", " hi ")], false, ("", "")).expect("ok"),
            "HI"
        );
        let e = render(t, &[ChatMessage::new("bad", "x")], false, ("", "")).expect_err("raised");
        assert!(e.to_string().contains("no bad"), "{e}");
    }
}
