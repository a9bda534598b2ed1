//! llama-perplexity's log-probability file (`--kl-divergence-base`), as
//! llama.cpp writes and reads it. It is llama.cpp's, not a GKQ format
//! (little-endian, as llama.cpp writes it on the machines it runs on):
//! `_logits_`, `n_ctx` (u32), `n_vocab` (i32), `n_chunk` (i32), the
//! `n_chunk × n_ctx` tokens (i32); then, per chunk, for each of its
//! `n_ctx - 1 - n_ctx / 2` scored positions, `nv = 2 × ⌈n_vocab / 2⌉ + 4`
//! u16: `scale` and `min_log_prob` (two f32), then a code per token,
//! `log p = scale × code + min_log_prob` over the top 16 nats (code 0
//! below them), then padding.

use std::io::Write;
use std::path::Path;

use crate::error::{DecodeError, Result};

pub(crate) const MAGIC: &[u8; 8] = b"_logits_";
/// Magic, n_ctx, n_vocab, n_chunk.
pub(crate) const HEADER: u64 = 20;

/// u16 a scored position takes for a vocabulary of `n_vocab`.
pub(crate) fn row_u16(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

fn io_err(e: std::io::Error) -> DecodeError {
    DecodeError::Usage(format!("--kl-divergence-base: {e}"))
}

/// Writes the header of a base file for the whole chunks `tokens`.
pub(crate) fn write_header(
    w: &mut dyn Write,
    n_ctx: usize,
    n_vocab: usize,
    tokens: &[u32],
) -> Result<()> {
    let int = |n: usize| {
        i32::try_from(n).map_err(|_| {
            DecodeError::Usage(format!("{n} is too large for a --kl-divergence-base file"))
        })
    };
    let mut h = MAGIC.to_vec();
    h.extend_from_slice(&int(n_ctx)?.to_le_bytes());
    h.extend_from_slice(&int(n_vocab)?.to_le_bytes());
    h.extend_from_slice(&int(tokens.len() / n_ctx)?.to_le_bytes());
    for &t in tokens {
        h.extend_from_slice(&t.to_le_bytes());
    }
    w.write_all(&h).map_err(io_err)
}

/// Writes one scored position's log-probabilities, as llama-perplexity
/// quantizes them.
pub(crate) fn write_row(w: &mut dyn Write, logits: &[f32], buf: &mut Vec<u8>) -> Result<()> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let min = logits
        .iter()
        .fold(f32::INFINITY, |a, &b| a.min(b))
        .max(max - 16.0);
    let sum: f64 = logits.iter().map(|&x| f64::from((x - max).exp())).sum();
    let lse = sum.ln() as f32;
    let scale = (max - min) / 65535.0;
    buf.clear();
    buf.extend_from_slice(&scale.to_le_bytes());
    buf.extend_from_slice(&(min - max - lse).to_le_bytes());
    for &x in logits {
        let code = if scale != 0.0 && x > min {
            ((x - min) / scale).round_ties_even() as u16
        } else {
            0
        };
        buf.extend_from_slice(&code.to_le_bytes());
    }
    buf.resize(row_u16(logits.len()) * 2, 0);
    w.write_all(buf).map_err(io_err)
}

/// The base file's shape, checked against its length before anything is
/// read, so that a file that claims more than it holds allocates nothing.
pub(crate) struct Shape {
    pub(crate) n_ctx: usize,
    pub(crate) n_chunk: usize,
}

pub(crate) fn shape(
    path: &Path,
    head: &[u8; HEADER as usize],
    len: u64,
    vocab: usize,
) -> Result<Shape> {
    let bad = |why: String| DecodeError::Usage(format!("{}: {why}", path.display()));
    if &head[..8] != MAGIC {
        return Err(bad(
            "not a llama-perplexity --kl-divergence-base file (no _logits_ magic)".into(),
        ));
    }
    let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let (n_ctx, n_vocab, n_chunk) = (u64::from(word(8)), word(12), u64::from(word(16)));
    if usize::try_from(n_vocab).ok() != Some(vocab) {
        return Err(bad(format!(
            "written for a vocabulary of {} tokens, and this model has {vocab}",
            n_vocab as i32
        )));
    }
    let scored = n_ctx.saturating_sub(1 + n_ctx / 2);
    let want = (|| {
        let tokens = n_chunk.checked_mul(n_ctx)?.checked_mul(4)?;
        let rows = n_chunk
            .checked_mul(scored)?
            .checked_mul(row_u16(vocab) as u64 * 2)?;
        HEADER.checked_add(tokens)?.checked_add(rows)
    })();
    if n_ctx < 2
        || n_chunk == 0
        || n_ctx > i32::MAX as u64
        || n_chunk > i32::MAX as u64
        || want != Some(len)
    {
        return Err(bad(format!(
            "{len} bytes, and a file of {n_chunk} chunks of {n_ctx} tokens over {vocab} tokens has {}: truncated or not a base file",
            want.map_or("more than 2^64".into(), |w| w.to_string())
        )));
    }
    Ok(Shape {
        n_ctx: n_ctx as usize,
        n_chunk: n_chunk as usize,
    })
}
