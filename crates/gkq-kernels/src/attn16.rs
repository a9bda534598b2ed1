//! One query's attention products over keys and values kept as f16 (an
//! f16 KV cache), read in place as ggml's `vec_dot_f16` reads them instead
//! of widened to f32 first. The order is fixed, so the AVX2 kernels give
//! the portable ones' bits:
//!
//! - a key's score: eight lanes, lane `l` the FMAs of values `8c + l`, `c`
//!   in order, folded in halves (`l + 4`, `+ 2`, `+ 1`), then times the
//!   scale;
//! - the values' sum: `out[d] = fma(p_j, v_j[d], out[d])`, `j` in order.

use half::f16;

/// `out[j] = scale · q · k_j` for the first `out.len()` rows of `k`
/// (`q.len()` values each, a multiple of 8).
pub fn dot_f16(q: &[f32], k: &[f16], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    assert!(hd.is_multiple_of(8) && k.len() >= out.len() * hd, "whole rows of 8s");
    #[cfg(target_arch = "x86_64")]
    if crate::attn16_x86::dot_f16(q, k, scale, out) {
        return;
    }
    dot_portable(q, k, scale, out);
}

fn dot_portable(q: &[f32], k: &[f16], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    for (j, o) in out.iter_mut().enumerate() {
        let row = &k[j * hd..(j + 1) * hd];
        let mut acc = [0f32; 8];
        for (qc, kc) in q.chunks_exact(8).zip(row.chunks_exact(8)) {
            for l in 0..8 {
                acc[l] = qc[l].mul_add(kc[l].to_f32(), acc[l]);
            }
        }
        for half in [4, 2, 1] {
            for l in 0..half {
                acc[l] += acc[l + half];
            }
        }
        *o = acc[0] * scale;
    }
}

/// `out[d] = fma(p_j, v_j[d], out[d])` for the first `p.len()` rows of
/// `v` (`out.len()` values each, a multiple of 8), `j` in order.
pub fn axpy_f16(p: &[f32], v: &[f16], out: &mut [f32]) {
    let hd = out.len();
    assert!(hd.is_multiple_of(8) && v.len() >= p.len() * hd, "whole rows of 8s");
    #[cfg(target_arch = "x86_64")]
    if crate::attn16_x86::axpy_f16(p, v, out) {
        return;
    }
    axpy_portable(p, v, out);
}

fn axpy_portable(p: &[f32], v: &[f16], out: &mut [f32]) {
    let hd = out.len();
    for (j, &pj) in p.iter().enumerate() {
        for (o, x) in out.iter_mut().zip(&v[j * hd..(j + 1) * hd]) {
            *o = pj.mul_add(x.to_f32(), *o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1 << 24) as f32 * 8.0 - 4.0
            })
            .collect()
    }

    /// The portable order, written out again (a reference for both paths).
    fn dot_ref(q: &[f32], k: &[f16]) -> f32 {
        let mut acc = [0f32; 8];
        for (i, (a, b)) in q.iter().zip(k).enumerate() {
            acc[i % 8] = a.mul_add(b.to_f32(), acc[i % 8]);
        }
        let a = [0, 1, 2, 3].map(|l| acc[l] + acc[l + 4]);
        let a = [a[0] + a[2], a[1] + a[3]];
        a[0] + a[1]
    }

    #[test]
    fn f16_products_follow_their_order_bit_for_bit() {
        for hd in [8, 64, 128, 256] {
            let rows = 37;
            let q = values(hd, 1);
            let k: Vec<f16> = values(hd * rows, 2)
                .into_iter()
                .map(f16::from_f32)
                .collect();
            let (mut got, mut port) = (vec![0f32; rows], vec![0f32; rows]);
            dot_f16(&q, &k, 0.125, &mut got);
            dot_portable(&q, &k, 0.125, &mut port);
            for (j, (g, p)) in got.iter().zip(&port).enumerate() {
                let want = dot_ref(&q, &k[j * hd..(j + 1) * hd]) * 0.125;
                assert_eq!(g.to_bits(), want.to_bits(), "hd {hd} row {j}");
                assert_eq!(p.to_bits(), want.to_bits(), "hd {hd} row {j}");
            }
            let p = values(rows, 3);
            let mut out = values(hd, 4);
            let (mut port, mut want) = (out.clone(), out.clone());
            axpy_f16(&p, &k, &mut out);
            axpy_portable(&p, &k, &mut port);
            for (j, pj) in p.iter().enumerate() {
                for d in 0..hd {
                    want[d] = pj.mul_add(k[j * hd + d].to_f32(), want[d]);
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&want), "hd {hd}");
            assert_eq!(bits(&port), bits(&want), "hd {hd}");
        }
    }
}
