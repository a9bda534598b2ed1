//! The K types (super-blocks of 256): Q4_K, Q5_K, Q6_K. The quantizers are
//! ggml's `quantize_row_q{4,5,6}_K_ref` with `make_qkx2_quants` and
//! `make_qx_quants`, operation for operation; the dequantizers its
//! `dequantize_row_q{4,5,6}_K`.

use super::simple::{half, unhalf};

/// Values per super-block of the K types.
pub const QK_K: usize = 256;

/// ggml's `GROUP_MAX_EPS`: below it a group is all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round to nearest, ties to even, for
/// `|x| <= 4194303`, by the float-add trick ggml uses.
fn nearest_int(x: f32) -> i32 {
    let bits = (x + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

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

/// The 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K block's 12
/// scale bytes (ggml's `get_scale_min_k4`).
fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K and Q5_K share all but the code width: the 8 sub-blocks' codes
/// (in `l`), fitted scales and mins, packed into `d`, `dmin` and the 12
/// scale bytes at `b[0..16]`.
fn quant_sub_blocks(
    x: &[f32],
    b: &mut [u8],
    nmax: i32,
    l: &mut [u8; QK_K],
    search: (f32, f32, i32),
) {
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let mut xs = [0f32; 32];
        xs.copy_from_slice(&x[32 * j..32 * j + 32]);
        let mut sum_x2 = 0f32;
        for &v in &xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0f32; 32];
        for (w, &v) in weights.iter_mut().zip(&xs) {
            *w = av_x + v.abs();
        }
        let mut lj = [0u8; 32];
        (scales[j], mins[j]) = make_qkx2_quants(nmax, &xs, &weights, &mut lj, search);
        l[32 * j..32 * j + 32].copy_from_slice(&lj);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut b[4..16];
    for j in 0..8 {
        // C's conversion of an int to uint8_t keeps the low byte
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    b[0..2].copy_from_slice(&half(max_scale / 63.0));
    b[2..4].copy_from_slice(&half(max_min / 63.0));
    let (d, dmin) = (unhalf([b[0], b[1]]), unhalf([b[2], b[3]]));
    for j in 0..8 {
        let (s, m) = scale_min(j, &b[4..16]);
        let d = d * f32::from(s);
        if d == 0.0 {
            continue;
        }
        let dm = dmin * f32::from(m);
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / d).clamp(0, nmax) as u8;
        }
    }
}

pub(super) fn quant_q4_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    quant_sub_blocks(x, b, 15, &mut l, (-1.0, 0.1, 20));
    let qs = &mut b[16..144];
    for c in 0..4 {
        for i in 0..32 {
            qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
        }
    }
}

pub(super) fn quant_q5_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    quant_sub_blocks(x, b, 31, &mut l, (-0.5, 0.1, 15));
    let (qh, qs) = b[16..176].split_at_mut(32);
    qh.fill(0);
    for c in 0..4 {
        let (m1, m2) = (1u8 << (2 * c), 2u8 << (2 * c));
        for i in 0..32 {
            let (mut l1, mut l2) = (l[64 * c + i], l[64 * c + 32 + i]);
            if l1 > 15 {
                l1 -= 16;
                qh[i] |= m1;
            }
            if l2 > 15 {
                l2 -= 16;
                qh[i] |= m2;
            }
            qs[32 * c + i] = l1 | (l2 << 4);
        }
    }
}

pub(super) fn quant_q6_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..16 {
        let mut xs = [0f32; 16];
        xs.copy_from_slice(&x[16 * ib..16 * ib + 16]);
        let mut li = [0u8; 16];
        scales[ib] = make_qx_quants(32, &xs, &mut li);
        l[16 * ib..16 * ib + 16].copy_from_slice(&li);
        if scales[ib].abs() > max_abs_scale {
            max_abs_scale = scales[ib].abs();
            max_scale = scales[ib];
        }
    }
    b.fill(0);
    if max_abs_scale < GROUP_MAX_EPS {
        return;
    }
    let iscale = -128.0 / max_scale;
    b[208..210].copy_from_slice(&half(1.0 / iscale));
    let d = unhalf([b[208], b[209]]);
    for ib in 0..16 {
        let s = nearest_int(iscale * scales[ib]).min(127) as i8;
        b[192 + ib] = s as u8;
        let d = d * f32::from(s);
        if d == 0.0 {
            continue;
        }
        for i in 16 * ib..16 * ib + 16 {
            l[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as u8;
        }
    }
    let (ql, rest) = b.split_at_mut(128);
    let qh = &mut rest[..64];
    for h in 0..2 {
        let (lo, ql, qh) = (
            128 * h,
            &mut ql[64 * h..64 * h + 64],
            &mut qh[32 * h..32 * h + 32],
        );
        for i in 0..32 {
            let q = [l[lo + i], l[lo + i + 32], l[lo + i + 64], l[lo + i + 96]];
            ql[i] = (q[0] & 0x0F) | ((q[2] & 0x0F) << 4);
            ql[i + 32] = (q[1] & 0x0F) | ((q[3] & 0x0F) << 4);
            qh[i] = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
        }
    }
}

/// Q4_K and Q5_K: value `32j + i` is `d·sc_j·q - dmin·m_j`.
fn dequant_sub_blocks(b: &[u8], y: &mut [f32], code: impl Fn(usize) -> u8) {
    let (d, dmin) = (unhalf([b[0], b[1]]), unhalf([b[2], b[3]]));
    for j in 0..8 {
        let (s, m) = scale_min(j, &b[4..16]);
        let (d1, m1) = (d * f32::from(s), dmin * f32::from(m));
        for i in 32 * j..32 * j + 32 {
            y[i] = d1 * f32::from(code(i)) - m1;
        }
    }
}

/// The low 4 bits of value `v` of a Q4_K/Q5_K block's packed codes.
fn low4(qs: &[u8], v: usize) -> u8 {
    let (c, j) = (v / 64, v % 64);
    let byte = qs[32 * c + j % 32];
    if j < 32 { byte & 0x0F } else { byte >> 4 }
}

pub(super) fn dequant_q4_k(b: &[u8], y: &mut [f32]) {
    let qs = &b[16..144];
    dequant_sub_blocks(b, y, |v| low4(qs, v));
}

pub(super) fn dequant_q5_k(b: &[u8], y: &mut [f32]) {
    let (qh, qs) = (&b[16..48], &b[48..176]);
    dequant_sub_blocks(b, y, |v| {
        let high = (qh[v % 32] >> (v / 32)) & 1;
        low4(qs, v) | (high << 4)
    });
}

pub(super) fn dequant_q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
    let d = unhalf([b[208], b[209]]);
    for h in 0..2 {
        let (ql, qh, sc) = (&ql[64 * h..], &qh[32 * h..], &sc[8 * h..]);
        for i in 0..32 {
            let is = i / 16;
            let q = [
                (ql[i] & 0x0F) | ((qh[i] & 3) << 4),
                (ql[i + 32] & 0x0F) | (((qh[i] >> 2) & 3) << 4),
                (ql[i] >> 4) | (((qh[i] >> 4) & 3) << 4),
                (ql[i + 32] >> 4) | (((qh[i] >> 6) & 3) << 4),
            ];
            for (k, &q) in q.iter().enumerate() {
                let s = f32::from(sc[is + 2 * k] as i8);
                y[128 * h + 32 * k + i] = d * s * f32::from(q as i8 - 32);
            }
        }
    }
}
