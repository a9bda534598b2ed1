//! The decoder layers, written on candle-core ops in f32: RMSNorm, rotary
//! positions ("rotate half", as Hugging Face's Llama/Qwen2), grouped-query
//! attention with a KV cache, SwiGLU MLP. Weights are the knot's blocks
//! widened exactly to f32, or for a block type kept quantized and run
//! through ggml's quantized matmul (candle's `quantized` module).

use candle_core::{D, DType as CDType, Device, Tensor};
use gkq_format::DType;

use crate::config::{Config, DecoderFamily};
use crate::error::{DecodeError, Result};

/// `[..]` f32 weights from a block's bytes (f16/bf16 widened exactly).
pub(crate) fn tensor_from_block(bytes: &[u8], dtype: DType, shape: &[usize]) -> Result<Tensor> {
    let d = match dtype {
        DType::F32 => CDType::F32,
        DType::F16 => CDType::F16,
        DType::BF16 => CDType::BF16,
        other => {
            return Err(DecodeError::Weights(format!(
                "a {other} block where a float tensor is needed"
            )));
        }
    };
    Ok(Tensor::from_raw_buffer(bytes, d, shape, &Device::Cpu)?.to_dtype(CDType::F32)?)
}

/// A weight matrix `[out, in]`: f32, or a block type kept in its blocks
/// and multiplied by ggml's quantized kernels (candle's `QMatMul`).
pub(crate) enum Weight {
    Float(Tensor),
    Quant(candle_core::quantized::QMatMul),
}

impl Weight {
    /// The weight of a block's bytes: quantized for a block type, else
    /// widened exactly to f32.
    pub(crate) fn of(bytes: &[u8], dtype: DType, shape: &[usize]) -> Result<Weight> {
        match (dtype.is_quantized(), shape) {
            (true, &[rows, cols]) => Ok(Weight::Quant(gkq_reader::qmatmul(
                bytes, dtype, rows, cols,
            )?)),
            _ => Ok(Weight::Float(tensor_from_block(bytes, dtype, shape)?)),
        }
    }
}

/// A linear layer `x @ w^T + b`.
pub(crate) struct Linear {
    pub(crate) w: Weight,
    pub(crate) b: Option<Tensor>,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.w {
            Weight::Float(w) => x.matmul(&w.t()?)?,
            Weight::Quant(q) => candle_core::Module::forward(q, x)?,
        };
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// One decoder layer's weights.
pub(crate) struct Layer {
    pub(crate) input_norm: Tensor,
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
    pub(crate) post_norm: Tensor,
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

/// The names of a layer's blocks, in the order [`Layer`] takes them; the
/// three biases are present for Qwen2 only.
pub(crate) fn layer_block_names(cfg: &Config, l: usize) -> Vec<String> {
    let mut v: Vec<String> = [
        "input_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    ]
    .iter()
    .map(|n| cfg.layer_block(l, n))
    .collect();
    if cfg.arch == DecoderFamily::Qwen2 {
        for b in [
            "self_attn.q_proj.bias",
            "self_attn.k_proj.bias",
            "self_attn.v_proj.bias",
        ] {
            v.push(cfg.layer_block(l, b));
        }
    }
    v
}

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) * w`.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let var = x.sqr()?.mean_keepdim(D::Minus1)?;
    let x = x.broadcast_div(&(var + eps)?.sqrt()?)?;
    Ok(x.broadcast_mul(w)?)
}

/// Cosines and sines `[t, head_dim]` for positions `pos..pos + t`.
fn rope_tables(cfg: &Config, pos: usize, t: usize) -> Result<(Tensor, Tensor)> {
    let half = cfg.head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1.0 / (cfg.rope_theta as f32).powf((2 * i) as f32 / cfg.head_dim as f32))
        .collect();
    let mut angles = Vec::with_capacity(t * cfg.head_dim);
    for p in pos..pos + t {
        let row: Vec<f32> = inv.iter().map(|f| p as f32 * f).collect();
        angles.extend_from_slice(&row);
        angles.extend_from_slice(&row);
    }
    let a = Tensor::from_vec(angles, (t, cfg.head_dim), &Device::Cpu)?;
    Ok((a.cos()?, a.sin()?))
}

/// Applies rotary positions to `x: [t, heads, head_dim]` whose pairs are
/// adjacent dimensions `(2i, 2i + 1)` (llama.cpp's Llama layout); `cos` and
/// `sin` are the "rotate half" tables, whose halves are equal.
fn rope_interleaved(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (t, heads, hd) = x.dims3()?;
    let pairs = x.reshape((t, heads, hd / 2, 2))?;
    let (even, odd) = (pairs.narrow(3, 0, 1)?, pairs.narrow(3, 1, 1)?);
    let half =
        |m: &Tensor| -> Result<Tensor> { Ok(m.narrow(1, 0, hd / 2)?.unsqueeze(1)?.unsqueeze(3)?) };
    let (c, s) = (half(cos)?, half(sin)?);
    let a = (even.broadcast_mul(&c)? - odd.broadcast_mul(&s)?)?;
    let b = (even.broadcast_mul(&s)? + odd.broadcast_mul(&c)?)?;
    Ok(Tensor::cat(&[&a, &b], 3)?.reshape((t, heads, hd))?)
}

/// Applies rotary positions to `x: [t, heads, head_dim]`.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let hd = x.dim(2)?;
    let x1 = x.narrow(2, 0, hd / 2)?;
    let x2 = x.narrow(2, hd / 2, hd / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], 2)?;
    let cos = cos.unsqueeze(1)?;
    let sin = sin.unsqueeze(1)?;
    Ok((x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?)?)
}

/// Softmax over the last dimension.
fn softmax(x: &Tensor) -> Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&m)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    Ok(e.broadcast_div(&s)?)
}

/// A layer's key/value cache: `[positions, kv_heads, head_dim]` each.
#[derive(Default)]
pub(crate) struct Cache {
    k: Option<Tensor>,
    v: Option<Tensor>,
}

impl Layer {
    /// Runs the layer on `x: [t, hidden]`, the tokens at `pos..pos + t`.
    pub(crate) fn forward(
        &self,
        cfg: &Config,
        x: &Tensor,
        pos: usize,
        cache: &mut Cache,
    ) -> Result<Tensor> {
        let t = x.dim(0)?;
        let (nh, nkv, hd) = (cfg.heads, cfg.kv_heads, cfg.head_dim);
        let h = rms_norm(x, &self.input_norm, cfg.eps)?;
        let q = self.q.forward(&h)?.reshape((t, nh, hd))?;
        let k = self.k.forward(&h)?.reshape((t, nkv, hd))?;
        let v = self.v.forward(&h)?.reshape((t, nkv, hd))?;
        let (cos, sin) = rope_tables(cfg, pos, t)?;
        let rotate = if cfg.rope_interleaved() {
            rope_interleaved
        } else {
            rope
        };
        let q = rotate(&q, &cos, &sin)?;
        let k = rotate(&k, &cos, &sin)?;
        let k = match &cache.k {
            Some(prev) => Tensor::cat(&[prev, &k], 0)?,
            None => k,
        };
        let v = match &cache.v {
            Some(prev) => Tensor::cat(&[prev, &v], 0)?,
            None => v,
        };
        cache.k = Some(k.clone());
        cache.v = Some(v.clone());
        let len = k.dim(0)?;
        let group = nh / nkv;
        // [kv, len, hd] → [heads, len, hd]: query head i reads kv head i / group
        let expand = |x: &Tensor| -> Result<Tensor> {
            Ok(x.transpose(0, 1)?
                .unsqueeze(1)?
                .expand((nkv, group, len, hd))?
                .reshape((nh, len, hd))?)
        };
        let (k, v) = (expand(&k)?, expand(&v)?);
        let q = q.transpose(0, 1)?.contiguous()?; // [heads, t, hd]
        let scores = (q.matmul(&k.t()?.contiguous()?)? / (hd as f64).sqrt())?;
        // causal: query at pos + i sees keys 0..=pos + i
        let mask: Vec<f32> = (0..t)
            .flat_map(|i| (0..len).map(move |j| if j <= pos + i { 0.0 } else { f32::NEG_INFINITY }))
            .collect();
        let mask = Tensor::from_vec(mask, (t, len), &Device::Cpu)?;
        let probs = softmax(&scores.broadcast_add(&mask)?)?;
        let attn = probs
            .matmul(&v.contiguous()?)?
            .transpose(0, 1)?
            .reshape((t, nh * hd))?;
        let x = (x + self.o.forward(&attn)?)?;
        let h = rms_norm(&x, &self.post_norm, cfg.eps)?;
        let mlp = self
            .down
            .forward(&(self.gate.forward(&h)?.silu()? * self.up.forward(&h)?)?)?;
        Ok((x + mlp)?)
    }
}
