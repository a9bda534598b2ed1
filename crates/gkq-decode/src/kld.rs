//! KL divergence as llama-perplexity computes it (`--kl-divergence-base
//! FILE`, `--kl-divergence`), in its file format, so that either tool reads
//! the other's: a perplexity run of the base model writes, for each scored
//! position, the log-probabilities of the whole vocabulary; a run of
//! another model or package over the file's tokens then gives its
//! perplexity beside the base's, the KL divergence of the base's
//! distribution from its own, and how often the two rank the same token
//! first.
//!
//! The file's layout is in `logprobs.rs`.

use std::io::Read;
use std::path::Path;

use serde::Serialize;

use crate::error::{DecodeError, Result};
use crate::logprobs::{HEADER, row_u16, shape};
use crate::perplexity::{each_scored, mean_and_stderr};
use crate::stage::Stage;

/// What a `--kl-divergence` run measured (llama-perplexity's statistics;
/// probabilities as fractions).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KlDivergence {
    /// The perplexity of this model over the base file's tokens.
    pub perplexity: f64,
    /// The base's, from the file.
    pub perplexity_base: f64,
    /// Mean `ln(PPL / PPL(base))`.
    pub ln_ratio: f64,
    /// Mean KL divergence of the base's distribution from this one's (nats).
    pub kld: f64,
    /// Its standard error.
    pub kld_stderr: f64,
    /// Its median over the scored positions.
    pub kld_median: f64,
    /// Its 99th percentile.
    pub kld_p99: f64,
    /// Its largest value.
    pub kld_max: f64,
    /// Root mean square of the change in the next token's probability.
    pub rms_dp: f64,
    /// Positions where both rank the same token first.
    pub same_top: f64,
    /// Chunks run.
    pub chunks: usize,
    /// Tokens per chunk.
    pub n_ctx: usize,
    /// Positions scored.
    pub scored: usize,
}

/// llama-perplexity's running sums.
#[derive(Default)]
struct Sums {
    nll: f64,
    nll2: f64,
    base: f64,
    base2: f64,
    kld: f64,
    kld2: f64,
    dp2: f64,
    same: usize,
    values: Vec<f32>,
}

impl Sums {
    /// One position: this model's logits, the base's row, the next token.
    fn add(&mut self, logits: &[f32], row: &[u8], next: usize) {
        let f = |i: usize| f32::from_le_bytes([row[i], row[i + 1], row[i + 2], row[i + 3]]);
        let (scale, min_log_prob) = (f(0), f(4));
        let code = |i: usize| f32::from(u16::from_le_bytes([row[8 + 2 * i], row[9 + 2 * i]]));
        let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let sum: f64 = logits.iter().map(|&x| f64::from(x - max).exp()).sum();
        // log Σ exp, once: the next token's -log p and every token's log p
        let lse = f64::from(max) + sum.ln();
        let nll = lse - f64::from(logits[next]);
        let nll_base = -f64::from(scale * code(next) + min_log_prob);
        let (mut kld, mut top, mut top_base) = (0.0f64, 0usize, 0usize);
        for (i, &x) in logits.iter().enumerate() {
            let lp_base = scale * code(i) + min_log_prob;
            if x > logits[top] {
                top = i;
            }
            if lp_base > scale * code(top_base) + min_log_prob {
                top_base = i;
            }
            if lp_base > -16.0 {
                let lp_base = f64::from(lp_base);
                kld += lp_base.exp() * (lp_base - (f64::from(x) - lse));
            }
        }
        let dp = (-nll).exp() - (-nll_base).exp();
        self.nll += nll;
        self.nll2 += nll * nll;
        self.base += nll_base;
        self.base2 += nll_base * nll_base;
        self.kld += kld;
        self.kld2 += kld * kld;
        self.dp2 += dp * dp;
        self.same += usize::from(top == top_base);
        self.values.push(kld as f32);
    }

    fn result(mut self, chunks: usize, n_ctx: usize) -> KlDivergence {
        let n = self.values.len();
        let (lnq, _) = mean_and_stderr(self.nll, self.nll2, n);
        let (lnb, _) = mean_and_stderr(self.base, self.base2, n);
        let (kld, kld_stderr) = mean_and_stderr(self.kld, self.kld2, n);
        self.values.sort_by(f32::total_cmp);
        let pct = |p: f64| {
            let x = p * (n.max(1) - 1) as f64;
            let i = x as usize;
            let next = self.values.get(i + 1).or(self.values.get(i));
            let (a, b) = (self.values.get(i), next);
            a.zip(b).map_or(0.0, |(&a, &b)| {
                (1.0 - x.fract()) * f64::from(a) + x.fract() * f64::from(b)
            })
        };
        KlDivergence {
            perplexity: lnq.exp(),
            perplexity_base: lnb.exp(),
            ln_ratio: lnq - lnb,
            kld,
            kld_stderr,
            kld_median: pct(0.5),
            kld_p99: pct(0.99),
            kld_max: pct(1.0),
            rms_dp: (self.dp2 / n.max(1) as f64).sqrt(),
            same_top: self.same as f64 / n.max(1) as f64,
            chunks,
            n_ctx,
            scored: n,
        }
    }
}

/// `--kl-divergence`: the base file at `path` (written by
/// `llama-perplexity --kl-divergence-base` or by [`crate::perplexity`])
/// against `stage` over the file's own tokens.
pub fn kl_divergence(
    stage: &mut Stage,
    path: &Path,
    (bos, ubatch): (Option<u32>, usize),
) -> Result<KlDivergence> {
    let io = |e: std::io::Error| DecodeError::Io {
        path: path.to_path_buf(),
        error: e,
    };
    let mut f = std::io::BufReader::new(std::fs::File::open(path).map_err(io)?);
    let len = f.get_ref().metadata().map_err(io)?.len();
    let mut head = [0u8; HEADER as usize];
    f.read_exact(&mut head).map_err(io)?;
    let vocab = stage.config().vocab;
    let s = shape(path, &head, len, vocab)?;
    if s.n_ctx > stage.config().position_limit() {
        return Err(DecodeError::Usage(format!(
            "{}: chunks of {} tokens, more than the model's {} positions",
            path.display(),
            s.n_ctx,
            stage.config().position_limit()
        )));
    }
    let mut raw = vec![0u8; s.n_ctx * s.n_chunk * 4];
    f.read_exact(&mut raw).map_err(io)?;
    let tokens: Vec<u32> = raw
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if let Some((i, t)) = tokens
        .iter()
        .enumerate()
        .find(|(_, t)| **t as usize >= vocab)
    {
        return Err(DecodeError::Usage(format!(
            "{}: token {i} is {}, outside the vocabulary of {vocab}",
            path.display(),
            *t as i32
        )));
    }
    let mut sums = Sums::default();
    let mut row = vec![0u8; row_u16(vocab) * 2];
    let chunks = each_scored(
        stage,
        &tokens,
        s.n_ctx,
        (bos, ubatch),
        &mut |logits, next| {
            f.read_exact(&mut row).map_err(io)?;
            sums.add(logits, &row, next as usize);
            Ok(())
        },
    )?;
    Ok(sums.result(chunks, s.n_ctx))
}
