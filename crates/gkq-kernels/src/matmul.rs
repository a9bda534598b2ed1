//! `x @ w^T` with `w` kept in its blocks: the rows of one or more matrices
//! split among rayon's threads, tiles of rows each meeting the quantized
//! activations of eight tokens at a time while they are in cache.
//! Here rather than in the reader so that the loop is compiled with the
//! kernels (this crate is optimised in test builds).

use rayon::prelude::*;

use crate::{Q8Acts, Q8KBlock, RowDot, Steps, Token, quantize_activations, quantize_activations_k};

/// Rows that meet each eight tokens while they are in cache.
const ROW_TILE: usize = 16;

/// A matrix of [`matmul`]: its blocks, their dot product, its rows.
#[derive(Clone, Copy, Debug)]
pub struct MatPart<'a> {
    /// The matrix's rows of blocks, one after the other, or packed
    /// ([`RowDot::pack`]) when its kernel packs them.
    pub w: &'a [u8],
    /// The dot product of its block type.
    pub dot: RowDot,
    /// Its rows.
    pub rows: usize,
}

/// Some tokens' activations quantized once, in each form the parts'
/// kernels take.
struct Acts {
    q8: Q8Acts,
    q8k: Vec<Q8KBlock>,
    /// Blocks of each form per token.
    per_token: (usize, usize),
}

impl Acts {
    fn new(x: &[f32], tokens: usize, parts: &[MatPart<'_>]) -> Acts {
        let (mut q8, mut q8k) = (Q8Acts::default(), Vec::new());
        if parts.iter().any(|p| !p.dot.takes_q8k()) {
            quantize_activations(x, &mut q8);
        }
        if parts.iter().any(|p| p.dot.takes_q8k()) {
            quantize_activations_k(x, &mut q8k);
        }
        let tokens = tokens.max(1);
        let per_token = (q8.blocks() / tokens, q8k.len() / tokens);
        Acts { q8, q8k, per_token }
    }

    fn token(&self, t: usize) -> Token<'_> {
        let (n8, n8k) = self.per_token;
        Token {
            q8: self.q8.token(t, n8),
            q8k: &self.q8k[t * n8k..(t + 1) * n8k],
        }
    }
}

/// `[tokens, rows]` for each part: each row dotted with each token of the
/// `[tokens, cols]` activations `x` (quantized once, as the parts' kernels
/// take them), the rows of all the parts split among the threads in one
/// pass. A row whose length disagrees gives NaN.
pub fn matmul(parts: &[MatPart<'_>], x: &[f32], tokens: usize) -> Vec<Vec<f32>> {
    let quantized = Acts::new(x, tokens, parts);
    let acts: Vec<Token<'_>> = (0..tokens).map(|t| quantized.token(t)).collect();
    let total: usize = parts.iter().map(|p| p.rows).sum();
    // a few chunks per thread, whole tiles (and so whole packed groups)
    let chunk = total.div_ceil(rayon::current_num_threads() * 4);
    let chunk = chunk.div_ceil(ROW_TILE).max(1) * ROW_TILE;
    let mut by_chunk: Vec<Vec<f32>> = parts.iter().map(|p| vec![0f32; p.rows * tokens]).collect();
    let mut tasks = Vec::new();
    for (p, out) in parts.iter().zip(&mut by_chunk) {
        let row_bytes = p.w.len() / p.dot.stored_rows(p.rows).max(1);
        let pieces = out
            .chunks_mut(chunk * tokens)
            .zip(p.w.chunks(chunk * row_bytes));
        tasks.extend(pieces.map(|(o, w)| (o, w, p.dot, row_bytes)));
    }
    tasks.into_par_iter().for_each(|(out, w, dot, row_bytes)| {
        // the chunk's products token after token: one token's rows of
        // every chunk are then one copy into place (see `gather`)
        let rows = out.len() / tokens.max(1);
        let steps = Steps {
            row: 1,
            token: rows,
        };
        for (r, w) in w.chunks(ROW_TILE * row_bytes).enumerate() {
            let tile = (rows - r * ROW_TILE).min(ROW_TILE);
            dot_tile(dot, w, tile, &acts, &mut out[r * ROW_TILE..], steps);
        }
    });
    if tokens == 1 {
        return by_chunk;
    }
    by_chunk
        .iter()
        .zip(parts)
        .map(|(c, p)| gather(c, p.rows, tokens, chunk))
        .collect()
}

/// `[tokens, rows]` from chunks of `chunk` rows each `[tokens, rows of
/// the chunk]`, one after the other: tiles of tokens among the threads,
/// each token's rows copied from each chunk (a transpose of `[rows,
/// tokens]` read a cache line of every row per tile, 7 % of a long
/// prefill).
fn gather(by_chunk: &[f32], rows: usize, tokens: usize, chunk: usize) -> Vec<f32> {
    const TOKENS: usize = 16;
    let mut out = vec![0f32; rows * tokens];
    if rows == 0 {
        return out;
    }
    out.par_chunks_mut(TOKENS * rows)
        .enumerate()
        .for_each(|(b, o)| {
            for (k, row) in o.chunks_mut(rows).enumerate() {
                let t = b * TOKENS + k;
                for (c, dst) in row.chunks_mut(chunk).enumerate() {
                    let n = dst.len();
                    let src = &by_chunk[c * chunk * tokens..][..n * tokens];
                    dst.copy_from_slice(&src[t * n..(t + 1) * n]);
                }
            }
        });
    out
}

/// `out[r + t · steps.token] = row r · acts[t]` for the `rows` rows of
/// `w` (NaN where a length disagrees).
fn dot_tile(dot: RowDot, w: &[u8], rows: usize, acts: &[Token<'_>], out: &mut [f32], steps: Steps) {
    if dot.rows(w, rows, acts, out, steps).is_none() {
        out.iter_mut().for_each(|o| *o = f32::NAN);
    }
}
