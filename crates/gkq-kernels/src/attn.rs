//! One query's attention products over a KV cache's keys and values, read
//! in place in the cache's type (f32, or f16 as ggml's `vec_dot_f16` reads
//! them) instead of through a matrix product. The order is fixed, so the
//! AVX2 kernels give the portable ones' bits:
//!
//! - a key's score: eight lanes, lane `l` the FMAs of values `8c + l`, `c`
//!   in order, folded in halves (`l + 4`, `+ 2`, `+ 1`), then times the
//!   scale;
//! - the values' sum: `out[d] = fma(p_j, v_j[d], out[d])`, `j` in order.

use half::f16;

/// A type a KV cache keeps its keys and values in.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// The value as f32 (exact).
    fn widen(self) -> f32;
    /// The AVX2 kernels for the type, if this CPU has them.
    #[doc(hidden)]
    fn simd() -> Option<(KvDot<Self>, KvAxpy<Self>)>;
}

/// A type's score kernel (`dot_kv`'s arguments).
#[doc(hidden)]
pub type KvDot<T> = fn(&[f32], &[T], f32, &mut [f32]);
/// A type's sum kernel (`axpy_kv`'s arguments).
#[doc(hidden)]
pub type KvAxpy<T> = fn(&[f32], &[T], &mut [f32]);

impl KvElem for f32 {
    fn widen(self) -> f32 {
        self
    }

    fn simd() -> Option<(KvDot<f32>, KvAxpy<f32>)> {
        #[cfg(target_arch = "x86_64")]
        return crate::attn_x86::f32_kernels();
        #[cfg(not(target_arch = "x86_64"))]
        None
    }
}

impl KvElem for f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }

    fn simd() -> Option<(KvDot<f16>, KvAxpy<f16>)> {
        #[cfg(target_arch = "x86_64")]
        return crate::attn_x86::f16_kernels();
        #[cfg(not(target_arch = "x86_64"))]
        None
    }
}

/// `out[j] = scale · q · k_j` for the first `out.len()` rows of `k`
/// (`q.len()` values each, a multiple of 8).
pub fn dot_kv<T: KvElem>(q: &[f32], k: &[T], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    assert!(
        hd.is_multiple_of(8) && k.len() >= out.len() * hd,
        "whole rows of 8s"
    );
    match T::simd() {
        Some((dot, _)) => dot(q, k, scale, out),
        None => dot_portable(q, k, scale, out),
    }
}

fn dot_portable<T: KvElem>(q: &[f32], k: &[T], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    for (j, o) in out.iter_mut().enumerate() {
        let row = &k[j * hd..(j + 1) * hd];
        let mut acc = [0f32; 8];
        for (qc, kc) in q.chunks_exact(8).zip(row.chunks_exact(8)) {
            for l in 0..8 {
                acc[l] = qc[l].mul_add(kc[l].widen(), acc[l]);
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
pub fn axpy_kv<T: KvElem>(p: &[f32], v: &[T], out: &mut [f32]) {
    let hd = out.len();
    assert!(
        hd.is_multiple_of(8) && v.len() >= p.len() * hd,
        "whole rows of 8s"
    );
    match T::simd() {
        Some((_, axpy)) => axpy(p, v, out),
        None => axpy_portable(p, v, out),
    }
}

fn axpy_portable<T: KvElem>(p: &[f32], v: &[T], out: &mut [f32]) {
    let hd = out.len();
    for (j, &pj) in p.iter().enumerate() {
        for (o, x) in out.iter_mut().zip(&v[j * hd..(j + 1) * hd]) {
            *o = pj.mul_add(x.widen(), *o);
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
    fn dot_ref<T: KvElem>(q: &[f32], k: &[T]) -> f32 {
        let mut acc = [0f32; 8];
        for (i, (a, b)) in q.iter().zip(k).enumerate() {
            acc[i % 8] = a.mul_add(b.widen(), acc[i % 8]);
        }
        let a = [0, 1, 2, 3].map(|l| acc[l] + acc[l + 4]);
        let a = [a[0] + a[2], a[1] + a[3]];
        a[0] + a[1]
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn check<T: KvElem>(of: fn(f32) -> T) {
        for hd in [8, 64, 128, 256] {
            let rows = 37;
            let q = values(hd, 1);
            let k: Vec<T> = values(hd * rows, 2).into_iter().map(of).collect();
            let (mut got, mut port) = (vec![0f32; rows], vec![0f32; rows]);
            dot_kv(&q, &k, 0.125, &mut got);
            dot_portable(&q, &k, 0.125, &mut port);
            let want: Vec<f32> = (0..rows)
                .map(|j| dot_ref(&q, &k[j * hd..(j + 1) * hd]) * 0.125)
                .collect();
            assert_eq!(bits(&got), bits(&want), "hd {hd}");
            assert_eq!(bits(&port), bits(&want), "hd {hd}");
            let p = values(rows, 3);
            let mut out = values(hd, 4);
            let (mut port, mut want) = (out.clone(), out.clone());
            axpy_kv(&p, &k, &mut out);
            axpy_portable(&p, &k, &mut port);
            for (j, pj) in p.iter().enumerate() {
                for d in 0..hd {
                    want[d] = pj.mul_add(k[j * hd + d].widen(), want[d]);
                }
            }
            assert_eq!(bits(&out), bits(&want), "hd {hd}");
            assert_eq!(bits(&port), bits(&want), "hd {hd}");
        }
    }

    #[test]
    fn kv_products_follow_their_order_bit_for_bit() {
        check::<f32>(|x| x);
        check::<f16>(f16::from_f32);
    }
}
