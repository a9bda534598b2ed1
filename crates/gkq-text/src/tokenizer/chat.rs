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

/// The most instructions a chat template runs (minijinja's fuel): real
/// templates take a few thousand for a chat; a loop without end stops here.
pub const TEMPLATE_FUEL: u64 = 2_000_000;

/// The most bytes a rendered chat prompt may hold, whatever the model:
/// 16 MiB (a model's context gives a lower bound, see
/// [`crate::Tokenizer::encode_chat`]).
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

fn raise_exception(msg: String) -> std::result::Result<String, minijinja::Error> {
    Err(minijinja::Error::new(
        minijinja::ErrorKind::InvalidOperation,
        msg,
    ))
}

/// The rendered text, refused once it would pass `max` bytes.
struct Bounded {
    out: Vec<u8>,
    max: usize,
    over: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.out.len().saturating_add(b.len()) > self.max {
            self.over = true;
            return Err(std::io::Error::other("the output limit"));
        }
        self.out.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Python's white space (`str.isspace`, what jinja2's `trim` and
/// `str.strip` remove): Rust's, and the four information separators
/// U+001C to U+001F, which Rust's `char::is_whitespace` does not count.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `s` stripped as Python strips it: of `chars` when given, else of
/// Python's white space; `(start, end)` say which ends.
fn py_strip<'a>(s: &'a str, chars: Option<&str>, (start, end): (bool, bool)) -> &'a str {
    let strip = |c: char| chars.map_or_else(|| py_space(c), |set| set.contains(c));
    let s = if start {
        s.trim_start_matches(strip)
    } else {
        s
    };
    if end { s.trim_end_matches(strip) } else { s }
}

fn too_large(what: String, max: usize) -> minijinja::Error {
    minijinja::Error::new(
        minijinja::ErrorKind::InvalidOperation,
        format!("{what}, over the limit of {max} bytes of a rendered prompt"),
    )
}

/// The arguments of jinja2's `indent`: `width`, `first`, `blank`,
/// positional or named.
type IndentArgs = (
    String,
    Option<minijinja::Value>,
    Option<bool>,
    Option<bool>,
    minijinja::value::Kwargs,
);

/// jinja2's `indent` (its `width` a count of spaces or a string), refused
/// when the result would pass the output limit `max` before it is built.
fn indent(
    max: usize,
    (s, width, first, blank, kw): IndentArgs,
) -> std::result::Result<String, minijinja::Error> {
    let width = match width {
        Some(w) => Some(w),
        None => kw.get::<Option<minijinja::Value>>("width")?,
    };
    let first = first.or(kw.get::<Option<bool>>("first")?).unwrap_or(false);
    let blank = blank.or(kw.get::<Option<bool>>("blank")?).unwrap_or(false);
    kw.assert_all_used()?;
    let pad = match &width {
        None => " ".repeat(4),
        Some(w) => match (w.as_str(), w.as_usize()) {
            (Some(t), _) => t.to_owned(),
            (None, Some(n)) if n <= max => " ".repeat(n),
            _ => return Err(too_large(format!("indent({w})"), max)),
        },
    };
    // jinja2: `s + "\n"` cut by Python's `splitlines`
    let text = format!("{s}\n");
    let lines = py_splitlines(&text);
    let need = pad
        .len()
        .saturating_mul(lines.len() + 1)
        .saturating_add(text.len());
    if need > max {
        return Err(too_large(
            format!("indent of {} lines by {} bytes", lines.len(), pad.len()),
            max,
        ));
    }
    let mut out = String::with_capacity(need);
    if first {
        out.push_str(&pad);
    }
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
            if blank || !line.is_empty() {
                out.push_str(&pad);
            }
        }
        out.push_str(line);
    }
    Ok(out)
}

/// Python's `str.splitlines()`: cut at every line boundary Python knows
/// (`\n`, `\r`, `\r\n`, `\v`, `\f`, U+001C..U+001E, U+0085, U+2028,
/// U+2029), the boundaries left out, no empty line after a last one.
fn py_splitlines(s: &str) -> Vec<&str> {
    let brk = |c: char| {
        matches!(
            c,
            '\n' | '\r' | '\u{b}' | '\u{c}' | '\u{1c}'
                ..='\u{1e}' | '\u{85}' | '\u{2028}' | '\u{2029}'
        )
    };
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(at) = rest.find(brk) {
        out.push(&rest[..at]);
        let skip = if rest[at..].starts_with("\r\n") {
            2
        } else {
            rest[at..].chars().next().map_or(1, char::len_utf8)
        };
        rest = &rest[at + skip..];
    }
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

/// `s` with `from` replaced by `to`, refused when the result would pass
/// `max` bytes.
fn replace(
    s: &str,
    from: &str,
    to: &str,
    count: Option<usize>,
    max: usize,
) -> std::result::Result<String, minijinja::Error> {
    let n = if from.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(from).count()
    };
    let n = count.map_or(n, |c| c.min(n));
    let need = s.len().saturating_add(n.saturating_mul(to.len()));
    if need > max {
        return Err(too_large(
            format!("replace() of {n} matches by {} bytes", to.len()),
            max,
        ));
    }
    Ok(match count {
        Some(c) => s.replacen(from, to, c),
        None => s.replace(from, to),
    })
}

/// Python's string methods (minijinja-contrib's), with `strip`,
/// `lstrip` and `rstrip` as Python strips and `replace` bounded by `max`.
fn methods(
    max: usize,
) -> impl Fn(
    &minijinja::State,
    &minijinja::Value,
    &str,
    &[minijinja::Value],
) -> std::result::Result<minijinja::Value, minijinja::Error>
+ Send
+ Sync
+ 'static {
    move |state, value, method, args| {
        let Some(s) = value.as_str() else {
            return minijinja_contrib::pycompat::unknown_method_callback(
                state, value, method, args,
            );
        };
        let ends = match method {
            "strip" => (true, true),
            "lstrip" => (true, false),
            "rstrip" => (false, true),
            "replace" => {
                let (from, to, count): (&str, &str, Option<i64>) =
                    minijinja::value::from_args(args)?;
                let count = count.and_then(|c| usize::try_from(c).ok());
                return replace(s, from, to, count, max).map(minijinja::Value::from);
            }
            _ => {
                return minijinja_contrib::pycompat::unknown_method_callback(
                    state, value, method, args,
                );
            }
        };
        let (chars,): (Option<&str>,) = minijinja::value::from_args(args)?;
        Ok(minijinja::Value::from(py_strip(s, chars, ends)))
    }
}

/// An environment with the chat template's functions, filters and
/// methods, its fuel and its output bound `max`.
fn environment(max: usize) -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_unknown_method_callback(methods(max));
    env.add_function("raise_exception", raise_exception);
    env.add_filter("indent", move |s, w, first, blank, kw| {
        indent(max, (s, w, first, blank, kw))
    });
    env.add_filter("trim", |s: String, chars: Option<String>| {
        py_strip(&s, chars.as_deref(), (true, true)).to_owned()
    });
    env.add_filter("replace", move |s: String, from: String, to: String| {
        replace(&s, &from, &to, None, max)
    });
    env
}

/// `template` rendered for `messages`, at most `max` bytes of it: a
/// template that runs out of fuel ([`TEMPLATE_FUEL`]) or writes more is an
/// error naming the limit.
pub(crate) fn render(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    (bos, eos): (&str, &str),
    max: usize,
) -> Result<String> {
    let bad = |e: minijinja::Error| {
        if e.kind() == minijinja::ErrorKind::OutOfFuel {
            return TextError::Template(format!(
                "the chat template ran past its fuel of {TEMPLATE_FUEL} instructions (a loop without end?)"
            ));
        }
        let mut why = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            why.push_str(&format!(": {c}"));
            cause = c.source();
        }
        TextError::Template(why)
    };
    let max = max.min(MAX_RENDERED_BYTES);
    let mut env = environment(max);
    env.add_template("chat", template).map_err(bad)?;
    let ctx = minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos,
        eos_token => eos,
    };
    let mut out = Bounded {
        out: Vec::new(),
        max,
        over: false,
    };
    let rendered = env
        .get_template("chat")
        .map_err(bad)?
        .render_captured_to(ctx, &mut out)
        .map(drop);
    if out.over {
        return Err(TextError::Template(format!(
            "the chat template's output passed {max} bytes, the limit of a rendered prompt for this model"
        )));
    }
    rendered.map_err(bad)?;
    String::from_utf8(out.out).map_err(|e| {
        TextError::Template(format!(
            "the chat template wrote bytes that are not UTF-8: {e}"
        ))
    })
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
            MAX_RENDERED_BYTES,
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
            render(
                t,
                &[ChatMessage::new("user", " hi ")],
                false,
                ("", ""),
                1 << 20
            )
            .expect("ok"),
            "HI"
        );
        let e = render(t, &[ChatMessage::new("bad", "x")], false, ("", ""), 1 << 20)
            .expect_err("raised");
        assert!(e.to_string().contains("no bad"), "{e}");
    }

    /// Issue 57: hostile templates end fast with an error naming the
    /// limit: a loop without end (fuel), a huge indent (the output limit,
    /// before the string is built), a big string written again and again
    /// (the output limit at its first write).
    #[test]
    fn hostile_templates_stop_at_a_named_limit() {
        let probes = [
            (
                "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                "fuel of 2000000 instructions",
            ),
            (
                "{{ 'x' | indent(4000000000) }}",
                "over the limit of 1048576 bytes",
            ),
            (
                "{{ 'x\ny' | indent(width=900000) }}",
                "over the limit of 1048576 bytes",
            ),
            (
                "{% for i in range(100) %}{{ 'a' * 100000000 }}{% endfor %}",
                "passed 1048576 bytes",
            ),
            (
                "{{ ('a' * 1000000) | replace('a', 'bb') }}",
                "over the limit of 1048576 bytes",
            ),
            (
                "{{ ('a' * 1000000).replace('a', 'bb') }}",
                "over the limit of 1048576 bytes",
            ),
        ];
        for (t, want) in probes {
            let start = std::time::Instant::now();
            let e = render(
                t,
                &[ChatMessage::new("user", "hi")],
                true,
                ("", ""),
                1 << 20,
            )
            .expect_err(t);
            assert!(start.elapsed().as_secs() < 5, "{t}: {:?}", start.elapsed());
            assert!(e.to_string().contains(want), "{t}: {e}");
        }
    }

    /// jinja2's `trim` and Python's `str.strip` remove U+001C..U+001F
    /// (Python's white space), which Rust's `trim` keeps.
    #[test]
    fn trim_and_strip_remove_what_python_removes() {
        let t = "{{ messages[0]['content'] | trim }}|{{ messages[0]['content'].strip() }}|{{ messages[0]['content'].lstrip() }}|{{ 'xxhixx' | trim('x') }}|{{ 'a-b' | indent }}";
        let got = render(
            t,
            &[ChatMessage::new("user", "\u{1f} hi\u{1c}\n")],
            false,
            ("", ""),
            1 << 20,
        )
        .expect("render");
        assert_eq!(got, "hi|hi|hi\u{1c}\n|hi|a-b");
        let t = "{{ 'a\n\nb' | indent(2, true) }}/{{ 'a\n\nb' | indent(2, blank=true) }}/{{ 'a\nb' | indent('> ') }}";
        let got = render(t, &[], false, ("", ""), 1 << 20).expect("render");
        // jinja2 3.1: "  a\n\n  b", "a\n  \n  b", "a\n> b"
        assert_eq!(got, "  a\n\n  b/a\n  \n  b/a\n> b");
    }

    /// `indent` as jinja2 3.1.6 renders it (the strings and the output
    /// below are jinja2's): a trailing newline kept, Python's line breaks.
    #[test]
    fn indent_is_jinja2s() {
        let t = "{% for s in messages %}{{ s.content | indent(2) }}|{{ s.content | indent(2, true) }}|{{ s.content | indent(2, blank=true) }}|{{ s.content | indent('>', true, true) }}#{% endfor %}";
        let m: Vec<ChatMessage> = ["a\n", "a\r\nb", "a\u{b}b", "\nx", "", "x\n\ny\n"]
            .iter()
            .map(|c| ChatMessage::new("user", c))
            .collect();
        let got = render(t, &m, false, ("", ""), 1 << 20).expect("render");
        let jinja2 = "a\n|  a\n|a\n  |>a\n>#a\n  b|  a\n  b|a\n  b|>a\n>b#a\n  b|  a\n  b|a\n  b|>a\n>b#\n  x|  \n  x|\n  x|>\n>x#|  ||>#x\n\n  y\n|  x\n\n  y\n|x\n  \n  y\n  |>x\n>\n>y\n>#";
        assert_eq!(got, jinja2);
    }
}
