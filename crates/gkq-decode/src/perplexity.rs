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
fn nll(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let sum: f64 = logits.iter().map(|&x| f64::from(x - max).exp()).sum();
    f64::from(max) + sum.ln() - f64::from(logits[target])
}

/// The perplexity of `tokens` through `stage` (one stage serving the
/// whole model), `ubatch` tokens a forward pass (see the module docs).
pub fn perplexity(
    stage: &mut Stage,
    tokens: &[u32],
    n_ctx: usize,
    bos: Option<u32>,
    ubatch: usize,
) -> Result<Perplexity> {
    if n_ctx < 2 || tokens.len() < 2 * n_ctx {
        return Err(DecodeError::Usage(format!(
            "perplexity with a context of {n_ctx} (-c) needs at least {} tokens, and the text has {}: give a longer text or a smaller -c",
            2 * n_ctx.max(2),
            tokens.len()
        )));
    }
    let first = n_ctx / 2;
    let (mut sum, mut sum2, mut scored) = (0.0f64, 0.0f64, 0usize);
    let chunks = tokens.len() / n_ctx;
    for c in 0..chunks {
        let mut ids = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
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
                    let target = tokens[c * n_ctx + lo + k + 1] as usize;
                    let v = nll(row, target);
                    sum += v;
                    sum2 += v * v;
                    scored += 1;
                }
            }
            pos += piece.len();
        }
    }
    let mean = sum / scored as f64;
    let var = sum2 / scored as f64 - mean * mean;
    let ppl = mean.exp();
    Ok(Perplexity {
        perplexity: ppl,
        stderr: if var > 0.0 && scored > 1 {
            (var / (scored - 1) as f64).sqrt() * ppl
        } else {
            0.0
        },
        chunks,
        n_ctx,
        scored,
        tokens: tokens.len(),
    })
}
