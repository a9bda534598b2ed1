//! The feed-forward activations that libm made slow: GELU's tanh form
//! (Gemma's `gelu_pytorch_tanh`) with a rational tanh that vectorises,
//! fused with the product by the up projection, among rayon's threads.
//! candle's `gelu` calls libm's `tanhf` once per value, 9 % of a long
//! Gemma 3 prefill.

use rayon::prelude::*;

/// Values a thread takes at a time.
const CHUNK: usize = 1 << 14;

/// `tanh(x)` within 4e-7 of the exact value (a few f32 steps near ±1;
/// libm's `tanhf` is within one) by Eigen's rational approximation
/// (`generic_fast_tanh_float`: odd degree 13 over even degree 6 on
/// [-7.9053, 7.9053], where it is 1 to within that).
#[inline(always)]
fn tanh(x: f32) -> f32 {
    const ALPHA: [f32; 7] = [
        -2.760_768_5e-16,
        2.000_188e-13,
        -8.604_672e-11,
        5.122_297e-8,
        1.485_722_4e-5,
        6.372_619_3e-4,
        4.893_524_6e-3,
    ];
    const BETA: [f32; 4] = [1.198_258_4e-6, 1.185_347_1e-4, 2.268_434_6e-3, 4.893_525e-3];
    let c = x.clamp(-7.905_311, 7.905_311);
    let x2 = c * c;
    let p = ALPHA.iter().fold(0f32, |p, &a| p * x2 + a) * c;
    let q = BETA.iter().fold(0f32, |q, &b| q * x2 + b);
    // below 4e-4 tanh(x) is x in f32
    if x.abs() < 4e-4 { x } else { p / q }
}

/// GELU, tanh form: `0.5 v (1 + tanh(√(2/π) v (1 + 0.044715 v²)))`.
#[inline(always)]
fn gelu_tanh(v: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * v * (1.0 + tanh(SQRT_2_OVER_PI * v * (1.0 + 0.044_715 * v * v)))
}

/// `gate[i] = gelu_tanh(gate[i]) · up[i]` (the shorter length).
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    gate.par_chunks_mut(CHUNK)
        .zip(up.par_chunks(CHUNK))
        .for_each(|(g, u)| {
            for (g, &u) in g.iter_mut().zip(u) {
                *g = gelu_tanh(*g) * u;
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gelu64(v: f64) -> f64 {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * v * (1.0 + (c * v * (1.0 + 0.044715 * v * v)).tanh())
    }

    /// The rational tanh within 4e-7 of f64's over [-12, 12] (measured:
    /// 3.05e-7), odd, and within it of 1 at 30; GELU times `up` within
    /// what the tanh's error and f32's roundings allow of the f64 value.
    #[test]
    fn tanh_and_gelu_are_close_to_f64() {
        let xs: Vec<f32> = (-120_000..=120_000).map(|i| i as f32 * 1e-4).collect();
        let mut worst = 0f64;
        for &x in &xs {
            let (got, want) = (f64::from(tanh(x)), f64::from(x).tanh());
            worst = worst.max((got - want).abs());
            assert_eq!(tanh(-x), -tanh(x), "{x}");
        }
        assert!(worst <= 4e-7, "{worst}");
        assert!((1.0 - tanh(30.0)).abs() <= 4e-7 && tanh(-30.0) == -tanh(30.0));
        let up: Vec<f32> = xs.iter().map(|x| 1.0 - x / 20.0).collect();
        let mut g = xs.clone();
        gelu_tanh_mul(&mut g, &up);
        for ((&x, &u), &g) in xs.iter().zip(&up).zip(&g) {
            let want = gelu64(f64::from(x)) * f64::from(u);
            // half of v·u times the tanh's error, and f32's roundings
            let tol = 2e-7 * f64::from(x * u).abs() + 1e-6 * want.abs();
            assert!((f64::from(g) - want).abs() <= tol, "{x}: {g} {want}");
        }
    }
}
