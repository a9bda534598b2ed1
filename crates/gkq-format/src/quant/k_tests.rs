//! The lane quantizers of the K types against ggml's scalar functions,
//! kept here as written before (one group at a time): the same codes and
//! scales bit for bit on random groups and on every case they branch on.

use super::*;

/// ggml's `make_qkx2_quants`: codes `l[i]` in `0..=nmax` and `(scale,
/// -min)` fitting `x ≈ scale·l + min`, the weighted error searched over
/// `nstep + 1` candidate scales (`use_mad` false: squared error).
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32; 32],
    weights: &[f32; 32],
    l: &mut [u8; 32],
    (rmin, rdelta, nstep): (f32, f32, i32),
) -> (f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..32 {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        *l = [0; 32];
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..32 {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    let mut aux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..32 {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = q as u8;
            let (w, lf) = (weights[i], q as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..32 {
                let diff = this_scale * aux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                *l = aux;
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and no weights (Q6_K): codes
/// `l[i] = q + nmax` with `q` in `-nmax..nmax`, and the scale.
fn make_qx_quants(nmax: i32, x: &[f32; 16], l: &mut [u8; 16]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        *l = [0; 16];
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let fit = |iscale: f32, l: &mut [u8; 16]| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for i in 0..16 {
            let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            l[i] = (q + nmax) as u8;
            let (w, qf) = (x[i] * x[i], q as f32);
            sumlx += w * x[i] * qf;
            suml2 += w * qf * qf;
        }
        (sumlx, suml2)
    };
    let (sumlx, suml2) = fit(-nmaxf / max, l);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmaxf + 0.1 * is as f32) / max;
        let mut trial = [0u8; 16];
        let (sumlx, suml2) = fit(iscale, &mut trial);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            *l = trial;
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Groups of every shape the quantizers branch on: random values at several
/// scales, a flat group, an all-zero group, a group of positives, a tiny
/// group below `GROUP_MAX_EPS`, a single outlier.
fn groups(n: usize, len: usize) -> Vec<Vec<f32>> {
    let mut state = 0x9E37_79B9u32;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    };
    let mut out: Vec<Vec<f32>> = (0..n)
        .map(|k| {
            let scale = [1.0, 0.02, 30.0, 1e-3][k % 4];
            (0..len).map(|_| next() * scale).collect()
        })
        .collect();
    out.push(vec![-0.25; len]);
    out.push(vec![0.0; len]);
    out.push((0..len).map(|i| 0.5 + i as f32 / 64.0).collect());
    out.push(vec![1e-17; len]);
    out.push((0..len).map(|i| if i == 5 { 3.0 } else { 0.01 }).collect());
    out
}

#[test]
fn qkx2_lanes_equal_the_scalar_function() {
    for (nmax, search) in [(15, (-1.0, 0.1, 20)), (31, (-0.5, 0.1, 15))] {
        let gs = groups(400, 32);
        for chunk in gs.chunks(8).filter(|c| c.len() == 8) {
            let x: [[f32; 8]; 32] = std::array::from_fn(|i| std::array::from_fn(|j| chunk[j][i]));
            let w: [[f32; 8]; 32] =
                std::array::from_fn(|i| std::array::from_fn(|j| 0.3 + chunk[j][i].abs()));
            let mut l = [[0u8; 8]; 32];
            let (scale, min) = make_qkx2_lanes(nmax, &x, &w, &mut l, search);
            for j in 0..8 {
                let xs: [f32; 32] = std::array::from_fn(|i| x[i][j]);
                let ws: [f32; 32] = std::array::from_fn(|i| w[i][j]);
                let mut ls = [0u8; 32];
                let (s, m) = make_qkx2_quants(nmax, &xs, &ws, &mut ls, search);
                assert_eq!(
                    (scale[j].to_bits(), min[j].to_bits()),
                    (s.to_bits(), m.to_bits())
                );
                assert_eq!(
                    ls,
                    std::array::from_fn(|i| l[i][j]),
                    "group {j} of nmax {nmax}"
                );
            }
        }
    }
}

#[test]
fn qx_lanes_equal_the_scalar_function() {
    let gs = groups(800, 16);
    for chunk in gs.chunks(16).filter(|c| c.len() == 16) {
        let x: [[f32; 16]; 16] = std::array::from_fn(|i| std::array::from_fn(|j| chunk[j][i]));
        let mut l = [[0u8; 16]; 16];
        let scale = make_qx_lanes(32, &x, &mut l);
        for j in 0..16 {
            let xs: [f32; 16] = std::array::from_fn(|i| x[i][j]);
            let mut ls = [0u8; 16];
            assert_eq!(
                scale[j].to_bits(),
                make_qx_quants(32, &xs, &mut ls).to_bits()
            );
            assert_eq!(ls, std::array::from_fn(|i| l[i][j]), "group {j}");
        }
    }
}
