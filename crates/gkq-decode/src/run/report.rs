//! What a run reports: the figures of a decode (text, or one JSON object
//! with the prompt's ids, the tokens, their text and why the decode
//! stopped), and the two halves of a two-process pipeline.

use super::{Out, RunOptions, write_err};
use gkq_decode::{DecodeError, Result};
use gkq_decode::{Generation, RoleBytes, Stage};
use gkq_text::Tokenizer;

/// The line after a decode that ran out of positions.
const CONTEXT_NOTE: &str =
    "\nstopped: no position left in the context (-c N for a longer one; -c 0: the model's)";

fn bytes_line(b: RoleBytes) -> String {
    format!(
        "knot header {}, embedding rows {}, lm_head {}, other blocks {}",
        b.knot_header, b.embedding_rows, b.lm_head, b.other_blocks
    )
}

fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> DecodeError + '_ {
    move |error| DecodeError::Io {
        path: path.to_owned(),
        error,
    }
}

/// The figures of `g` as lines of text; the per-step digests when `verbose`.
fn text_report(g: &Generation, from_start: f64, verbose: bool) -> String {
    let mut text = if g.tokens.is_empty() && g.prefill_ms <= 0.0 {
        // -n 0: nothing ran past the load, so there is no rate to give
        format!(
            "tokens []\nno token asked for (-n 0): loaded in {:.1} ms, {:.1} ms from process start; the prompt's {} tokens were not run",
            g.load_ms,
            from_start - g.time_to_first_token_ms + g.load_ms,
            g.prompt_ids.len(),
        )
    } else {
        format!(
            "tokens {:?}\ntime to first token {from_start:.1} ms from process start, {:.1} ms from open (load {:.1} ms, prefill {:.1} ms, {:.1} of them waiting for weights: {} tokens at {:.1} tokens/s), {:.2} tokens/s",
            g.tokens,
            g.time_to_first_token_ms,
            g.load_ms,
            g.prefill_ms,
            g.prefill_wait_ms,
            g.prompt_ids.len(),
            g.prefill_tokens_per_second,
            g.tokens_per_second,
        )
    };
    if g.stop == "context" {
        text.push_str(CONTEXT_NOTE);
    }
    text.push_str(&format!(
        "\nbytes: {} (total {})",
        bytes_line(g.bytes),
        g.bytes.total()
    ));
    if g.stage_bytes.len() > 1 {
        for (i, b) in g.stage_bytes.iter().enumerate() {
            let node = if i == 0 { "input" } else { "output" };
            text.push_str(&format!(
                "\n{node} node: {} (total {})",
                bytes_line(*b),
                b.total()
            ));
        }
    }
    for r in &g.resolutions {
        text.push_str(&format!("\n{}: {}: {}", r.role, r.path, r.reason));
    }
    if let Some(w) = warm_line(g) {
        text.push_str(&w);
    }
    for (i, d) in g.logits_sha256.iter().enumerate().filter(|_| verbose) {
        text.push_str(&format!("\nstep {i} logits sha256 {d}"));
    }
    text
}

/// `--columnar-embed` given but not used: a warning on stderr, as gkq-rows
/// gives (the dense fallback downloads the whole matrix).
fn columnar_unused(o: &RunOptions, g: &Generation, out: &mut Out<'_>) -> Result<()> {
    let Some(url) = &o.reader.columnar_embed else {
        return Ok(());
    };
    for r in g
        .resolutions
        .iter()
        .filter(|r| r.role == "token_embd" && r.path != "columnar")
    {
        writeln!(
            out.stderr,
            "gkq-decode: warning: --columnar-embed {url} is not used: the embedding's path is {}, because {} (--require-columnar makes this an error)",
            r.path, r.reason
        )
        .map_err(write_err)?;
    }
    Ok(())
}

/// The warm object's line, when `--warm` was given.
fn warm_line(g: &Generation) -> Option<String> {
    let w = g.warm.as_ref()?;
    Some(match &w.unused {
        None => format!(
            "\nwarm: {} of {} warm rows seeded in {} requests, {} bytes",
            w.seeded, w.listed, w.requests, w.bytes
        ),
        Some(why) => format!("\nwarm: the warm object is not used: {why}"),
    })
}

/// After streamed text, the figures in one short block on stderr, as
/// llama.cpp's `llama_perf_context_print` gives them: the load and what it
/// pulled, the prompt's and the generation's rates, the time to the first
/// token; how each role was served, and the per-step digests, with
/// `--verbose`.
pub(crate) fn perf_block(g: &Generation, from_start: f64, verbose: bool) -> String {
    if g.tokens.is_empty() && g.prefill_ms <= 0.0 {
        return text_report(g, from_start, verbose);
    }
    let b = g.bytes;
    let mut s = String::new();
    if g.stop == "eos" {
        s.push_str("[end of text]\n");
    }
    s.push_str(&format!(
        "load: {:.1} ms, {} bytes pulled (embedding rows {}, lm_head {}, other blocks {}, knot header {})\nprompt: {} tokens in {:.1} ms ({:.1} tokens/s)\ngeneration: {} tokens at {:.2} tokens/s\ntime to first token: {from_start:.1} ms from process start",
        g.load_ms,
        b.total(),
        b.embedding_rows,
        b.lm_head,
        b.other_blocks,
        b.knot_header,
        g.prompt_ids.len(),
        g.prefill_ms,
        g.prefill_tokens_per_second,
        g.tokens.len(),
        g.tokens_per_second,
    ));
    if g.stop == "context" {
        s.push_str(CONTEXT_NOTE);
    }
    if let Some(w) = warm_line(g) {
        s.push_str(&w);
    }
    if verbose {
        for r in &g.resolutions {
            s.push_str(&format!("\n{}: {}: {}", r.role, r.path, r.reason));
        }
        for (i, d) in g.logits_sha256.iter().enumerate() {
            s.push_str(&format!("\nstep {i} logits sha256 {d}"));
        }
    }
    s
}

/// The time to first token from the process's start, in ms.
pub(crate) fn from_start(o: &RunOptions, g: &Generation) -> f64 {
    g.time_to_first_token_ms + g.opened.saturating_duration_since(o.started).as_secs_f64() * 1e3
}

/// The JSON object of a decode: `g`, the text of its tokens (an end token
/// left out) and the rendered chat when there is one.
pub(crate) fn json(
    o: &RunOptions,
    (tokenizer, rendered): (Option<&Tokenizer>, Option<&str>),
    g: &Generation,
) -> Result<serde_json::Value> {
    let mut v = serde_json::to_value(g).map_err(|e| DecodeError::Usage(e.to_string()))?;
    v["time_to_first_token_from_start_ms"] = serde_json::json!(from_start(o, g));
    v["peak_rss_bytes"] = serde_json::json!(gkq_cli::peak_rss_bytes());
    v["threads"] = serde_json::json!(o.threads);
    v["process_threads"] = serde_json::json!(gkq_cli::thread_count());
    if let Some(t) = tokenizer {
        v["text"] = serde_json::json!(t.decode(shown(g)));
    }
    if let Some(r) = rendered {
        v["prompt"] = serde_json::json!(r);
    }
    Ok(v)
}

/// The generated tokens that are text: an end token left out.
pub(crate) fn shown(g: &Generation) -> &[u32] {
    match (g.stop, g.tokens.split_last()) {
        ("eos", Some((_, rest))) => rest,
        _ => &g.tokens,
    }
}

/// Reports a decode: the JSON object, or the figures (after streamed text,
/// on stderr; else on stdout).
pub(crate) fn generation(
    o: &RunOptions,
    (tokenizer, rendered): (Option<&Tokenizer>, Option<&str>),
    g: Generation,
    out: &mut Out<'_>,
) -> Result<()> {
    columnar_unused(o, &g, out)?;
    if let Some(path) = &o.logits_out {
        let bytes: Vec<u8> = g
            .first_logits
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        std::fs::write(path, bytes).map_err(io(path))?;
    }
    if o.json {
        let v = json(o, (tokenizer, rendered), &g)?;
        return writeln!(out.stdout, "{v}").map_err(write_err);
    }
    if tokenizer.is_some() {
        // text in, text out: the streamed text, then one short block
        let block = perf_block(&g, from_start(o, &g), o.verbose);
        return writeln!(out.stderr, "{block}").map_err(write_err);
    }
    let text = text_report(&g, from_start(o, &g), o.verbose);
    writeln!(out.stdout, "{text}").map_err(write_err)
}

/// An input stage: the prompt through its layers, the hidden states written.
pub(crate) fn input_stage(o: &RunOptions, mut stage: Stage, out: &mut Out<'_>) -> Result<()> {
    let made = super::prompt::make(o, &stage)?;
    let Some(path) = &o.hidden_out else {
        return Err(DecodeError::Usage(
            "--roles input writes hidden states: give --hidden-out FILE".into(),
        ));
    };
    let x = stage.embed(&made.ids)?;
    let x = stage.forward(&x)?;
    let v: Vec<f32> = x.flatten_all()?.to_vec1()?;
    let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
    std::fs::write(path, bytes).map_err(io(path))?;
    let b = stage.bytes();
    if o.json {
        let j = serde_json::json!({
            "hidden_out": path, "tokens_in": made.ids.len(), "bytes": b,
            "resolutions": stage.resolutions()?,
        });
        return writeln!(out.stdout, "{j}").map_err(write_err);
    }
    writeln!(
        out.stdout,
        "wrote {} x {} hidden states to {}; bytes: {}",
        made.ids.len(),
        stage.config().hidden,
        path.display(),
        bytes_line(b)
    )
    .map_err(write_err)
}

/// An output stage: hidden states through its layers, the next token.
pub(crate) fn output_stage(o: &RunOptions, mut stage: Stage, out: &mut Out<'_>) -> Result<()> {
    let super::Prompt::HiddenIn(path) = &o.prompt else {
        return Err(DecodeError::Usage(
            "--roles output reads hidden states: give --hidden-in FILE".into(),
        ));
    };
    let h = stage.config().hidden;
    let limit = (stage.config().position_limit() as u64).saturating_mul(4 * h as u64);
    let raw = gkq_files::read_bounded(path, limit, "hidden states", gkq_files::Follow::Yes)
        .map_err(|e| DecodeError::Usage(e.to_string()))?;
    if raw.len() % (4 * h) != 0 || raw.is_empty() {
        return Err(DecodeError::Usage(format!(
            "{}: {} bytes is not whole rows of {h} f32 values",
            path.display(),
            raw.len()
        )));
    }
    let v: Vec<f32> = raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let x = candle_core::Tensor::from_vec(v, (raw.len() / (4 * h), h), &candle_core::Device::Cpu)?;
    let x = stage.forward(&x)?;
    let logits = stage.logits(&x)?;
    let next = logits.argmax(0)?.to_scalar::<u32>()?;
    let b = stage.bytes();
    if o.json {
        let j = serde_json::json!({
            "tokens": [next], "bytes": b, "resolutions": stage.resolutions()?,
        });
        return writeln!(out.stdout, "{j}").map_err(write_err);
    }
    writeln!(out.stdout, "next token {next}; bytes: {}", bytes_line(b)).map_err(write_err)
}
