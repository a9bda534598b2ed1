//! The KV cache: each layer's keys and values, `[1, kv_heads, positions,
//! head_dim]`, in f32 (candle-nn's cache: preallocated, grown without
//! concatenating the whole cache per step) or in f16, as llama.cpp keeps
//! them by default (`-ctk f16 -ctv f16`: half the memory; rounded to
//! nearest even as ggml rounds). A one-token step's attention reads either
//! in place (gkq-kernels' `dot_kv`, `axpy_kv`); a prompt's widens an f16
//! cache to f32 for candle's matrix products (F16C's conversions).

use candle_core::{Device, Tensor};
use gkq_kernels::KvElem;
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use crate::error::Result;

/// How the cache keeps keys or values (llama.cpp's `--cache-type-k` and
/// `--cache-type-v`, of which f32 and f16).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    /// As computed.
    #[default]
    F32,
    /// Rounded to f16 (to nearest, ties to even), read back exactly.
    F16,
}

impl KvType {
    /// The type of llama.cpp's name (`f32`, `f16`), or `None`.
    pub fn parse(name: &str) -> Option<KvType> {
        match name {
            "f32" => Some(KvType::F32),
            "f16" => Some(KvType::F16),
            _ => None,
        }
    }
}

/// The types of a cache's keys and values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvTypes {
    /// The keys' (`-ctk`).
    pub k: KvType,
    /// The values' (`-ctv`).
    pub v: KvType,
}

/// Keys or values of one layer.
enum Store {
    F32(candle_nn::kv_cache::Cache),
    F16(Half),
}

impl Store {
    fn new(kind: KvType, positions: usize) -> Store {
        match kind {
            KvType::F32 => Store::F32(candle_nn::kv_cache::Cache::new(2, positions)),
            KvType::F16 => Store::F16(Half {
                data: Vec::new(),
                heads: 0,
                dim: 0,
                cap: positions,
                len: 0,
            }),
        }
    }

    /// Appends `x` (`[1, heads, t, dim]`); every position so far.
    fn append(&mut self, x: &Tensor) -> Result<Tensor> {
        match self {
            Store::F32(c) => {
                c.append(x)?;
                Ok(c.current_data()?.expect("just appended"))
            }
            Store::F16(h) => h.append(x),
        }
    }

    fn len(&self) -> usize {
        match self {
            Store::F32(c) => c.current_seq_len(),
            Store::F16(h) => h.len,
        }
    }

    fn capacity(&self) -> usize {
        match self {
            Store::F32(c) => c.max_seq_len(),
            Store::F16(h) => h.cap,
        }
    }
}

/// f16 positions, head after head: `data[(h · cap + p) · dim ..][..dim]`.
struct Half {
    data: Vec<f16>,
    heads: usize,
    dim: usize,
    cap: usize,
    len: usize,
}

impl Half {
    /// Appends `x` (`[1, heads, t, dim]`), rounded to f16.
    fn push(&mut self, x: &Tensor) -> Result<()> {
        let (_, heads, t, dim) = x.dims4()?;
        if self.data.is_empty() {
            (self.heads, self.dim, self.cap) = (heads, dim, self.cap.max(t));
            self.data = vec![f16::ZERO; heads * self.cap * dim];
        }
        if self.len + t > self.cap {
            self.grow((self.len + t).max(2 * self.cap));
        }
        let src = x.flatten_all()?.to_vec1::<f32>()?;
        for (h, part) in src.chunks_exact(t * dim).enumerate() {
            let at = (h * self.cap + self.len) * dim;
            self.data[at..at + t * dim].convert_from_f32_slice(part);
        }
        self.len += t;
        Ok(())
    }

    /// Positions `from..len` of kv head `h`.
    fn rows(&self, h: usize, from: usize) -> &[f16] {
        &self.data[(h * self.cap + from) * self.dim..(h * self.cap + self.len) * self.dim]
    }

    /// Appends `x`; every position so far, widened to f32.
    fn append(&mut self, x: &Tensor) -> Result<Tensor> {
        self.push(x)?;
        let mut out = vec![0f32; self.heads * self.len * self.dim];
        for (h, dst) in out.chunks_exact_mut(self.len * self.dim).enumerate() {
            self.rows(h, 0).convert_to_f32_slice(dst);
        }
        let shape = (1, self.heads, self.len, self.dim);
        Ok(Tensor::from_vec(out, shape, &Device::Cpu)?)
    }

    fn grow(&mut self, cap: usize) {
        let mut data = vec![f16::ZERO; self.heads * cap * self.dim];
        let n = self.len * self.dim;
        for h in 0..self.heads {
            let (from, to) = (h * self.cap * self.dim, h * cap * self.dim);
            data[to..to + n].copy_from_slice(&self.data[from..from + n]);
        }
        (self.data, self.cap) = (data, cap);
    }
}

/// A layer's key/value cache.
pub(crate) struct Cache {
    k: Store,
    v: Store,
    types: KvTypes,
}

impl Cache {
    /// A cache for about `positions` positions (it grows past them).
    pub(crate) fn new(positions: usize, types: KvTypes) -> Cache {
        let positions = positions.max(1);
        Cache {
            k: Store::new(types.k, positions),
            v: Store::new(types.v, positions),
            types,
        }
    }

    /// Room for exactly `positions` when nothing is cached yet: growing
    /// step by step copies the cache each time and leaves the heap in
    /// pieces (a 4,000-token prompt cost 100 MB more), and room for more
    /// is memory held for nothing: a stage's first caches have 512
    /// positions, zeroed when first written, 13.6 MB of SmolLM2's peak for
    /// a 21-token chat and 64 new tokens.
    pub(crate) fn reserve(&mut self, positions: usize) {
        if self.k.len() == 0 && self.k.capacity() != positions {
            *self = Cache::new(positions, self.types);
        }
    }

    /// Appends `k` and `v` (`[1, kv_heads, t, head_dim]`); every position's
    /// keys and values so far, f32.
    pub(crate) fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((self.k.append(k)?, self.v.append(v)?))
    }

    /// One query's attention (`q`: `[1, heads, 1, head_dim]`) after `k`
    /// and `v` are appended, over the last `window` positions (all if
    /// `None`), `[1, heads · head_dim]`: the keys and values read in place
    /// in their type by gkq-kernels' products, the softmax in f32 as
    /// candle's. `None` (nothing appended) when keys and values differ in
    /// type or a head is not whole 8s: the caller's matrix products then.
    pub(crate) fn attend_one(
        &mut self,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        scale: f32,
        window: Option<usize>,
    ) -> Result<Option<Tensor>> {
        let (_, heads, t, hd) = q.dims4()?;
        if t != 1 || !hd.is_multiple_of(8) || self.types.k != self.types.v {
            return Ok(None);
        }
        let q = q.flatten_all()?.to_vec1::<f32>()?;
        let out = match (&mut self.k, &mut self.v) {
            (Store::F16(ks), Store::F16(vs)) => {
                ks.push(k)?;
                vs.push(v)?;
                let lo = window.map_or(0, |w| ks.len.saturating_sub(w));
                let kv_heads = ks.heads;
                let rows = (|h| ks.rows(h, lo), |h| vs.rows(h, lo));
                one_query(&q, hd, heads / kv_heads.max(1), scale, rows)
            }
            (Store::F32(kc), Store::F32(vc)) => {
                kc.append(k)?;
                vc.append(v)?;
                let (len, cap) = (kc.current_seq_len(), kc.max_seq_len());
                let lo = window.map_or(0, |w| len.saturating_sub(w));
                let (kt, vt) = (full(kc)?, full(vc)?);
                let (ka, va) = (kt.storage_and_layout(), vt.storage_and_layout());
                let (kd, vd) = (f32s(&ka)?, f32s(&va)?);
                let kv_heads = kt.dim(1)?;
                let span = move |h: usize| (h * cap + lo) * hd..(h * cap + len) * hd;
                let rows = (|h| &kd[span(h)], |h| &vd[span(h)]);
                one_query(&q, hd, heads / kv_heads.max(1), scale, rows)
            }
            _ => unreachable!("keys and values of one type"),
        };
        Ok(Some(Tensor::from_vec(out, (1, heads * hd), &Device::Cpu)?))
    }
}

/// A candle cache's whole buffer, `[1, kv_heads, capacity, head_dim]`.
fn full(c: &candle_nn::kv_cache::Cache) -> Result<Tensor> {
    let t = c.all_data().clone().expect("appended to");
    Ok(if t.is_contiguous() {
        t
    } else {
        t.contiguous()?
    })
}

/// The f32 values of a contiguous CPU tensor's storage, from its start.
fn f32s<'a>(
    (storage, layout): &'a (candle_core::StorageRef<'_>, &candle_core::Layout),
) -> Result<&'a [f32]> {
    let candle_core::Storage::Cpu(cpu) = &**storage else {
        unreachable!("the decode runs on the CPU")
    };
    Ok(&cpu.as_slice::<f32>()?[layout.start_offset()..])
}

/// Each head's attention of one query `q` (`heads · hd` values) over
/// rows of its kv head (`group` heads to one), in parallel by head.
fn one_query<'a, T: KvElem, K, V>(
    q: &[f32],
    hd: usize,
    group: usize,
    scale: f32,
    (keys, values): (K, V),
) -> Vec<f32>
where
    K: Fn(usize) -> &'a [T] + Sync,
    V: Fn(usize) -> &'a [T] + Sync,
{
    let mut out = vec![0f32; q.len()];
    out.par_chunks_mut(hd)
        .zip(q.par_chunks(hd))
        .enumerate()
        .for_each(|(h, (o, qh))| {
            let (k, v) = (keys(h / group), values(h / group));
            let mut p = vec![0f32; k.len() / hd];
            gkq_kernels::dot_kv(qh, k, scale, &mut p);
            let m = p.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut sum = 0f32;
            for x in &mut p {
                *x = (*x - m).exp();
                sum += *x;
            }
            p.iter_mut().for_each(|x| *x /= sum);
            gkq_kernels::axpy_kv(&p, v, o);
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(types: KvTypes, xs: &[Vec<f32>]) -> Vec<f32> {
        let mut c = Cache::new(2, types);
        let mut last = None;
        for x in xs {
            let t = x.len() / (3 * 4);
            let x = Tensor::from_vec(x.clone(), (1, 3, t, 4), &Device::Cpu).expect("x");
            last = Some(c.append(&x, &x).expect("append"));
        }
        let (k, v) = last.expect("a step");
        assert_eq!(k.dims(), v.dims());
        k.flatten_all().expect("flat").to_vec1().expect("f32")
    }

    #[test]
    fn f16_keeps_each_value_rounded_to_f16_across_growth() {
        // 3 heads of 4 values: 5 positions, then 1, then 7 (the cache of 2
        // positions grows twice)
        let xs: Vec<Vec<f32>> = [5usize, 1, 7]
            .iter()
            .scan(0.0f32, |v, &t| {
                let x: Vec<f32> = (0..3 * t * 4)
                    .map(|_| {
                        *v += 0.37;
                        (*v * 1.1).sin() * 7_000.0 / (1.0 + *v)
                    })
                    .collect();
                Some(x)
            })
            .collect();
        let f16s = KvTypes {
            k: KvType::F16,
            v: KvType::F16,
        };
        let (exact, rounded) = (steps(KvTypes::default(), &xs), steps(f16s, &xs));
        assert_eq!(exact.len(), 3 * 13 * 4);
        for (a, b) in exact.iter().zip(&rounded) {
            assert_eq!(*b, f16::from_f32(*a).to_f32(), "{a}");
        }
        assert!(exact.iter().zip(&rounded).any(|(a, b)| a != b));
    }

    /// `attend_one` against the attention of the same f16 values widened,
    /// in f64, for every head of a group, with and without a window.
    #[test]
    fn one_token_attention_reads_the_cache_in_place() {
        let (kv, group, hd, t) = (2, 3, 16, 9);
        let f16s = KvTypes {
            k: KvType::F16,
            v: KvType::F16,
        };
        let tensor = |n: usize, seed: u32, shape: (usize, usize, usize, usize)| {
            let x: Vec<f32> = (0..n)
                .map(|i| {
                    (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 250.0 - 2.0
                })
                .collect();
            Tensor::from_vec(x, shape, &Device::Cpu).expect("tensor")
        };
        let (k, v) = (
            tensor(kv * t * hd, 1, (1, kv, t, hd)),
            tensor(kv * t * hd, 2, (1, kv, t, hd)),
        );
        let q = tensor(kv * group * hd, 3, (1, kv * group, 1, hd));
        let last = |x: &Tensor| x.narrow(2, t - 1, 1).and_then(|x| x.contiguous());
        let (k1, v1) = (last(&k).expect("k"), last(&v).expect("v"));
        let runs = [None, Some(4)].map(|w| [(w, f16s), (w, KvTypes::default())]);
        for (window, types) in runs.into_iter().flatten() {
            let mut c = Cache::new(4, types);
            let mut wide = Cache::new(4, types);
            let first = |x: &Tensor| x.narrow(2, 0, t - 1).and_then(|x| x.contiguous());
            let (kp, vp) = (first(&k).expect("k"), first(&v).expect("v"));
            c.append(&kp, &vp).expect("prompt");
            let got = c.attend_one((&q, &k1, &v1), 0.25, window).expect("attend");
            let got: Vec<f32> = got
                .expect("one type")
                .flatten_all()
                .expect("f")
                .to_vec1()
                .expect("v");
            let (kw, vw) = wide.append(&k, &v).expect("all");
            let to = |x: Tensor| -> Vec<f32> { x.flatten_all().expect("f").to_vec1().expect("v") };
            let (kw, vw, qv) = (to(kw), to(vw), to(q.clone()));
            let lo = window.map_or(0, |w| t - w);
            for h in 0..kv * group {
                let g = h / group;
                let score = |j: usize| -> f64 {
                    (0..hd)
                        .map(|d| f64::from(qv[h * hd + d]) * f64::from(kw[(g * t + j) * hd + d]))
                        .sum::<f64>()
                        * 0.25
                };
                let s: Vec<f64> = (lo..t).map(score).collect();
                let m = s.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..hd {
                    let want: f64 = (lo..t)
                        .map(|j| e[j - lo] / sum * f64::from(vw[(g * t + j) * hd + d]))
                        .sum();
                    let have = f64::from(got[h * hd + d]);
                    assert!(
                        (have - want).abs() < 1e-5,
                        "{window:?} {h} {d}: {have} {want}"
                    );
                }
            }
        }
        // keys and values of two types, or a step of several tokens, go
        // the general way
        let mixed = KvTypes {
            k: KvType::F16,
            v: KvType::F32,
        };
        let q2 = Tensor::cat(&[&q, &q], 2).expect("two queries");
        for (types, q) in [(mixed, &q), (f16s, &q2)] {
            let mut c = Cache::new(4, types);
            let none = c.attend_one((q, &k1, &v1), 0.25, None).expect("ok");
            assert!(none.is_none());
        }
    }

    #[test]
    fn types_have_llama_cpp_names() {
        assert_eq!(KvType::parse("f16"), Some(KvType::F16));
        assert_eq!(KvType::parse("f32"), Some(KvType::F32));
        assert_eq!(KvType::parse("q8_0"), None);
    }
}
