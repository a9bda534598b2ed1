//! `gkq-decode`: a greedy decode of a Qwen2, Llama or Mistral knot, local or
//! remote, through `gkq-reader`: the token embedding from the reader's
//! [`gkq_reader::Embedding`] (columnar rows, each verified, when resolved;
//! else the dense block), the lm_head from the reader's resident
//! [`gkq_reader::LmHead`], every other block from the knot, widened to f32.
//!
//! A [`Stage`] serves the input role, the output role or both, over a range
//! of layers: a pipeline-split fabric chains them ([`generate`] takes the
//! stages in order). The architecture's hyper-parameters come from the
//! package's `config.json`, which the knot pins by digest
//! (`package.files`), so a remote node needs nothing but the knot URL.
//!
//! The forward pass is written on candle-core ops rather than taken from
//! candle-transformers: its models own their embedding and lm_head, while
//! here those two come from the reader, and a stage runs only some layers.

mod config;
mod error;
mod load;
mod model;

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{D, Tensor};
use gkq_format::{Role, keys};
use gkq_reader::{PathKind, PullPlan, Reader, ReaderConfig, Serve};
use serde::Serialize;
use sha2::{Digest, Sha256};

pub use config::{Config, DEFAULT_MAX_POSITIONS, DecoderFamily, SUPPORTED};
pub use error::{DecodeError, Result};
use model::{Cache, Layer, layer_block_names, rms_norm};

gkq_store::stats! {
    /// Bytes a node fetched, per role (payload bytes, as the reader counts them).
    pub struct RoleBytes {
        /// Opening the knot: the header range, and the row file's HEAD.
        pub knot_header,
        /// Embedding rows and their Merkle proofs (or the dense block on fallback).
        pub embedding_rows,
        /// The lm_head matrix (0 for a stage without the output role).
        pub lm_head,
        /// Every other block: norms and layers, and config.json.
        pub other_blocks,
    }
}

impl RoleBytes {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.knot_header + self.embedding_rows + self.lm_head + self.other_blocks
    }
}

/// How a role was resolved, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RoleResolution {
    /// `token_embd` or `lm_head`.
    pub role: String,
    /// `columnar`, `dense`, `spectral` or `resident`.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// What a stage serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageRoles {
    /// Embedding lookups and the first layers.
    Input,
    /// The last layers, the final norm and lm_head.
    Output,
    /// The whole model.
    All,
}

/// One pipeline stage: a reader and the layers it runs, loaded in the
/// background in first-use order (the `load` module).
pub struct Stage {
    reader: Reader,
    cfg: Config,
    roles: StageRoles,
    layers: Range<usize>,
    weights: Vec<Option<Layer>>,
    norm: Option<Tensor>,
    loaded: Arc<load::Loaded>,
    cache: Vec<Cache>,
    pos: usize,
    opened: Instant,
    header_bytes: u64,
    /// What [`Stage::bytes`] counts from (set by [`Stage::reset`]).
    base: RoleBytes,
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
            cache: (0..layers.len()).map(|_| Cache::default()).collect(),
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
        })
    }

    /// Forgets the KV caches and the position, for a new session through the
    /// same reader (whose row cache and resident lm_head stay warm).
    pub fn reset(&mut self) {
        self.cache = (0..self.weights.len()).map(|_| Cache::default()).collect();
        self.pos = 0;
        self.base = self.total_bytes();
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
            self.loaded.wait_lm_head()?;
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

    fn serves_input(&self) -> bool {
        self.roles != StageRoles::Output
    }

    fn serves_output(&self) -> bool {
        self.roles != StageRoles::Input
    }

    fn layer(&mut self, i: usize) -> Result<()> {
        if self.weights[i].is_none() {
            self.weights[i] = Some(self.loaded.take_layer(i)?);
        }
        Ok(())
    }

    fn final_norm(&mut self) -> Result<Tensor> {
        if self.norm.is_none() {
            self.norm = Some(self.loaded.take_norm()?);
        }
        self.norm
            .clone()
            .ok_or_else(|| DecodeError::Stages("an input stage has no final norm".into()))
    }

    /// Embedding rows of `ids`, `[t, hidden]` f32 (input role).
    pub fn embed(&mut self, ids: &[u32]) -> Result<Tensor> {
        let e = self.reader.embedding()?;
        e.prefetch(ids)?;
        Ok(e.rows(ids)?.to_tensor()?)
    }

    /// Runs this stage's layers on `x: [t, hidden]`, the next `t` positions,
    /// each as soon as its blocks have arrived.
    pub fn forward(&mut self, x: &Tensor) -> Result<Tensor> {
        let t = x.dim(0)?;
        let mut x = x.clone();
        for i in 0..self.weights.len() {
            self.layer(i)?;
            let layer = self.weights[i].as_ref().expect("loaded just above");
            x = layer.forward(&self.cfg, &x, self.pos, &mut self.cache[i])?;
        }
        self.pos += t;
        Ok(x)
    }

    /// Logits `[vocab]` of the last row of `x` (output role): final norm,
    /// then the resident lm_head.
    pub fn logits(&mut self, x: &Tensor) -> Result<Tensor> {
        if !self.serves_output() {
            return Err(DecodeError::Stages("an input stage has no lm_head".into()));
        }
        let norm = self.final_norm()?;
        let last = x.narrow(0, x.dim(0)? - 1, 1)?;
        let h = rms_norm(&last, &norm, self.cfg.eps)?;
        self.loaded.wait_lm_head()?;
        let logits = self.reader.lm_head()?.logits(&h)?;
        Ok(logits.squeeze(0)?)
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
fn config_json(reader: &Reader) -> Result<bytes::Bytes> {
    let files = reader
        .knot()
        .header()
        .header()
        .meta_list(gkq_format::keys::PACKAGE_FILES)
        .unwrap_or_default()
        .to_vec();
    if !files.iter().any(|f| f == "config.json") && files.iter().any(|f| f == "metadata.gguf") {
        let meta = reader.package_file("metadata.gguf")?;
        let arch = gkq_format::gguf::Gguf::parse(&meta)
            .ok()
            .and_then(|g| g.architecture().map(str::to_owned))
            .unwrap_or_else(|| "?".into());
        return Err(DecodeError::Config(format!(
            "the knot was packed from a GGUF of architecture {arch:?}, which gkq-decode does not run (it runs {}), so the package has no config.json: its hyper-parameters and tensor layout are not known here",
            config::SUPPORTED
        )));
    }
    Ok(reader.package_file("config.json")?)
}

/// Memory a stage's pull may hold beyond its f32 weights: bytes in flight
/// and pulled but not yet converted.
const PULL_BUDGET: u64 = 256 << 20;

/// The result of a decode.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Generation {
    /// The generated token ids.
    pub tokens: Vec<u32>,
    /// Hex SHA-256 of each step's logits (f32, little-endian): equal digests
    /// mean bit-identical logits.
    pub logits_sha256: Vec<String>,
    /// From the first stage's `Stage::open` (which opens the reader) to the
    /// first generated token: the load, or as much of it as the first
    /// forward pass had to wait for, and the prefill.
    pub time_to_first_token_ms: f64,
    /// From the first stage's open until every stage had all its blocks
    /// (downloaded and verified, or read from the cache).
    pub load_ms: f64,
    /// From the start of the prefill to the first generated token.
    pub prefill_ms: f64,
    /// When the first stage was opened (what the times above count from).
    #[serde(skip)]
    pub opened: Instant,
    /// From each stage's open until all its blocks had arrived, in chain order.
    pub stage_load_ms: Vec<f64>,
    /// The knot id of the model (what `--knot-id` pins).
    pub knot_id: String,
    /// Generated tokens after the first, per second.
    pub tokens_per_second: f64,
    /// Bytes fetched, per role, summed over the stages.
    pub bytes: RoleBytes,
    /// Bytes fetched by each stage, in chain order (one entry for one stage).
    pub stage_bytes: Vec<RoleBytes>,
    /// The resolution of each role.
    pub resolutions: Vec<RoleResolution>,
    /// The logits of the first step (after the prompt), for `--logits-out`.
    #[serde(skip)]
    pub first_logits: Vec<f32>,
    /// What `--warm` did on the input stage (the warm object, FORMAT.md 7d).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm: Option<gkq_reader::WarmReport>,
}

fn digest(logits: &Tensor) -> Result<String> {
    let v: Vec<f32> = logits.to_vec1()?;
    let mut h = Sha256::new();
    for x in v {
        h.update(x.to_le_bytes());
    }
    Ok(gkq_format::hex(&h.finalize()))
}

/// One forward of `ids` through the chain: embedding in the first stage,
/// layers in every stage, logits in the last.
fn step(stages: &mut [Stage], ids: &[u32]) -> Result<Tensor> {
    let mut x = stages[0].embed(ids)?;
    for s in stages.iter_mut() {
        x = s.forward(&x)?;
    }
    let last = stages.len() - 1;
    stages[last].logits(&x)
}

/// Checks that `stages` form one model: input first, output last, the
/// layers contiguous from 0 to the end.
fn check_chain(stages: &[Stage]) -> Result<()> {
    let (Some(first), Some(last)) = (stages.first(), stages.last()) else {
        return Err(DecodeError::Stages("no stage".into()));
    };
    if !first.serves_input() || !last.serves_output() {
        return Err(DecodeError::Stages(
            "the first stage must serve the input role and the last the output role".into(),
        ));
    }
    let mut next = 0;
    for s in stages {
        if s.layers.start != next {
            return Err(DecodeError::Stages(format!(
                "layers must be contiguous: a stage starts at {} after {next}",
                s.layers.start
            )));
        }
        next = s.layers.end;
    }
    if next != first.cfg.layers {
        return Err(DecodeError::Stages(format!(
            "the stages run layers 0..{next} of {}",
            first.cfg.layers
        )));
    }
    Ok(())
}

/// Greedy decoding of `max_new` tokens after `prompt` through `stages`
/// (one stage with [`StageRoles::All`], or an input stage, any middle
/// stages, and an output stage).
pub fn generate(stages: &mut [Stage], prompt: &[u32], max_new: usize) -> Result<Generation> {
    check_chain(stages)?;
    if prompt.is_empty() {
        return Err(DecodeError::Stages("the prompt has no tokens".into()));
    }
    let limit = stages[0].cfg.position_limit();
    if prompt.len().saturating_add(max_new) > limit {
        return Err(DecodeError::Usage(format!(
            "--max-new-tokens {max_new}: the prompt ({} tokens) and the new tokens must fit the model's {limit} positions (max_position_embeddings)",
            prompt.len()
        )));
    }
    let opened = stages
        .iter()
        .map(Stage::opened)
        .min()
        .unwrap_or_else(Instant::now);
    let start = Instant::now();
    // grown as tokens come: max_position_embeddings is the publisher's word
    let mut tokens = Vec::with_capacity(max_new.min(1 << 12));
    let mut digests = Vec::with_capacity(max_new.min(1 << 12));
    let mut ttft = 0.0;
    let mut prefill = 0.0;
    let mut first_logits = Vec::new();
    let mut ids = prompt.to_vec();
    for n in 0..max_new {
        let logits = step(stages, &ids)?;
        digests.push(digest(&logits)?);
        let next = logits.argmax(D::Minus1)?.to_scalar::<u32>()?;
        if n == 0 {
            prefill = start.elapsed().as_secs_f64() * 1e3;
            ttft = opened.elapsed().as_secs_f64() * 1e3;
            first_logits = logits.to_vec1()?;
        }
        tokens.push(next);
        ids = vec![next];
    }
    let rest = start.elapsed().as_secs_f64() * 1e3 - prefill;
    let mut load_ms = 0.0f64;
    let mut stage_load_ms = Vec::new();
    for s in stages.iter_mut() {
        let done = s.wait_loaded()?;
        load_ms = load_ms.max(done.duration_since(opened).as_secs_f64() * 1e3);
        stage_load_ms.push(done.duration_since(s.opened()).as_secs_f64() * 1e3);
    }
    let mut bytes = RoleBytes::default();
    let mut resolutions = Vec::new();
    for s in stages.iter() {
        bytes = bytes.plus(&s.bytes());
        resolutions.extend(s.resolutions()?);
    }
    let stage_bytes = stages.iter().map(Stage::bytes).collect();
    Ok(Generation {
        tokens,
        logits_sha256: digests,
        time_to_first_token_ms: ttft,
        load_ms,
        prefill_ms: prefill,
        opened,
        stage_load_ms,
        knot_id: stages[0].reader.knot_id(),
        tokens_per_second: if max_new > 1 && rest > 0.0 {
            (max_new - 1) as f64 / (rest / 1e3)
        } else {
            0.0
        },
        bytes,
        stage_bytes,
        resolutions,
        first_logits,
        warm: stages[0]
            .reader
            .embedding()
            .ok()
            .and_then(|e| e.warm_report()),
    })
}

/// Token ids of `text` with the `tokenizer.json` bytes given, for a model
/// of `vocab` rows, as every tool tokenizes (`gkq_text`: padding and
/// truncation off, special tokens as the tokenizer adds them).
pub fn tokenize(tokenizer_json: &[u8], vocab: u64, text: &str) -> Result<Vec<u32>> {
    let t = gkq_text::Tokenizer::from_bytes(tokenizer_json, vocab)?;
    Ok(t.encode(text)?)
}
