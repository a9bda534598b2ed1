//! `x @ w^T` with `w` kept in its blocks (feature `matmul`): the rows of
//! one or more matrices split among rayon's threads, each row dotted with
//! the quantized activations of a tile of tokens while it is in cache.
//! Here rather than in the reader so that the loop is compiled with the
//! kernels (this crate is optimised in test builds).

use rayon::prelude::*;

use crate::{Q8Block, RowDot};

/// Tokens that meet a row while it is in cache.
const TOKEN_TILE: usize = 32;

/// A matrix of [`matmul`]: its blocks, their dot product, its rows.
#[derive(Clone, Copy, Debug)]
pub struct MatPart<'a> {
    /// The matrix's rows of blocks, one after the other.
    pub w: &'a [u8],
    /// The dot product of its block type.
    pub dot: RowDot,
    /// Its rows.
    pub rows: usize,
}

/// `[tokens, rows]` for each part: each row dotted with each token's
/// blocks of `acts`, the rows of all the parts split among the threads in
/// one pass, tokens in tiles.
pub fn matmul(parts: &[MatPart<'_>], acts: &[Q8Block], tokens: usize) -> Vec<Vec<f32>> {
    let per_token = acts.len() / tokens.max(1);
    let total: usize = parts.iter().map(|p| p.rows).sum();
    // a few chunks per thread, a row at least
    let chunk = total.div_ceil(rayon::current_num_threads() * 4).max(1);
    let mut by_row: Vec<Vec<f32>> = parts.iter().map(|p| vec![0f32; p.rows * tokens]).collect();
    let mut tasks = Vec::new();
    for (p, out) in parts.iter().zip(&mut by_row) {
        let row_bytes = p.w.len() / p.rows.max(1);
        let pieces = out
            .chunks_mut(chunk * tokens)
            .zip(p.w.chunks(chunk * row_bytes));
        tasks.extend(pieces.map(|(o, w)| (o, w, p.dot, row_bytes)));
    }
    tasks.into_par_iter().for_each(|(out, w, dot, row_bytes)| {
        for t0 in (0..tokens).step_by(TOKEN_TILE) {
            let tile = t0..(t0 + TOKEN_TILE).min(tokens);
            for (o, row) in out.chunks_exact_mut(tokens).zip(w.chunks_exact(row_bytes)) {
                dot_tile(dot, row, acts, per_token, tile.clone(), o);
            }
        }
    });
    if tokens == 1 {
        return by_row;
    }
    by_row
        .into_iter()
        .zip(parts)
        .map(|(by_row, p)| {
            let mut out = vec![0f32; p.rows * tokens];
            for (r, o) in by_row.chunks_exact(tokens).enumerate() {
                for (t, &v) in o.iter().enumerate() {
                    out[t * p.rows + r] = v;
                }
            }
            out
        })
        .collect()
}

/// `out[t] = row · acts[t]` for the tokens `t` of `tile`, four at a time.
fn dot_tile(
    dot: RowDot,
    row: &[u8],
    acts: &[Q8Block],
    per_token: usize,
    tile: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let act = |t: usize| &acts[t * per_token..(t + 1) * per_token];
    let mut t = tile.start;
    while t + 4 <= tile.end {
        let four = dot.dot4(row, [act(t), act(t + 1), act(t + 2), act(t + 3)]);
        out[t..t + 4].copy_from_slice(&four.unwrap_or([f32::NAN; 4]));
        t += 4;
    }
    for (t, o) in (t..tile.end).zip(&mut out[t..tile.end]) {
        *o = dot.dot(row, act(t)).unwrap_or(f32::NAN);
    }
}
