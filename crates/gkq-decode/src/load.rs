//! The pipelined load of a stage: its blocks are pulled in first-use order
//! (layer 0 first, the final norm and the lm_head last) by the reader's
//! parallel schedule, and a thread of its own turns each into f32 tensors
//! as soon as it is verified. The forward pass waits only for the layer it
//! is about to run, so compute starts while later layers still arrive, and
//! the raw bytes of a block live only until it is converted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use bytes::Bytes;
use candle_core::Tensor;
use gkq_format::Block;
use gkq_reader::{BlockingPull, Pulled};

use crate::config::Config;
use crate::error::{DecodeError, Result};
use crate::model::{Layer, Linear, Weight, layer_block_names, tensor_from_block};
use gkq_format::arch::Part;

/// What a stage has loaded so far.
#[derive(Default)]
struct Slots {
    layers: Vec<Option<Layer>>,
    norm: Option<Tensor>,
    lm_head: bool,
    error: Option<DecodeError>,
    /// When the last item arrived.
    done: Option<Instant>,
}

/// The loaded weights of a stage, filled by the loader thread.
pub(crate) struct Loaded {
    slots: Mutex<Slots>,
    cv: Condvar,
    stop: AtomicBool,
}

use gkq_store::blocking::lock;

/// `[..]` f32 tensor of a pulled block, its shape checked.
fn tensor(
    name: &str,
    got: &mut HashMap<String, (Block, Bytes)>,
    shape: &[usize],
) -> Result<Tensor> {
    let (block, bytes) = take(name, got, shape)?;
    tensor_from_block(&bytes, block.dtype, shape)
}

/// A pulled block, removed from `got`, its shape checked.
fn take(
    name: &str,
    got: &mut HashMap<String, (Block, Bytes)>,
    shape: &[usize],
) -> Result<(Block, Bytes)> {
    let (block, bytes) = got
        .remove(name)
        .ok_or_else(|| DecodeError::Weights(format!("block {name} was not pulled")))?;
    let have: Vec<usize> = block.shape.iter().map(|&d| d as usize).collect();
    if have != shape {
        return Err(DecodeError::Weights(format!(
            "block {name} has shape {have:?}, config.json implies {shape:?}"
        )));
    }
    Ok((block, bytes))
}

/// The weight matrix of a pulled block (quantized for a block type), its
/// shape checked.
fn weight(
    name: &str,
    got: &mut HashMap<String, (Block, Bytes)>,
    shape: &[usize],
) -> Result<Weight> {
    let (block, bytes) = take(name, got, shape)?;
    Weight::of(bytes, block.dtype, shape)
}

/// A norm's weight with the family's offset added (Gemma's `1 + w` from
/// safetensors), its shape checked.
fn norm(
    name: &str,
    got: &mut HashMap<String, (Block, Bytes)>,
    shape: &[usize],
    offset: f64,
) -> Result<Tensor> {
    let w = tensor(name, got, shape)?;
    Ok(if offset == 0.0 { w } else { (w + offset)? })
}

/// Builds layer `l` from its pulled blocks, by part.
fn layer(cfg: &Config, l: usize, got: &mut HashMap<String, (Block, Bytes)>) -> Result<Layer> {
    let (h, q, kv, i, hd) = (
        cfg.hidden,
        cfg.heads * cfg.head_dim,
        cfg.kv_heads * cfg.head_dim,
        cfg.intermediate,
        cfg.head_dim,
    );
    let name = |p: Part| cfg.layer_block(l, p);
    let need = |p: Part| {
        name(p)
            .ok_or_else(|| DecodeError::Weights(format!("a {} layer has no {p:?}", cfg.arch.name)))
    };
    let mut w = |p: Part, shape: &[usize]| weight(&need(p)?, got, shape);
    let (q_w, k_w, v_w, o_w) = (
        w(Part::Q, &[q, h])?,
        w(Part::K, &[kv, h])?,
        w(Part::V, &[kv, h])?,
        w(Part::O, &[h, q])?,
    );
    let (gate, up, down) = (
        w(Part::Gate, &[i, h])?,
        w(Part::Up, &[i, h])?,
        w(Part::Down, &[h, i])?,
    );
    let mut opt = |p: Part, shape: &[usize], offset: f64| -> Result<Option<Tensor>> {
        name(p).map(|n| norm(&n, got, shape, offset)).transpose()
    };
    let off = cfg.norm_offset;
    let (qb, kb, vb) = (
        opt(Part::QBias, &[q], 0.0)?,
        opt(Part::KBias, &[kv], 0.0)?,
        opt(Part::VBias, &[kv], 0.0)?,
    );
    let plain = |w| Linear { w, b: None };
    Ok(Layer {
        attn_norm: opt(Part::AttnNorm, &[h], off)?
            .ok_or_else(|| DecodeError::Weights("no attention norm".into()))?,
        q: Linear { w: q_w, b: qb },
        k: Linear { w: k_w, b: kb },
        v: Linear { w: v_w, b: vb },
        o: plain(o_w),
        q_norm: opt(Part::QNorm, &[hd], off)?,
        k_norm: opt(Part::KNorm, &[hd], off)?,
        post_attn_norm: opt(Part::PostAttnNorm, &[h], off)?,
        ffn_norm: opt(Part::FfnNorm, &[h], off)?
            .ok_or_else(|| DecodeError::Weights("no feed-forward norm".into()))?,
        post_ffn_norm: opt(Part::PostFfnNorm, &[h], off)?,
        gate: plain(gate),
        up: plain(up),
        down: plain(down),
    })
}

/// What the loader needs to know about the stage.
pub(crate) struct Plan {
    pub(crate) cfg: Config,
    pub(crate) first: usize,
    pub(crate) count: usize,
    pub(crate) norm: bool,
}

impl Loaded {
    /// Starts the loader thread on `pull`.
    pub(crate) fn start(pull: BlockingPull, plan: Plan) -> Arc<Loaded> {
        let loaded = Arc::new(Loaded {
            slots: Mutex::new(Slots {
                layers: (0..plan.count).map(|_| None).collect(),
                ..Slots::default()
            }),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let l = loaded.clone();
        std::thread::spawn(move || {
            if let Err(e) = l.run(pull, &plan) {
                lock(&l.slots).error = Some(e);
            }
            lock(&l.slots).done = Some(Instant::now());
            l.cv.notify_all();
        });
        loaded
    }

    fn run(&self, pull: BlockingPull, plan: &Plan) -> Result<()> {
        let mut got: HashMap<String, (Block, Bytes)> = HashMap::new();
        let mut next = 0;
        for r in pull {
            let (item, pulled) = r?;
            if self.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            match (item, pulled) {
                (gkq_reader::PullItem::Block(name), Pulled::Block { block, bytes }) => {
                    got.insert(name, (block, bytes));
                }
                (_, Pulled::LmHead(m)) => {
                    m.prepare()?; // the f32 tensor or the quantized matmul, made now rather than at the first logits
                    lock(&self.slots).lm_head = true;
                }
                (item, _) => {
                    return Err(DecodeError::Weights(format!(
                        "unexpected pull item {item:?}"
                    )));
                }
            }
            while next < plan.count
                && layer_block_names(&plan.cfg, plan.first + next)
                    .iter()
                    .all(|n| got.contains_key(n))
            {
                let built = layer(&plan.cfg, plan.first + next, &mut got)?;
                lock(&self.slots).layers[next] = Some(built);
                next += 1;
                self.cv.notify_all();
            }
            let norm_name = plan.cfg.norm_name();
            if plan.norm && got.contains_key(norm_name) {
                let norm = norm(
                    norm_name,
                    &mut got,
                    &[plan.cfg.hidden],
                    plan.cfg.norm_offset,
                )?;
                lock(&self.slots).norm = Some(norm);
                self.cv.notify_all();
            }
        }
        Ok(())
    }

    /// Waits until `ready` holds of the slots (or the loader failed or ended).
    fn wait<T>(&self, mut ready: impl FnMut(&mut Slots) -> Option<T>) -> Result<T> {
        let mut s = lock(&self.slots);
        loop {
            if let Some(t) = ready(&mut s) {
                return Ok(t);
            }
            if let Some(e) = s.error.take() {
                return Err(e);
            }
            if s.done.is_some() {
                return Err(DecodeError::Weights(
                    "the pull ended before every block arrived".into(),
                ));
            }
            s = self
                .cv
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Takes layer `i` (relative to the stage), waiting for it.
    pub(crate) fn take_layer(&self, i: usize) -> Result<Layer> {
        self.wait(|s| s.layers.get_mut(i).and_then(Option::take))
    }

    /// Takes the final norm, waiting for it.
    pub(crate) fn take_norm(&self) -> Result<Tensor> {
        self.wait(|s| s.norm.take())
    }

    /// Waits until the lm_head is resident and its f32 weights made.
    pub(crate) fn wait_lm_head(&self) -> Result<()> {
        self.wait(|s| s.lm_head.then_some(()))
    }

    /// Waits until the loader has ended; returns when.
    pub(crate) fn wait_done(&self) -> Result<Instant> {
        let mut s = lock(&self.slots);
        loop {
            if let Some(e) = s.error.take() {
                return Err(e);
            }
            if let Some(d) = s.done {
                return Ok(d);
            }
            s = self
                .cv
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// When the last item arrived, if it has.
    pub(crate) fn done(&self) -> Option<Instant> {
        lock(&self.slots).done
    }

    /// Asks the loader to stop after the item it is on.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
