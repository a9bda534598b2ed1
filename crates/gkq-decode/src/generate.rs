//! Decoding through a chain of stages: the prompt in one forward pass per
//! layer (batched prefill), then one token at a time, picked greedily or
//! sampled (temperature, top-k, top-p, a seed), until an end-of-generation
//! token or the count asked for; each token handed to a callback as it
//! comes, so that a caller can stream its text.

use std::collections::BTreeSet;
use std::time::Instant;

use candle_core::Tensor;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{DecodeError, Result};
use crate::model::argmax;
use crate::{RoleBytes, RoleResolution, Stage};

/// How the next token is picked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Temperature; 0 is greedy (the argmax).
    pub temperature: f64,
    /// Only the `k` most likely tokens are drawn from.
    pub top_k: Option<usize>,
    /// Only the most likely tokens whose probabilities add up to `p`.
    pub top_p: Option<f64>,
    /// The seed of the draw.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
        }
    }
}

/// What a decode does.
#[derive(Clone, Debug)]
pub struct GenOptions {
    /// Tokens to generate at most; `None`: until an end token or the
    /// model's positions run out.
    pub max_new: Option<usize>,
    /// How tokens are picked.
    pub sampling: Sampling,
    /// The ids that end the generation (the model's end-of-generation
    /// tokens; empty to always generate `max_new`).
    pub stop: BTreeSet<u32>,
    /// Prompt tokens per forward pass of the prefill (llama.cpp's `-ub`):
    /// a long prompt goes through the layers this many at a time, so its
    /// activations are bounded by it, not by the prompt.
    pub ubatch: usize,
    /// The positions a decode may use (llama.cpp's `-c`), within the
    /// model's; `None`: the model's.
    pub context: Option<usize>,
}

/// Prompt tokens per forward pass of the prefill by default (llama.cpp's).
pub const DEFAULT_UBATCH: usize = 512;

impl Default for GenOptions {
    fn default() -> GenOptions {
        GenOptions {
            max_new: None,
            sampling: Sampling::default(),
            stop: BTreeSet::new(),
            ubatch: DEFAULT_UBATCH,
            context: None,
        }
    }
}

/// The result of a decode.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Generation {
    /// The prompt's ids.
    pub prompt_ids: Vec<u32>,
    /// The generated token ids (the end token included when it stopped there).
    pub tokens: Vec<u32>,
    /// Why it stopped: `eos` (an end-of-generation token), `length` (the
    /// tokens asked for), `context` (no position left) or `stop_text` (the
    /// caller's stop text, `-r`).
    pub stop: &'static str,
    /// Hex SHA-256 of each step's logits (f32, little-endian): equal digests
    /// mean bit-identical logits.
    pub logits_sha256: Vec<String>,
    /// From the first stage's `Stage::open` (which opens the reader) to the
    /// first generated token: the load, or as much of it as the first
    /// forward pass had to wait for, and the prefill.
    pub time_to_first_token_ms: f64,
    /// From the first stage's open until every stage had all its blocks
    /// (downloaded and verified, or read from the cache).
    pub load_ms: f64,
    /// From the start of the prefill to the first generated token.
    pub prefill_ms: f64,
    /// The part of `prefill_ms` the forward pass waited for weights still
    /// arriving (the load runs beside the compute).
    pub prefill_wait_ms: f64,
    /// Prompt tokens per second of the prefill's compute (one forward pass
    /// of all of them; `prefill_ms` less `prefill_wait_ms`, as a runtime
    /// that loads first and then prefills counts it).
    pub prefill_tokens_per_second: f64,
    /// When the first stage was opened (what the times above count from).
    #[serde(skip)]
    pub opened: Instant,
    /// From each stage's open until all its blocks had arrived, in chain order.
    pub stage_load_ms: Vec<f64>,
    /// The knot id of the model (what `--knot-id` pins).
    pub knot_id: String,
    /// Generated tokens after the first, per second.
    pub tokens_per_second: f64,
    /// Bytes fetched, per role, summed over the stages.
    pub bytes: RoleBytes,
    /// Bytes fetched by each stage, in chain order (one entry for one stage).
    pub stage_bytes: Vec<RoleBytes>,
    /// The resolution of each role.
    pub resolutions: Vec<RoleResolution>,
    /// The logits of the first step (after the prompt), for `--logits-out`.
    #[serde(skip)]
    pub first_logits: Vec<f32>,
    /// What `--warm` did on the input stage (the warm object, FORMAT.md 7d).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm: Option<gkq_reader::WarmReport>,
}

fn digest(logits: &[f32]) -> String {
    let mut h = Sha256::new();
    for x in logits {
        h.update(x.to_le_bytes());
    }
    gkq_format::hex(&h.finalize())
}

/// xorshift64*: the seeded draw.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Sampling {
    /// The next token of `logits` (greedy at temperature 0).
    fn pick(&self, logits: &[f32], rng: &mut Rng) -> u32 {
        let greedy = || {
            logits
                .iter()
                .enumerate()
                .fold((0usize, f32::NEG_INFINITY), |b, (i, &x)| {
                    if x > b.1 { (i, x) } else { b }
                })
                .0 as u32
        };
        if self.temperature <= 0.0 {
            return greedy();
        }
        let mut idx: Vec<usize> = (0..logits.len())
            .filter(|&i| logits[i].is_finite())
            .collect();
        idx.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        if let Some(k) = self.top_k.filter(|&k| k > 0) {
            idx.truncate(k);
        }
        let Some(&top) = idx.first() else {
            return greedy();
        };
        let max = f64::from(logits[top]);
        let mut w: Vec<f64> = idx
            .iter()
            .map(|&i| ((f64::from(logits[i]) - max) / self.temperature).exp())
            .collect();
        let total: f64 = w.iter().sum();
        if let Some(p) = self.top_p.filter(|&p| p < 1.0) {
            let (mut acc, mut keep) = (0.0, 0);
            for x in &w {
                acc += x / total;
                keep += 1;
                if acc >= p {
                    break;
                }
            }
            w.truncate(keep.max(1));
        }
        let total: f64 = w.iter().sum();
        let mut r = rng.unit() * total;
        for (i, x) in w.iter().enumerate() {
            r -= x;
            if r <= 0.0 {
                return idx[i] as u32;
            }
        }
        idx[w.len() - 1] as u32
    }
}

/// The forward of `ids` through the chain, `ubatch` tokens at a time
/// (their rows fetched at once first): embedding in the first stage,
/// layers in every stage, the logits of the last token in the last.
fn step(stages: &mut [Stage], ids: &[u32], ubatch: usize) -> Result<Tensor> {
    if ids.len() > ubatch {
        stages[0].prefetch(ids)?;
    }
    let mut x = None;
    for chunk in ids.chunks(ubatch.max(1)) {
        let mut h = stages[0].embed(chunk)?;
        for s in stages.iter_mut() {
            h = s.forward(&h)?;
        }
        x = Some(h);
    }
    let x = x.ok_or_else(|| DecodeError::Stages("no tokens to run".into()))?;
    let last = stages.len() - 1;
    stages[last].logits(&x)
}

/// Checks that `stages` form one model: input first, output last, the
/// layers contiguous from 0 to the end.
fn check_chain(stages: &[Stage]) -> Result<()> {
    let (Some(first), Some(last)) = (stages.first(), stages.last()) else {
        return Err(DecodeError::Stages("no stage".into()));
    };
    if !first.serves_input() || !last.serves_output() {
        return Err(DecodeError::Stages(
            "the first stage must serve the input role and the last the output role".into(),
        ));
    }
    let mut next = 0;
    for s in stages {
        if s.layers.start != next {
            return Err(DecodeError::Stages(format!(
                "layers must be contiguous: a stage starts at {} after {next}",
                s.layers.start
            )));
        }
        next = s.layers.end;
    }
    if next != first.cfg.layers {
        return Err(DecodeError::Stages(format!(
            "the stages run layers 0..{next} of {}",
            first.cfg.layers
        )));
    }
    Ok(())
}

/// Greedy decoding of `max_new` tokens after `prompt` through `stages`
/// (one stage with [`crate::StageRoles::All`], or an input stage, any
/// middle stages, and an output stage), without stopping early.
pub fn generate(stages: &mut [Stage], prompt: &[u32], max_new: usize) -> Result<Generation> {
    let opts = GenOptions {
        max_new: Some(max_new),
        ..GenOptions::default()
    };
    generate_with(stages, prompt, &opts, &mut |_| Ok(false))
}

/// The positions a decode of `prompt` may add after what the stages hold
/// (earlier turns of a conversation): `max_new`, checked against the
/// context (the model's positions, or fewer with `context`), or what is
/// left of them.
fn budget(
    stages: &[Stage],
    prompt: &[u32],
    max_new: Option<usize>,
    context: Option<usize>,
) -> Result<usize> {
    let model = stages[0].cfg.position_limit();
    let (limit, what) = match context.filter(|&c| c < model) {
        Some(c) => (
            c,
            format!("the context's {c} positions (-c; the model has {model})"),
        ),
        None => (
            model,
            format!("the model's {model} positions (max_position_embeddings)"),
        ),
    };
    let used = stages[0].position().saturating_add(prompt.len());
    let prompt_is = match stages[0].position() {
        0 => format!("the prompt ({used} tokens)"),
        _ => format!("the conversation ({used} tokens)"),
    };
    match max_new {
        Some(n) if used.saturating_add(n) > limit => Err(DecodeError::Usage(format!(
            "--max-new-tokens {n}: {prompt_is} and the new tokens must fit {what}"
        ))),
        Some(n) => Ok(n),
        None if used >= limit => Err(DecodeError::Usage(format!("{prompt_is} fills {what}"))),
        None => Ok(limit - used),
    }
}

/// Decoding after `prompt` as `opts` says, each token given to `on_token`
/// as soon as it is picked (an end token too, which ends the decode);
/// `on_token` answering `true` ends it there too (stop `stop_text`: the
/// caller saw a text it stops at, as llama.cpp's reverse prompt).
pub fn generate_with(
    stages: &mut [Stage],
    prompt: &[u32],
    opts: &GenOptions,
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
) -> Result<Generation> {
    check_chain(stages)?;
    if prompt.is_empty() {
        return Err(DecodeError::Stages("the prompt has no tokens".into()));
    }
    let max_new = budget(stages, prompt, opts.max_new, opts.context)?;
    // the positions this decode reaches (at most 1,024 past the prompt when
    // unbounded; the cache grows beyond)
    let reach = (stages[0].position() + prompt.len()).saturating_add(max_new.min(1 << 10));
    for s in stages.iter_mut() {
        s.reserve(reach);
    }
    let opened = stages
        .iter()
        .map(Stage::opened)
        .min()
        .unwrap_or_else(Instant::now);
    // the stages' waits so far (a conversation's earlier turns): not this prefill's
    let waited_before = waited_ms(stages);
    let start = Instant::now();
    let mut rng = Rng(opts.sampling.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // grown as tokens come: max_position_embeddings is the publisher's word
    let mut tokens = Vec::with_capacity(max_new.min(1 << 12));
    let mut digests = Vec::with_capacity(max_new.min(1 << 12));
    // unbounded, a decode that runs out of positions stops at the context
    let end = if opts.max_new.is_some() {
        "length"
    } else {
        "context"
    };
    let (mut ttft, mut prefill, mut first_logits, mut stop) = (0.0, 0.0, Vec::new(), end);
    let mut waited = 0.0;
    let mut ids = prompt.to_vec();
    for n in 0..max_new {
        let out = step(stages, &ids, opts.ubatch)?;
        let greedy = (opts.sampling.temperature <= 0.0)
            .then(|| argmax(&out))
            .transpose()?;
        let logits: Vec<f32> = out.to_vec1()?;
        digests.push(digest(&logits));
        let next = match greedy {
            Some(g) => g,
            None => opts.sampling.pick(&logits, &mut rng),
        };
        if n == 0 {
            prefill = start.elapsed().as_secs_f64() * 1e3;
            ttft = opened.elapsed().as_secs_f64() * 1e3;
            waited = waited_ms(stages) - waited_before;
            first_logits = logits;
        }
        tokens.push(next);
        if on_token(next)? {
            stop = "stop_text";
            break;
        }
        if opts.stop.contains(&next) {
            stop = "eos";
            break;
        }
        ids = vec![next];
    }
    let rest = start.elapsed().as_secs_f64() * 1e3 - prefill;
    finish(
        stages,
        (prompt, tokens, stop),
        (digests, first_logits),
        (opened, ttft, (prefill, waited), rest),
    )
}

/// How long the stages have waited for weights, in ms.
fn waited_ms(stages: &[Stage]) -> f64 {
    stages.iter().map(|s| s.waited().as_secs_f64() * 1e3).sum()
}

/// The report of a decode, once every stage has all its blocks.
fn finish(
    stages: &mut [Stage],
    (prompt, tokens, stop): (&[u32], Vec<u32>, &'static str),
    (digests, first_logits): (Vec<String>, Vec<f32>),
    (opened, ttft, (prefill, waited), rest): (Instant, f64, (f64, f64), f64),
) -> Result<Generation> {
    let mut load_ms = 0.0f64;
    let mut stage_load_ms = Vec::new();
    for s in stages.iter_mut() {
        let done = s.wait_loaded()?;
        load_ms = load_ms.max(done.duration_since(opened).as_secs_f64() * 1e3);
        stage_load_ms.push(done.duration_since(s.opened()).as_secs_f64() * 1e3);
    }
    let mut bytes = RoleBytes::default();
    let mut resolutions = Vec::new();
    for s in stages.iter() {
        bytes = bytes.plus(&s.bytes());
        resolutions.extend(s.resolutions()?);
    }
    let generated = tokens.len();
    Ok(Generation {
        prompt_ids: prompt.to_vec(),
        tokens,
        stop,
        logits_sha256: digests,
        time_to_first_token_ms: ttft,
        load_ms,
        prefill_ms: prefill,
        prefill_wait_ms: waited,
        prefill_tokens_per_second: if prefill > waited {
            prompt.len() as f64 / ((prefill - waited) / 1e3)
        } else {
            0.0
        },
        opened,
        stage_load_ms,
        knot_id: stages[0].reader.knot_id(),
        tokens_per_second: if generated > 1 && rest > 0.0 {
            (generated - 1) as f64 / (rest / 1e3)
        } else {
            0.0
        },
        bytes,
        stage_bytes: stages.iter().map(Stage::bytes).collect(),
        resolutions,
        first_logits,
        warm: stages[0]
            .reader
            .embedding()
            .ok()
            .and_then(|e| e.warm_report()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_is_greedy_at_zero_and_seeded_otherwise() {
        let logits = [0.0f32, 3.0, 2.9, -1.0];
        let mut rng = Rng(7);
        assert_eq!(Sampling::default().pick(&logits, &mut rng), 1);
        let hot = Sampling {
            temperature: 1.0,
            seed: 1,
            ..Sampling::default()
        };
        let draw = |s: Sampling| {
            let mut r = Rng(s.seed | 1);
            (0..200)
                .map(|_| s.pick(&logits, &mut r))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(hot), draw(hot), "the same seed, the same draws");
        assert!(draw(hot).contains(&2), "a close second is drawn at times");
        let top1 = Sampling {
            top_k: Some(1),
            ..hot
        };
        assert!(draw(top1).iter().all(|&t| t == 1));
        let nucleus = Sampling {
            top_p: Some(0.5),
            ..hot
        };
        assert!(draw(nucleus).iter().all(|&t| t == 1 || t == 2));
    }
}
