//! A pipeline stage: a reader, the layers it runs, their KV caches, and
//! the embedding (input role) or the final norm and lm_head (output role).

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use gkq_format::{Role, keys};
use gkq_reader::{PathKind, PullPlan, Reader, ReaderConfig, Serve};

use crate::config::Config;
use crate::error::{DecodeError, Result};
use crate::kv::{Cache, KvTypes};
use crate::load;
use crate::model::{Layer, Ropes, Step, layer_block_names, rms_norm, soft_cap};
use crate::{RoleBytes, RoleResolution, StageRoles};

/// One pipeline stage: a reader and the layers it runs, loaded in the
/// background in first-use order (the `load` module).
pub struct Stage {
    pub(crate) reader: Reader,
    pub(crate) cfg: Config,
    roles: StageRoles,
    pub(crate) layers: Range<usize>,
    weights: Vec<Option<Layer>>,
    norm: Option<Tensor>,
    loaded: Arc<load::Loaded>,
    cache: Vec<Cache>,
    /// How the caches keep keys and values.
    kv: KvTypes,
    ropes: Ropes,
    pos: usize,
    opened: Instant,
    header_bytes: u64,
    /// What [`Stage::bytes`] counts from (set by [`Stage::reset`]).
    base: RoleBytes,
    /// How long the forward pass waited for weights still arriving.
    waited: Duration,
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("roles", &self.roles)
            .field("layers", &self.layers)
            .finish_non_exhaustive()
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        self.loaded.stop();
    }
}

impl Stage {
    /// Opens `location` (path or URL) for `roles` over `layers` (default:
    /// all of them), reads and checks `config.json` against the knot, and
    /// starts pulling the blocks of its layers (and, for the output role,
    /// the final norm and the lm_head) in the background, in first-use
    /// order: [`Stage::forward`] waits only for the layer it runs next.
    pub fn open(
        location: &str,
        config: ReaderConfig,
        roles: StageRoles,
        layers: Option<Range<usize>>,
    ) -> Result<Stage> {
        let opened = Instant::now();
        let serve = match roles {
            StageRoles::Input => Serve::INPUT,
            StageRoles::Output => Serve::OUTPUT,
            StageRoles::All => Serve::ALL,
        };
        let reader = Reader::open(location, config, serve)?;
        let header_bytes = reader.net_stats().payload_bytes;
        let cfg = Config::from_json(&config_json(&reader)?)?;
        cfg.check(reader.knot().header().header())?;
        let layers = match layers {
            None => 0..cfg.layers,
            Some(r) if r.start <= r.end && r.end <= cfg.layers => r,
            Some(r) => {
                return Err(DecodeError::Layers {
                    start: r.start,
                    end: r.end,
                    layers: cfg.layers,
                });
            }
        };
        let mut plan = PullPlan::new().budget(PULL_BUDGET);
        for l in layers.clone() {
            for name in layer_block_names(&cfg, l) {
                plan = plan.block(name);
            }
        }
        let output = roles != StageRoles::Input;
        if output {
            plan = plan.block(cfg.norm_name()).lm_head();
        }
        let loaded = load::Loaded::start(
            reader.pull(plan),
            load::Plan {
                cfg: cfg.clone(),
                first: layers.start,
                count: layers.len(),
                norm: output,
            },
        );
        Ok(Stage {
            cache: caches(layers.len(), KvTypes::default()),
            kv: KvTypes::default(),
            ropes: Ropes::new(),
            weights: (0..layers.len()).map(|_| None).collect(),
            reader,
            cfg,
            roles,
            layers,
            norm: None,
            loaded,
            pos: 0,
            opened,
            header_bytes,
            base: RoleBytes::default(),
            waited: Duration::ZERO,
        })
    }

    /// Forgets the KV caches and the position, for a new session through the
    /// same reader (whose row cache and resident lm_head stay warm).
    pub fn reset(&mut self) {
        self.cache = caches(self.weights.len(), self.kv);
        self.pos = 0;
        self.base = self.total_bytes();
    }

    /// The stage with its KV caches keeping keys and values as `kv` says
    /// (f32 by default; llama.cpp's `-ctk`/`-ctv`), empty.
    pub fn with_cache_types(mut self, kv: KvTypes) -> Stage {
        self.kv = kv;
        self.cache = caches(self.weights.len(), kv);
        self
    }

    /// The positions the KV caches hold (the earlier turns of a
    /// conversation; 0 after [`Stage::open`] and [`Stage::reset`]).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The reader.
    pub fn reader(&self) -> &Reader {
        &self.reader
    }

    /// When [`Stage::open`] started.
    pub fn opened(&self) -> Instant {
        self.opened
    }

    /// Milliseconds from open until every block of the stage had arrived
    /// and been verified, once they have.
    pub fn load_ms(&self) -> Option<f64> {
        self.loaded
            .done()
            .map(|d| d.duration_since(self.opened).as_secs_f64() * 1e3)
    }

    /// Waits until every block of the stage is loaded; returns when the
    /// last one arrived.
    pub fn wait_loaded(&mut self) -> Result<Instant> {
        for i in 0..self.weights.len() {
            self.layer(i)?;
        }
        if self.serves_output() {
            self.final_norm()?;
            let t = Instant::now();
            self.loaded.wait_lm_head()?;
            self.waited += t.elapsed();
        }
        self.loaded.wait_done()
    }

    /// Payload bytes this stage's reader fetched so far, per role. The
    /// embedding's are its rows (gap rows and rejected ones included) and
    /// their proofs, or the dense block; the lm_head's what its pull moved;
    /// the rest (every other block, `config.json`) is the remainder.
    pub fn bytes(&self) -> RoleBytes {
        self.total_bytes().since(&self.base)
    }

    fn total_bytes(&self) -> RoleBytes {
        let total = self.reader.net_stats().payload_bytes;
        let embedding_rows = self.reader.embedding().map_or(0, |e| e.fetched_bytes());
        let lm_head = self.reader.lm_head().map_or(0, |l| l.fetched_bytes());
        let knot_header = self.header_bytes;
        RoleBytes {
            knot_header,
            embedding_rows,
            lm_head,
            other_blocks: total
                .saturating_sub(knot_header)
                .saturating_sub(embedding_rows)
                .saturating_sub(lm_head),
        }
    }

    pub(crate) fn serves_input(&self) -> bool {
        self.roles != StageRoles::Output
    }

    pub(crate) fn serves_output(&self) -> bool {
        self.roles != StageRoles::Input
    }

    fn layer(&mut self, i: usize) -> Result<()> {
        if self.weights[i].is_none() {
            let t = Instant::now();
            self.weights[i] = Some(self.loaded.take_layer(i)?);
            self.waited += t.elapsed();
        }
        Ok(())
    }

    /// How long [`Stage::forward`] and [`Stage::logits`] have waited for
    /// weights still arriving (the load runs beside the compute): once per
    /// layer, the final norm and the lm_head, at their first use.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    fn final_norm(&mut self) -> Result<Tensor> {
        if self.norm.is_none() {
            let t = Instant::now();
            self.norm = Some(self.loaded.take_norm()?);
            self.waited += t.elapsed();
        }
        self.norm
            .clone()
            .ok_or_else(|| DecodeError::Stages("an input stage has no final norm".into()))
    }

    /// Room in the KV cache for `positions` when nothing is cached yet.
    pub fn reserve(&mut self, positions: usize) {
        for c in &mut self.cache {
            c.reserve(positions);
        }
    }

    /// Fetches the embedding rows of `ids` (input role) at once, so that a
    /// prompt run in parts still fetches its rows together.
    pub fn prefetch(&mut self, ids: &[u32]) -> Result<()> {
        Ok(self.reader.embedding()?.prefetch(ids)?)
    }

    /// Embedding rows of `ids`, `[t, hidden]` f32 (input role), scaled as
    /// the family scales them (Gemma: by `sqrt(hidden)`).
    pub fn embed(&mut self, ids: &[u32]) -> Result<Tensor> {
        let e = self.reader.embedding()?;
        e.prefetch(ids)?;
        let x = e.rows(ids)?.to_tensor()?;
        Ok(match self.cfg.embed_scale {
            Some(s) => (x * s)?,
            None => x,
        })
    }

    /// Runs this stage's layers on `x: [t, hidden]`, the next `t` positions,
    /// each as soon as its blocks have arrived.
    pub fn forward(&mut self, x: &Tensor) -> Result<Tensor> {
        let t = x.dim(0)?;
        let mut x = x.clone();
        for i in 0..self.weights.len() {
            self.layer(i)?;
            let layer = self.weights[i].as_ref().expect("loaded just above");
            let step = Step {
                cfg: &self.cfg,
                layer: self.layers.start + i,
                pos: self.pos,
            };
            x = layer.forward(&step, &x, &mut self.cache[i], &mut self.ropes)?;
        }
        self.pos += t;
        Ok(x)
    }

    /// Logits `[vocab]` of the last row of `x` (output role): final norm,
    /// then the resident lm_head.
    pub fn logits(&mut self, x: &Tensor) -> Result<Tensor> {
        let last = x.dim(0)? - 1;
        Ok(self.logits_of(x, last..last + 1)?.squeeze(0)?)
    }

    /// Logits `[rows, vocab]` of `rows` of `x` (output role): what
    /// perplexity scores.
    pub fn logits_of(&mut self, x: &Tensor, rows: Range<usize>) -> Result<Tensor> {
        if !self.serves_output() {
            return Err(DecodeError::Stages("an input stage has no lm_head".into()));
        }
        let norm = self.final_norm()?;
        let picked = x.narrow(0, rows.start, rows.len())?;
        let h = rms_norm(&picked, &norm, self.cfg.eps)?;
        let t = Instant::now();
        self.loaded.wait_lm_head()?;
        self.waited += t.elapsed();
        let logits = self.reader.lm_head()?.logits(&h)?;
        soft_cap(logits, self.cfg.logit_softcap)
    }

    /// How the embedding and lm_head roles this stage serves were resolved.
    pub fn resolutions(&self) -> Result<Vec<RoleResolution>> {
        let mut out = Vec::new();
        if self.serves_input() {
            let r = self.reader.embedding()?.resolution();
            out.push(RoleResolution {
                role: Role::TokenEmbd.as_str().into(),
                path: match r.kind() {
                    PathKind::Columnar => "columnar",
                    PathKind::Dense => "dense",
                    PathKind::Spectral => "spectral",
                }
                .into(),
                reason: r.reason(),
            });
        }
        if self.serves_output() {
            let r = self.reader.lm_head()?.resolution();
            let h = self.reader.knot().header().header();
            let tied = h.meta_bool(keys::TIE_WORD_EMBEDDINGS).unwrap_or(false);
            let source = match r.kind() {
                PathKind::Columnar => "pulled from a row file".to_owned(),
                _ => "pulled as its block".to_owned(),
            };
            out.push(RoleResolution {
                role: Role::LmHead.as_str().into(),
                path: "resident".into(),
                reason: format!(
                    "{}{source}, verified, and kept resident: {}",
                    if tied { "tied to the embedding; " } else { "" },
                    r.reason()
                ),
            });
        }
        Ok(out)
    }
}

/// The package's `config.json`; for a knot packed from a GGUF of an
/// architecture it derived none for, the error says which.
pub(crate) fn config_json(reader: &Reader) -> Result<bytes::Bytes> {
    let files = reader
        .knot()
        .header()
        .header()
        .package_file_names()
        .to_vec();
    if !files.iter().any(|f| f == "config.json") && files.iter().any(|f| f == "metadata.gguf") {
        let meta = reader.package_file("metadata.gguf")?;
        let arch = gkq_format::gguf::Gguf::parse(&meta)
            .ok()
            .and_then(|g| g.architecture().map(str::to_owned))
            .unwrap_or_else(|| "?".into());
        return Err(DecodeError::Config(format!(
            "the knot was packed from a GGUF of architecture {arch:?}, which gkq-decode does not run (it runs {}), so the package has no config.json: its hyper-parameters and tensor layout are not known here",
            crate::config::supported()
        )));
    }
    Ok(reader.package_file("config.json")?)
}

/// Memory a stage's pull may hold beyond its f32 weights: bytes in flight
/// and pulled but not yet converted.
const PULL_BUDGET: u64 = 256 << 20;

/// Positions a layer's KV cache holds before it grows (it doubles past them).
const CACHE_POSITIONS: usize = 512;

/// Empty KV caches for `layers` layers.
fn caches(layers: usize, kv: KvTypes) -> Vec<Cache> {
    (0..layers)
        .map(|_| Cache::new(CACHE_POSITIONS, kv))
        .collect()
}
