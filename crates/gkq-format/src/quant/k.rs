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

/// ggml's `make_qkx2_quants` (`use_mad` false: squared error) for `N`
/// groups of 32 side by side: lane `j` of every array is group `j`. Each
/// lane runs ggml's scalar steps in ggml's order, data-dependent branches
/// becoming selects, so its codes `l[i][j]` in `0..=nmax` and `(scale,
/// -min)` fitting `x ≈ scale·l + min` are the scalar function's bit for
/// bit, while the compiler keeps the lanes in vector registers. The
/// weighted error is searched over `nstep + 1` candidate scales.
fn make_qkx2_lanes<const N: usize>(
    nmax: i32,
    x: &[[f32; N]; 32],
    w: &[[f32; N]; 32],
    l: &mut [[u8; N]; 32],
    (rmin, rdelta, nstep): (f32, f32, i32),
) -> ([f32; N], [f32; N]) {
    let (mut min, mut max, mut sum_w) = (x[0], x[0], w[0]);
    let mut sum_x: [f32; N] = std::array::from_fn(|j| sum_w[j] * x[0][j]);
    for i in 1..32 {
        for j in 0..N {
            let v = x[i][j];
            min[j] = if v < min[j] { v } else { min[j] };
            max[j] = if v > max[j] { v } else { max[j] };
            sum_w[j] += w[i][j];
            sum_x[j] += w[i][j] * v;
        }
    }
    min = min.map(|m| if m > 0.0 { 0.0 } else { m });
    let first_min = min;
    let nmaxf = nmax as f32;
    let iscale: [f32; N] = std::array::from_fn(|j| nmaxf / (max[j] - min[j]));
    let mut scale = iscale.map(|i| 1.0 / i);
    codes(nmax, x, iscale, min, l);
    let mut best = weighted_error(x, w, l, scale, min);
    let mut aux = [[0u8; N]; 32];
    for is in 0..=nstep {
        let top = rmin + rdelta * is as f32 + nmaxf;
        codes(
            nmax,
            x,
            std::array::from_fn(|j| top / (max[j] - min[j])),
            min,
            &mut aux,
        );
        let (mut sum_l, mut sum_l2, mut sum_xl) = ([0f32; N], [0f32; N], [0f32; N]);
        for i in 0..32 {
            for j in 0..N {
                let (w, lf) = (w[i][j], f32::from(aux[i][j]));
                sum_l[j] += w * lf;
                sum_l2[j] += w * lf * lf;
                sum_xl[j] += w * lf * x[i][j];
            }
        }
        let (mut this_scale, mut this_min, mut better) = ([0f32; N], [0f32; N], [false; N]);
        for j in 0..N {
            let d = sum_w[j] * sum_l2[j] - sum_l[j] * sum_l[j];
            better[j] = d > 0.0;
            this_scale[j] = (sum_w[j] * sum_xl[j] - sum_x[j] * sum_l[j]) / d;
            this_min[j] = (sum_l2[j] * sum_x[j] - sum_l[j] * sum_xl[j]) / d;
            if this_min[j] > 0.0 {
                this_min[j] = 0.0;
                this_scale[j] = sum_xl[j] / sum_l2[j];
            }
        }
        let cur_error = weighted_error(x, w, &aux, this_scale, this_min);
        for j in 0..N {
            better[j] &= cur_error[j] < best[j];
            if better[j] {
                best[j] = cur_error[j];
                scale[j] = this_scale[j];
                min[j] = this_min[j];
            }
        }
        for (l, aux) in l.iter_mut().zip(&aux) {
            for j in 0..N {
                l[j] = if better[j] { aux[j] } else { l[j] };
            }
        }
    }
    // a flat group (max == min) is all zero codes, scale 0
    for j in 0..N {
        if max[j] == first_min[j] {
            (scale[j], min[j]) = (0.0, first_min[j]);
            l.iter_mut().for_each(|l| l[j] = 0);
        }
    }
    (scale, min.map(|m| -m))
}

/// The lanes' codes `nearest_int(iscale·(x − min))`, clipped to `0..=nmax`.
#[inline(always)]
fn codes<const N: usize>(
    nmax: i32,
    x: &[[f32; N]; 32],
    iscale: [f32; N],
    min: [f32; N],
    l: &mut [[u8; N]; 32],
) {
    for (l, x) in l.iter_mut().zip(x) {
        for j in 0..N {
            l[j] = nearest_int(iscale[j] * (x[j] - min[j])).clamp(0, nmax) as u8;
        }
    }
}

/// The lanes' weighted squared errors of `scale·l + min` against `x`,
/// summed in value order.
#[inline(always)]
fn weighted_error<const N: usize>(
    x: &[[f32; N]; 32],
    w: &[[f32; N]; 32],
    l: &[[u8; N]; 32],
    scale: [f32; N],
    min: [f32; N],
) -> [f32; N] {
    let mut err = [0f32; N];
    for i in 0..32 {
        for j in 0..N {
            let diff = scale[j] * f32::from(l[i][j]) + min[j] - x[i][j];
            err[j] += w[i][j] * (diff * diff);
        }
    }
    err
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and no weights (Q6_K) for
/// `N` groups of 16 side by side, lane `j` of every array being group `j`
/// (as [`make_qkx2_lanes`]): codes `l[i][j] = q + nmax` with `q` in
/// `-nmax..nmax`, and the scales.
fn make_qx_lanes<const N: usize>(nmax: i32, x: &[[f32; N]; 16], l: &mut [[u8; N]; 16]) -> [f32; N] {
    let (mut max, mut amax) = ([0f32; N], [0f32; N]);
    for x in x {
        for j in 0..N {
            if x[j].abs() > amax[j] {
                amax[j] = x[j].abs();
                max[j] = x[j];
            }
        }
    }
    let nmaxf = nmax as f32;
    let fit = |iscale: [f32; N], l: &mut [[u8; N]; 16]| {
        let (mut sumlx, mut suml2) = ([0f32; N], [0f32; N]);
        for i in 0..16 {
            for j in 0..N {
                let q = nearest_int(iscale[j] * x[i][j]).clamp(-nmax, nmax - 1);
                l[i][j] = (q + nmax) as u8;
                let (w, qf) = (x[i][j] * x[i][j], q as f32);
                sumlx[j] += w * x[i][j] * qf;
                suml2[j] += w * qf * qf;
            }
        }
        (sumlx, suml2)
    };
    let (sumlx, suml2) = fit(max.map(|m| -nmaxf / m), l);
    let mut scale: [f32; N] = std::array::from_fn(|j| {
        if suml2[j] != 0.0 {
            sumlx[j] / suml2[j]
        } else {
            0.0
        }
    });
    let mut best: [f32; N] = std::array::from_fn(|j| scale[j] * sumlx[j]);
    let mut trial = [[0u8; N]; 16];
    for is in (-9..=9).filter(|&is| is != 0) {
        let (sumlx, suml2) = fit(max.map(|m| -(nmaxf + 0.1 * is as f32) / m), &mut trial);
        let mut better = [false; N];
        for j in 0..N {
            better[j] = suml2[j] > 0.0 && sumlx[j] * sumlx[j] > best[j] * suml2[j];
            if better[j] {
                scale[j] = sumlx[j] / suml2[j];
                best[j] = scale[j] * sumlx[j];
            }
        }
        for (l, t) in l.iter_mut().zip(&trial) {
            for j in 0..N {
                l[j] = if better[j] { t[j] } else { l[j] };
            }
        }
    }
    // a group below GROUP_MAX_EPS is all zero codes, scale 0
    for j in 0..N {
        if amax[j] < GROUP_MAX_EPS {
            scale[j] = 0.0;
            l.iter_mut().for_each(|l| l[j] = 0);
        }
    }
    scale
}

/// `x` (groups of `G` values, `N` groups) with group `j` in lane `j`:
/// `out[i][j] = x[G·j + i]`.
fn transpose<const G: usize, const N: usize>(x: &[f32]) -> [[f32; N]; G] {
    std::array::from_fn(|i| std::array::from_fn(|j| x[G * j + i]))
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
    let xt: [[f32; 8]; 32] = transpose(x);
    let mut sum_x2 = [0f32; 8];
    for x in &xt {
        for j in 0..8 {
            sum_x2[j] += x[j] * x[j];
        }
    }
    let av_x = sum_x2.map(|s| (s / 32.0).sqrt());
    let weights = xt.map(|x| std::array::from_fn(|j| av_x[j] + x[j].abs()));
    let mut lt = [[0u8; 8]; 32];
    let (scales, mins) = make_qkx2_lanes(nmax, &xt, &weights, &mut lt, search);
    for (i, lt) in lt.iter().enumerate() {
        for j in 0..8 {
            l[32 * j + i] = lt[j];
        }
    }
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
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
    let mut lt = [[0u8; 16]; 16];
    let scales = make_qx_lanes(32, &transpose(x), &mut lt);
    for (i, lt) in lt.iter().enumerate() {
        for ib in 0..16 {
            l[16 * ib + i] = lt[ib];
        }
    }
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..16 {
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

#[cfg(test)]
#[path = "k_tests.rs"]
mod tests;
