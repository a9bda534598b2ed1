//! Perplexity as llama.cpp's `llama-perplexity` computes it: the text's
//! tokens (BOS added as the model adds it) cut into chunks of `n_ctx`,
//! each run from an empty KV cache with its first token replaced by BOS
//! when the model adds one; in each chunk the second half is scored, the
//! negative log-likelihood of each next token from the logits of positions
//! `n_ctx / 2 .. n_ctx - 1`. PPL is `exp` of the mean, with llama.cpp's
//! standard error.

use serde::Serialize;

use crate::error::{DecodeError, Result};
use crate::stage::Stage;

/// What a perplexity run measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Perplexity {
    /// `exp` of the mean negative log-likelihood.
    pub perplexity: f64,
    /// Its standard error, as llama-perplexity gives it.
    pub stderr: f64,
    /// Chunks scored.
    pub chunks: usize,
    /// Tokens per chunk.
    pub n_ctx: usize,
    /// Next tokens scored.
    pub scored: usize,
    /// The text's tokens.
    pub tokens: usize,
}

/// `-log p(target)` from one row of logits, in f64.
pub(crate) fn nll(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let sum: f64 = logits.iter().map(|&x| f64::from(x - max).exp()).sum();
    f64::from(max) + sum.ln() - f64::from(logits[target])
}

/// Runs the chunks of `tokens` through `stage` as the module docs say,
/// giving `each` every scored position's logits and the next token; the
/// chunks run.
pub(crate) fn each_scored(
    stage: &mut Stage,
    tokens: &[u32],
    n_ctx: usize,
    (bos, ubatch): (Option<u32>, usize),
    each: &mut dyn FnMut(&[f32], u32) -> Result<()>,
) -> Result<usize> {
    if n_ctx < 2 || tokens.len() < n_ctx {
        return Err(DecodeError::Usage(format!(
            "chunks of {n_ctx} tokens from {} tokens",
            tokens.len()
        )));
    }
    let first = n_ctx / 2;
    let chunks = tokens.len() / n_ctx;
    for chunk in tokens.chunks_exact(n_ctx).take(chunks) {
        let mut ids = chunk.to_vec();
        if let Some(b) = bos {
            ids[0] = b;
        }
        stage.reset();
        stage.reserve(n_ctx);
        let mut pos = 0;
        for piece in ids.chunks(ubatch.max(1)) {
            let x = stage.embed(piece)?;
            let x = stage.forward(&x)?;
            // the rows of this piece at positions first .. n_ctx - 1
            let lo = first.max(pos).min(pos + piece.len());
            let hi = (n_ctx - 1).min(pos + piece.len()).max(lo);
            if hi > lo {
                let logits: Vec<Vec<f32>> = stage.logits_of(&x, lo - pos..hi - pos)?.to_vec2()?;
                for (k, row) in logits.iter().enumerate() {
                    each(row, chunk[lo + k + 1])?;
                }
            }
            pos += piece.len();
        }
    }
    Ok(chunks)
}

/// `(mean, its standard error)` of values given by their sum and sum of
/// squares, as llama-perplexity computes them.
pub(crate) fn mean_and_stderr(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count == 0 {
        return (0.0, 0.0);
    }
    let mean = sum / count as f64;
    let var = sum2 / count as f64 - mean * mean;
    let err = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt()
    } else {
        0.0
    };
    (mean, err)
}

/// The perplexity of `tokens` through `stage` (one stage serving the
/// whole model), `ubatch` tokens a forward pass (see the module docs).
/// With `base`, the run also writes llama-perplexity's
/// `--kl-divergence-base` file there (see [`crate::kl_divergence`]).
pub fn perplexity(
    stage: &mut Stage,
    tokens: &[u32],
    n_ctx: usize,
    (bos, ubatch): (Option<u32>, usize),
    mut base: Option<&mut dyn std::io::Write>,
) -> Result<Perplexity> {
    if n_ctx < 2 || tokens.len() < 2 * n_ctx {
        return Err(DecodeError::Usage(format!(
            "perplexity with a context of {n_ctx} (-c) needs at least {} tokens, and the text has {}: give a longer text or a smaller -c",
            2 * n_ctx.max(2),
            tokens.len()
        )));
    }
    if let Some(w) = base.as_deref_mut() {
        let whole = tokens.len() / n_ctx * n_ctx;
        crate::logprobs::write_header(w, n_ctx, stage.config().vocab, &tokens[..whole])?;
    }
    let (mut sum, mut sum2, mut scored) = (0.0f64, 0.0f64, 0usize);
    let mut row_buf = Vec::new();
    let chunks = each_scored(stage, tokens, n_ctx, (bos, ubatch), &mut |row, next| {
        let v = nll(row, next as usize);
        sum += v;
        sum2 += v * v;
        scored += 1;
        if let Some(w) = base.as_deref_mut() {
            crate::logprobs::write_row(w, row, &mut row_buf)?;
        }
        Ok(())
    })?;
    let (mean, err) = mean_and_stderr(sum, sum2, scored);
    let ppl = mean.exp();
    Ok(Perplexity {
        perplexity: ppl,
        stderr: err * ppl,
        chunks,
        n_ctx,
        scored,
        tokens: tokens.len(),
    })
}
