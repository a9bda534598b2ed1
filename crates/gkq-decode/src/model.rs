//! The decoder layer, written on candle ops (its fused CPU kernels where it
//! has them: `rms_norm`, the rotary embedding, softmax over the last
//! dimension): RMSNorm, rotary positions, grouped-query attention over a
//! preallocated KV cache, a gated MLP. One code path for the architectures
//! of `gkq_format::arch`, the parts a family lacks left out: Qwen2's q/k/v
//! biases, Gemma 3's q and k norms, its norms after attention and after the
//! MLP, its GELU gate and its local (sliding-window) layers. Weights are the
//! knot's blocks widened exactly to f32, or for a block type kept quantized
//! and run through ggml's quantized matmul (candle's `quantized` module).

use candle_core::{D, DType as CDType, Device, Tensor};
use gkq_format::DType;
use gkq_format::arch::Part;

use crate::config::Config;
use crate::error::{DecodeError, Result};
use crate::kv::Cache;
use gkq_format::arch::Activation;

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
/// and multiplied by ggml's quantized kernels (`gkq_reader::QMatrix`).
pub(crate) enum Weight {
    Float(Tensor),
    Quant(gkq_reader::QMatrix),
}

impl Weight {
    /// The weight of a block's bytes: quantized for a block type, else
    /// widened exactly to f32.
    pub(crate) fn of(bytes: bytes::Bytes, dtype: DType, shape: &[usize]) -> Result<Weight> {
        match (dtype.is_quantized(), shape) {
            (true, &[rows, cols]) => Ok(Weight::Quant(gkq_reader::QMatrix::new(
                bytes, dtype, rows, cols,
            )?)),
            _ => Ok(Weight::Float(tensor_from_block(&bytes, dtype, shape)?)),
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
            Weight::Quant(q) => q.forward(x)?,
        };
        self.biased(y)
    }

    fn biased(&self, y: Tensor) -> Result<Tensor> {
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// Each layer of `ls` on the same `x`: quantized ones in one pass
    /// (`QMatrix::forward_many`: the activations quantized once).
    fn forward_many<const N: usize>(ls: [&Linear; N], x: &Tensor) -> Result<[Tensor; N]> {
        let qs: Option<Vec<&gkq_reader::QMatrix>> = ls
            .iter()
            .map(|l| match &l.w {
                Weight::Quant(q) => Some(q),
                Weight::Float(_) => None,
            })
            .collect();
        let ys: Vec<Tensor> = match qs {
            Some(qs) => gkq_reader::QMatrix::forward_many(&qs, x)?
                .into_iter()
                .zip(ls)
                .map(|(y, l)| l.biased(y))
                .collect::<Result<_>>()?,
            None => ls.iter().map(|l| l.forward(x)).collect::<Result<_>>()?,
        };
        ys.try_into()
            .map_err(|_| DecodeError::Weights("a product per layer".into()))
    }
}

/// One decoder layer's weights; the norms with the family's offset added.
pub(crate) struct Layer {
    pub(crate) attn_norm: Tensor,
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
    pub(crate) q_norm: Option<Tensor>,
    pub(crate) k_norm: Option<Tensor>,
    pub(crate) post_attn_norm: Option<Tensor>,
    pub(crate) ffn_norm: Tensor,
    pub(crate) post_ffn_norm: Option<Tensor>,
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

/// The parts a layer loads, in this order.
pub(crate) const LAYER_PARTS: [Part; 16] = [
    Part::AttnNorm,
    Part::Q,
    Part::K,
    Part::V,
    Part::O,
    Part::QBias,
    Part::KBias,
    Part::VBias,
    Part::QNorm,
    Part::KNorm,
    Part::PostAttnNorm,
    Part::FfnNorm,
    Part::PostFfnNorm,
    Part::Gate,
    Part::Up,
    Part::Down,
];

/// The names of a layer's blocks (the parts its architecture has).
pub(crate) fn layer_block_names(cfg: &Config, l: usize) -> Vec<String> {
    LAYER_PARTS
        .iter()
        .filter_map(|&p| cfg.layer_block(l, p))
        .collect()
}

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) * w`
/// (candle's fused kernel).
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    Ok(candle_nn::ops::rms_norm(&x.contiguous()?, w, eps as f32)?)
}

/// Cosines and sines `[positions, head_dim / 2]` of one rope base, grown
/// as positions are reached.
pub(crate) struct RopeTable {
    base: f64,
    cos: Tensor,
    sin: Tensor,
}

impl RopeTable {
    fn new(base: f64) -> Result<RopeTable> {
        let empty = Tensor::zeros((0, 1), CDType::F32, &Device::Cpu)?;
        Ok(RopeTable {
            base,
            cos: empty.clone(),
            sin: empty,
        })
    }

    /// The tables for positions `pos..pos + t`, computing them up to at
    /// least `2 × (pos + t)` when they are not there yet.
    fn get(&mut self, head_dim: usize, pos: usize, t: usize) -> Result<(Tensor, Tensor)> {
        let half = head_dim / 2;
        if self.cos.dim(0)? < pos + t || self.cos.dim(1)? != half {
            let n = (2 * (pos + t)).max(256);
            let inv: Vec<f32> = (0..half)
                .map(|i| (1.0 / self.base.powf((2 * i) as f64 / head_dim as f64)) as f32)
                .collect();
            let angles: Vec<f32> = (0..n)
                .flat_map(|p| inv.iter().map(move |f| p as f32 * f))
                .collect();
            let a = Tensor::from_vec(angles, (n, half), &Device::Cpu)?;
            (self.cos, self.sin) = (a.cos()?, a.sin()?);
        }
        Ok((self.cos.narrow(0, pos, t)?, self.sin.narrow(0, pos, t)?))
    }
}

/// The rope tables of a stage: the global base's, and a local one's.
pub(crate) struct Ropes(Vec<RopeTable>);

impl Ropes {
    pub(crate) fn new() -> Ropes {
        Ropes(Vec::new())
    }

    fn of(&mut self, base: f64) -> Result<&mut RopeTable> {
        if let Some(i) = self.0.iter().position(|r| r.base == base) {
            return Ok(&mut self.0[i]);
        }
        self.0.push(RopeTable::new(base)?);
        Ok(self.0.last_mut().expect("just pushed"))
    }
}

/// The mask of queries `pos..pos + t` over keys `lo..hi`: 0 where a key is
/// seen (not after the query, and within `window` of it), −∞ elsewhere.
fn mask(pos: usize, t: usize, (lo, hi): (usize, usize), window: Option<usize>) -> Result<Tensor> {
    let m: Vec<f32> = (0..t)
        .flat_map(|i| {
            (lo..hi).map(move |j| {
                let q = pos + i;
                let seen = j <= q && window.is_none_or(|w| q - j < w);
                if seen { 0.0 } else { f32::NEG_INFINITY }
            })
        })
        .collect();
    Ok(Tensor::from_vec(m, (t, hi - lo), &Device::Cpu)?)
}

/// Queries whose attention is computed at once: the scores of a tile are
/// `heads × QUERY_TILE × keys` values, so that a long prompt never holds
/// `heads × tokens × tokens` of them (a 4,000-token prompt held 2 GB).
const QUERY_TILE: usize = 64;

/// Where and how a layer runs.
pub(crate) struct Step<'a> {
    pub(crate) cfg: &'a Config,
    pub(crate) layer: usize,
    pub(crate) pos: usize,
}

impl Layer {
    /// Grouped-query attention of `q: [1, heads, t, hd]` over the cache
    /// after `k`, `v` (`[1, kv_heads, t, hd]`) are appended: `[t, heads·hd]`,
    /// the queries in tiles of [`QUERY_TILE`], each over the keys it can
    /// see (up to its last query; a local layer's, within its window).
    fn attend(
        &self,
        s: &Step<'_>,
        (q, k, v): (Tensor, Tensor, Tensor),
        cache: &mut Cache,
    ) -> Result<Tensor> {
        let cfg = s.cfg;
        let (nh, nkv, hd) = (cfg.heads, cfg.kv_heads, cfg.head_dim);
        let t = q.dim(2)?;
        let group = nh / nkv;
        let (window, _) = cfg.layer_attention(s.layer);
        // a one-token step reads the cache in place (f32 or f16)
        if let Some(out) = cache.attend_one((&q, &k, &v), cfg.attn_scale as f32, window)? {
            return Ok(out);
        }
        let (k, v) = cache.append(&k, &v)?;
        let (k, v) = (k.squeeze(0)?, v.squeeze(0)?); // [kv, len, hd]
        let mut tiles = Vec::with_capacity(t.div_ceil(QUERY_TILE));
        for start in (0..t).step_by(QUERY_TILE) {
            let tq = QUERY_TILE.min(t - start);
            let first = s.pos + start;
            let (lo, hi) = (
                window.map_or(0, |w| (first + 1).saturating_sub(w)),
                first + tq,
            );
            let (kt, vt) = (k.narrow(1, lo, hi - lo)?, v.narrow(1, lo, hi - lo)?);
            let qt = q.narrow(2, start, tq)?.contiguous()?;
            let qt = qt.reshape((nkv, group * tq, hd))?;
            let scores = (qt.matmul(&kt.t()?)? * cfg.attn_scale)?;
            // one query sees every key of its range: no mask
            let scores = if tq > 1 {
                let m = mask(first, tq, (lo, hi), window)?;
                scores
                    .reshape((nkv, group, tq, hi - lo))?
                    .broadcast_add(&m)?
                    .reshape((nkv, group * tq, hi - lo))?
            } else {
                scores
            };
            let probs = candle_nn::ops::softmax_last_dim(&scores.contiguous()?)?;
            // vt is read in place (candle's matmul takes its stride between
            // heads): no copy of the cache's values per step
            tiles.push(probs.matmul(&vt)?.reshape((nh, tq, hd))?);
        }
        let out = match tiles.len() {
            1 => tiles.pop().expect("one tile"),
            _ => Tensor::cat(&tiles, 1)?,
        };
        Ok(out.transpose(0, 1)?.reshape((t, nh * hd))?)
    }

    /// Runs the layer on `x: [t, hidden]`, the tokens at `s.pos..s.pos + t`.
    pub(crate) fn forward(
        &self,
        s: &Step<'_>,
        x: &Tensor,
        cache: &mut Cache,
        ropes: &mut Ropes,
    ) -> Result<Tensor> {
        let cfg = s.cfg;
        let t = x.dim(0)?;
        let (nh, nkv, hd) = (cfg.heads, cfg.kv_heads, cfg.head_dim);
        let h = rms_norm(x, &self.attn_norm, cfg.eps)?;
        let heads = |y: Tensor, n: usize| -> Result<Tensor> {
            Ok(y.reshape((1, t, n, hd))?.transpose(1, 2)?.contiguous()?)
        };
        let [q, k, v] = Linear::forward_many([&self.q, &self.k, &self.v], &h)?;
        let (mut q, mut k, v) = (heads(q, nh)?, heads(k, nkv)?, heads(v, nkv)?);
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = rms_norm(&q, qn, cfg.eps)?;
            k = rms_norm(&k, kn, cfg.eps)?;
        }
        let (_, base) = cfg.layer_attention(s.layer);
        let (cos, sin) = ropes.of(base)?.get(hd, s.pos, t)?;
        let rotate = if cfg.rope_interleaved() {
            candle_nn::rotary_emb::rope_i
        } else {
            candle_nn::rotary_emb::rope
        };
        let (q, k) = (rotate(&q, &cos, &sin)?, rotate(&k, &cos, &sin)?);
        let attn = self.attend(s, (q, k, v), cache)?;
        let mut o = self.o.forward(&attn)?;
        if let Some(n) = &self.post_attn_norm {
            o = rms_norm(&o, n, cfg.eps)?;
        }
        let x = (x + o)?;
        let h = rms_norm(&x, &self.ffn_norm, cfg.eps)?;
        let [gate, up] = Linear::forward_many([&self.gate, &self.up], &h)?;
        let act = match cfg.activation {
            Activation::Silu => (gate.silu()? * up)?,
            Activation::GeluTanh => gelu_mul(&gate, &up)?,
        };
        let mut mlp = self.down.forward(&act)?;
        if let Some(n) = &self.post_ffn_norm {
            mlp = rms_norm(&mlp, n, cfg.eps)?;
        }
        Ok((x + mlp)?)
    }
}

/// `gelu(gate) · up`, GELU's tanh form (gkq-kernels' fused loop: candle's
/// `gelu` calls libm's `tanhf` per value).
fn gelu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let f32s =
        |t: &Tensor| -> Result<Vec<f32>> { Ok(t.to_dtype(CDType::F32)?.flatten_all()?.to_vec1()?) };
    let mut g = f32s(gate)?;
    gkq_kernels::gelu_tanh_mul(&mut g, &f32s(up)?);
    Ok(Tensor::from_vec(g, gate.shape(), gate.device())?.to_dtype(gate.dtype())?)
}

/// The logits `[vocab]` of the last row of `x`, soft-capped when the
/// family caps them.
pub(crate) fn soft_cap(logits: Tensor, cap: Option<f64>) -> Result<Tensor> {
    Ok(match cap {
        Some(c) => ((logits / c)?.tanh()? * c)?,
        None => logits,
    })
}

/// The last dimension's argmax.
pub(crate) fn argmax(logits: &Tensor) -> Result<u32> {
    Ok(logits.argmax(D::Minus1)?.to_scalar::<u32>()?)
}
