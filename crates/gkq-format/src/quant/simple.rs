//! The 32-element types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0. Each quantizer is
//! ggml's `quantize_row_*_ref` as gguf-py's `gguf.quants` evaluates it
//! (values truncated then clipped to the type's range); each dequantizer
//! its `dequantize_row_*`.

use half::f16;

/// Values per block of the 32-element types.
pub const QK: usize = 32;

/// An f32 as the f16 ggml stores (round to nearest, ties to even).
pub(super) fn half(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

/// The f16 at `b` (a block's scale or minimum) as f32 (exact).
pub fn unhalf(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

/// Lanes of the order-free maxima below.
const LANES: usize = 8;

/// The largest of `|v|` over `x` leaving NaN out (0 for none), by lanes,
/// so that it vectorizes: a maximum does not depend on the order.
fn abs_max(x: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    for &v in chunks.remainder() {
        lanes[0] = if v.abs() > lanes[0] {
            v.abs()
        } else {
            lanes[0]
        };
    }
    for c in chunks {
        for k in 0..LANES {
            lanes[k] = if c[k].abs() > lanes[k] {
                c[k].abs()
            } else {
                lanes[k]
            };
        }
    }
    lanes.iter().fold(0f32, |m, &a| if a > m { a } else { m })
}

/// The value of largest magnitude (the first of them), as ggml finds it
/// (`if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`, from 0: a NaN is
/// never taken, and all zeros give +0): that magnitude, then the first
/// value that has it.
fn signed_max(x: &[f32]) -> f32 {
    let amax = abs_max(x);
    if amax == 0.0 {
        return 0.0;
    }
    x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0)
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// `trunc(v)` as an unsigned code, clipped to `0..=hi` (`as` truncates
/// and saturates, NaN to 0: one instruction where `trunc` is a call to
/// libm's `truncf` on x86-64's baseline).
fn code(v: f32, hi: u8) -> u8 {
    (v as u8).min(hi)
}

/// `x.round() as i8`: to nearest, halves away from zero, saturating, NaN
/// to 0 (ggml's `roundf` then its int8 conversion on x86), without a call
/// to libm's `roundf` (x86-64's baseline has no rounding instruction):
/// the integer part by a truncating conversion, the half by the remainder,
/// which is exact below 2^23 (the clamp keeps `x` there; NaN stays NaN).
pub fn round_i8(x: f32) -> i8 {
    let x = x.clamp(-256.0, 256.0);
    let t = x as i32;
    let r = x - t as f32;
    let t = if r >= 0.5 {
        t + 1
    } else if r <= -0.5 {
        t - 1
    } else {
        t
    };
    t.clamp(-128, 127) as i8
}

/// Two nibbles: value `j` low, value `j + 16` high.
fn nibbles(q: &[u8; QK], qs: &mut [u8]) {
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0x0F) | (q[j + QK / 2] << 4);
    }
}

/// The fifth bits, value `j` in bit `j`.
fn high_bits(q: &[u8; QK]) -> [u8; 4] {
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qh |= u32::from(v >> 4) << j;
    }
    qh.to_le_bytes()
}

pub(super) fn quant_q4_0(x: &[f32], b: &mut [u8]) {
    let d = signed_max(x) / -8.0;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (o, &v) in q.iter_mut().zip(x) {
        *o = code(v * id + 8.5, 15);
    }
    b[..2].copy_from_slice(&half(d));
    nibbles(&q, &mut b[2..]);
}

pub(super) fn quant_q4_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (o, &v) in q.iter_mut().zip(x) {
        *o = code((v - min) * id + 0.5, 15);
    }
    b[..2].copy_from_slice(&half(d));
    b[2..4].copy_from_slice(&half(min));
    nibbles(&q, &mut b[4..]);
}

pub(super) fn quant_q5_0(x: &[f32], b: &mut [u8]) {
    let d = signed_max(x) / -16.0;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (o, &v) in q.iter_mut().zip(x) {
        *o = code(v * id + 16.5, 31);
    }
    b[..2].copy_from_slice(&half(d));
    b[2..6].copy_from_slice(&high_bits(&q));
    nibbles(&q, &mut b[6..]);
}

pub(super) fn quant_q5_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (o, &v) in q.iter_mut().zip(x) {
        *o = code((v - min) * id + 0.5, 31);
    }
    b[..2].copy_from_slice(&half(d));
    b[2..4].copy_from_slice(&half(min));
    b[4..8].copy_from_slice(&high_bits(&q));
    nibbles(&q, &mut b[8..]);
}

pub(super) fn quant_q8_0(x: &[f32], b: &mut [u8]) {
    // ggml's `amax = MAX(amax, fabsf(v))`, `MAX(a, b)` being
    // `a > b ? a : b`: a NaN takes the place of the maximum, and a later
    // value replaces it (f32::max would skip the NaN instead)
    let amax = if x.iter().fold(false, |n, v| n | v.is_nan()) {
        x.iter()
            .fold(0f32, |a, v| if a > v.abs() { a } else { v.abs() })
    } else {
        // without NaN, the order does not matter
        abs_max(x)
    };
    let d = amax / 127.0;
    let id = inverse(d);
    b[..2].copy_from_slice(&half(d));
    for (o, &v) in b[2..].iter_mut().zip(x) {
        // round half away from zero, then the int8's bits; NaN (a NaN
        // value, or any value once the scale is NaN) gives 0, as ggml's
        // conversion does on x86 (FORMAT.md 3.5)
        *o = round_i8(v * id) as u8;
    }
}

/// The 4-bit codes of a block's 16 packed bytes, value order.
pub fn unpack4(qs: &[u8]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = qs[j] & 0x0F;
        q[j + QK / 2] = qs[j] >> 4;
    }
    q
}

/// The 5-bit codes of a block: the low nibbles and the bits of `qh`.
pub fn unpack5(qh: &[u8], qs: &[u8]) -> [u8; QK] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = unpack4(qs);
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((h >> j) & 1) as u8) << 4;
    }
    q
}

pub(super) fn dequant_q4_0(b: &[u8], y: &mut [f32]) {
    let d = unhalf([b[0], b[1]]);
    for (o, q) in y.iter_mut().zip(unpack4(&b[2..18])) {
        *o = d * (i32::from(q) - 8) as f32;
    }
}

pub(super) fn dequant_q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (unhalf([b[0], b[1]]), unhalf([b[2], b[3]]));
    for (o, q) in y.iter_mut().zip(unpack4(&b[4..20])) {
        *o = d * f32::from(q) + m;
    }
}

pub(super) fn dequant_q5_0(b: &[u8], y: &mut [f32]) {
    let d = unhalf([b[0], b[1]]);
    for (o, q) in y.iter_mut().zip(unpack5(&b[2..6], &b[6..22])) {
        *o = d * (i32::from(q) - 16) as f32;
    }
}

pub(super) fn dequant_q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (unhalf([b[0], b[1]]), unhalf([b[2], b[3]]));
    for (o, q) in y.iter_mut().zip(unpack5(&b[4..8], &b[8..24])) {
        *o = d * f32::from(q) + m;
    }
}

pub(super) fn dequant_q8_0(b: &[u8], y: &mut [f32]) {
    let d = unhalf([b[0], b[1]]);
    for (o, &q) in y.iter_mut().zip(&b[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's loops as written, one value after the other.
    fn signed_max_scalar(x: &[f32]) -> f32 {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        max
    }

    fn abs_max_scalar(x: &[f32]) -> f32 {
        x.iter()
            .fold(0f32, |a, v| if a > v.abs() { a } else { v.abs() })
    }

    /// The maxima by lanes equal ggml's loops bit for bit on the values
    /// they branch on: ties of sign, zeros of both signs, NaN, infinities.
    #[test]
    fn lane_maxima_equal_the_loops() {
        let mut cases: Vec<[f32; QK]> = Vec::new();
        let ramp: [f32; QK] = std::array::from_fn(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0);
        for (at, v) in [
            (3, 0.79),
            (30, -0.79),
            (5, f32::NAN),
            (31, f32::NAN),
            (9, f32::INFINITY),
            (12, f32::NEG_INFINITY),
            (0, -0.0),
        ] {
            let mut c = ramp;
            c[at] = v;
            cases.push(c);
        }
        cases.push([-0.0; QK]);
        cases.push([0.0; QK]);
        let mut tie = [0.25f32; QK];
        tie[4] = -0.5;
        tie[20] = 0.5;
        cases.push(tie);
        cases.push([f32::NAN; QK]);
        for c in &cases {
            assert_eq!(
                signed_max(c).to_bits(),
                signed_max_scalar(c).to_bits(),
                "{c:?}"
            );
            let mut ours = [0u8; 34];
            quant_q8_0(c, &mut ours);
            let d = abs_max_scalar(c) / 127.0;
            assert_eq!(ours[..2], half(d), "{c:?}");
        }
    }
}
