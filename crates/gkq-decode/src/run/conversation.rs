//! Conversation mode (`-cnv`, `-i`), as llama-cli's: the user's turns read
//! from stdin, one line each, rendered with the model's chat template and
//! answered as the text comes. The KV cache stays between turns, so a turn
//! prefills only what it adds to the chat: the chat rendered with it, less
//! what the cache holds (the chat before the reply rendered, then the
//! reply; `gkq_text::Tokenizer::encode_chat_turn`), as llama.cpp's
//! `common_chat_format_single` takes a turn.
//! It ends at the end of the input or at `/exit`; then one block of the
//! figures of the whole conversation (with `--json`: one object per turn,
//! no block).

use std::io::{BufRead, Read};

use gkq_decode::{DecodeError, Generation, Result, Stage};
use gkq_text::{ChatMessage, Tokenizer};

use super::{Out, RunOptions, report, write_err};

/// The longest turn read, in bytes: a longer line is refused, not held (a
/// turn must fit the context in any case).
const MAX_TURN_BYTES: u64 = 1 << 20;

/// Holds the conversation: `system` is the system message, `first` a
/// turn given on the command line before those read.
pub(crate) fn converse(
    o: &RunOptions,
    chain: &mut [Stage],
    (system, first): (Option<&str>, Option<&str>),
    out: &mut Out<'_>,
) -> Result<()> {
    let t = super::prompt::tokenizer(o, &chain[0])?;
    if !t.has_template() {
        return Err(DecodeError::Usage(
            "a conversation (-cnv) renders its turns with the model's chat template, and this package carries none: give --chat-template NAME|FILE, or a raw prompt with -p".into(),
        ));
    }
    let positions = chain[0].config().position_limit();
    let mut messages: Vec<ChatMessage> = system
        .map(|s| ChatMessage::new("system", s))
        .into_iter()
        .collect();
    let mut next = first.map(str::to_owned);
    // the last token of a reply that did not end at an end token: picked,
    // not yet run through the layers
    let mut pending = None;
    let mut total: Option<Generation> = None;
    for turn in 1.. {
        let Some(user) = next
            .take()
            .map_or_else(|| read_turn(o, out), |u| Ok(Some(u)))?
        else {
            break;
        };
        messages.push(ChatMessage::new("user", &user));
        let position = chain[0].position();
        let (rendered, ids) = turn_ids(&t, chain, &messages, pending.take(), positions)?;
        let g = super::stream(o, chain, Some(&t), &ids, out)?;
        messages.push(ChatMessage::new("assistant", &t.decode(report::shown(&g))));
        pending = (g.stop != "eos")
            .then(|| g.tokens.last().copied())
            .flatten();
        if o.json {
            let mut v = report::json(o, (Some(&t), Some(&rendered)), &g)?;
            v["turn"] = serde_json::json!(turn);
            v["position"] = serde_json::json!(position);
            writeln!(out.stdout, "{v}").map_err(write_err)?;
        }
        total = Some(match total {
            None => g,
            Some(all) => merge(all, g),
        });
    }
    match total.filter(|_| !o.json) {
        Some(g) => {
            let turns = messages.iter().filter(|m| m.role == "user").count();
            let g = Generation {
                // the block's "[end of text]" is a single decode's
                stop: "end of input",
                ..g
            };
            let block = report::perf_block(&g, report::from_start(o, &g), o.verbose);
            writeln!(out.stderr, "\nconversation: {turns} turns\n{block}").map_err(write_err)
        }
        None => Ok(()),
    }
}

/// The ids a turn runs: what it adds to the chat, after the last token of
/// a cut reply; the whole chat, from an empty cache, on the first turn or
/// when the template rewrote an earlier turn.
fn turn_ids(
    t: &Tokenizer,
    chain: &mut [Stage],
    messages: &[ChatMessage],
    pending: Option<u32>,
    positions: usize,
) -> Result<(String, Vec<u32>)> {
    if chain[0].position() > 0 {
        if let Some((text, ids)) = t.encode_chat_turn(messages, positions)? {
            return Ok((text, pending.into_iter().chain(ids).collect()));
        }
        for s in chain.iter_mut() {
            s.reset();
        }
    }
    Ok(t.encode_chat(messages, true, positions)?)
}

/// The next turn from stdin (a `> ` before it, as llama-cli's): `None` at
/// the end of the input or at `/exit`; blank lines skipped.
fn read_turn(o: &RunOptions, out: &mut Out<'_>) -> Result<Option<String>> {
    loop {
        if !o.json {
            write!(out.stdout, "\n> ").map_err(write_err)?;
            out.stdout.flush().map_err(write_err)?;
        }
        let mut line = Vec::new();
        let n = (&mut *out.stdin)
            .take(MAX_TURN_BYTES + 1)
            .read_until(b'\n', &mut line)
            .map_err(|error| DecodeError::Io {
                path: "<stdin>".into(),
                error,
            })?;
        if n == 0 {
            return Ok(None);
        }
        if line.len() as u64 > MAX_TURN_BYTES {
            return Err(DecodeError::Usage(format!(
                "a turn of more than {MAX_TURN_BYTES} bytes on stdin: a turn is one line"
            )));
        }
        let text = String::from_utf8(line)
            .map_err(|_| DecodeError::Usage("a turn on stdin is not UTF-8 text".into()))?;
        match text.trim_end_matches(['\n', '\r']) {
            "/exit" => return Ok(None),
            t if t.trim().is_empty() => continue,
            t => return Ok(Some(t.to_owned())),
        }
    }
}

/// The figures of two turns as one: the tokens and the times added, the
/// time to first token of the earlier, the bytes (counted from the open)
/// and the stop of the later.
fn merge(a: Generation, b: Generation) -> Generation {
    // generation time: tokens after each turn's first, at its rate
    let timed = |g: &Generation| g.tokens.len().saturating_sub(1);
    let gen_ms = |g: &Generation| match g.tokens_per_second {
        r if r > 0.0 => timed(g) as f64 / r * 1e3,
        _ => 0.0,
    };
    let (ms, counted) = (gen_ms(&a) + gen_ms(&b), timed(&a) + timed(&b));
    let prefill = a.prefill_ms + b.prefill_ms;
    let waited = a.prefill_wait_ms + b.prefill_wait_ms;
    let prompt_ids = [a.prompt_ids, b.prompt_ids].concat();
    Generation {
        prefill_tokens_per_second: match prefill - waited {
            d if d > 0.0 => prompt_ids.len() as f64 / (d / 1e3),
            _ => 0.0,
        },
        tokens_per_second: if ms > 0.0 {
            counted as f64 / (ms / 1e3)
        } else {
            0.0
        },
        prompt_ids,
        tokens: [a.tokens, b.tokens].concat(),
        logits_sha256: [a.logits_sha256, b.logits_sha256].concat(),
        prefill_ms: prefill,
        prefill_wait_ms: waited,
        time_to_first_token_ms: a.time_to_first_token_ms,
        first_logits: a.first_logits,
        ..b
    }
}
