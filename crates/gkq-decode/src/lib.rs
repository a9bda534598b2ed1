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
mod model;

use std::ops::Range;
use std::time::Instant;

use candle_core::{D, Tensor};
use gkq_format::keys;
use gkq_reader::{NetStats, ReadPath, Reader, ReaderConfig, Roles};
use serde::Serialize;
use sha2::{Digest, Sha256};

pub use config::{Arch, Config};
pub use error::{DecodeError, Result};
use model::{Cache, Layer, Linear, layer_block_names, rms_norm, tensor_from_block};

/// Bytes a node fetched, per role (payload bytes, as the reader counts them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RoleBytes {
    /// Opening the knot: the header range, and the row file's HEAD.
    pub knot_header: u64,
    /// Embedding rows and their Merkle proofs (or the dense block on fallback).
    pub embedding_rows: u64,
    /// The lm_head matrix (0 for a stage without the output role).
    pub lm_head: u64,
    /// Every other block: norms and layers, and config.json.
    pub other_blocks: u64,
}

impl RoleBytes {
    fn add(&mut self, o: RoleBytes) {
        self.knot_header += o.knot_header;
        self.embedding_rows += o.embedding_rows;
        self.lm_head += o.lm_head;
        self.other_blocks += o.other_blocks;
    }

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

/// One pipeline stage: a reader and the layers it runs.
pub struct Stage {
    reader: Reader,
    cfg: Config,
    roles: StageRoles,
    layers: Range<usize>,
    weights: Vec<Layer>,
    norm: Option<Tensor>,
    cache: Vec<Cache>,
    pos: usize,
    bytes: RoleBytes,
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("roles", &self.roles)
            .field("layers", &self.layers)
            .finish_non_exhaustive()
    }
}

fn delta(after: NetStats, before: NetStats) -> u64 {
    after.since(&before).payload_bytes
}

impl Stage {
    /// Opens `location` (path or URL) for `roles` over `layers` (default:
    /// all of them), reads `config.json` from the package, and loads the
    /// blocks of its layers (and the final norm for the output role).
    pub fn open(
        location: &str,
        config: ReaderConfig,
        roles: StageRoles,
        layers: Option<Range<usize>>,
    ) -> Result<Stage> {
        let reader_roles = match roles {
            StageRoles::Input => Roles::INPUT,
            StageRoles::Output => Roles::OUTPUT,
            StageRoles::All => Roles::ALL,
        };
        let reader = Reader::open(location, config, reader_roles)?;
        let mut bytes = RoleBytes {
            knot_header: reader.net_stats().payload_bytes,
            ..RoleBytes::default()
        };
        let before = reader.net_stats();
        let cfg = Config::from_json(&reader.package_file("config.json")?)?;
        let layers = layers.unwrap_or(0..cfg.layers);
        if layers.start > layers.end || layers.end > cfg.layers {
            return Err(DecodeError::Stages(format!(
                "--layers {}..{} is outside the model's 0..{}",
                layers.start, layers.end, cfg.layers
            )));
        }
        let mut weights = Vec::with_capacity(layers.len());
        for l in layers.clone() {
            weights.push(load_layer(&reader, &cfg, l)?);
        }
        let norm = match roles {
            StageRoles::Input => None,
            _ => Some(load(&reader, "model.norm.weight", &[cfg.hidden])?),
        };
        bytes.other_blocks = delta(reader.net_stats(), before);
        Ok(Stage {
            cache: (0..weights.len()).map(|_| Cache::default()).collect(),
            reader,
            cfg,
            roles,
            layers,
            weights,
            norm,
            pos: 0,
            bytes,
        })
    }

    /// Forgets the KV caches and the position, for a new session through the
    /// same reader (whose row cache and resident lm_head stay warm).
    pub fn reset(&mut self) {
        self.cache = (0..self.weights.len()).map(|_| Cache::default()).collect();
        self.pos = 0;
        self.bytes = RoleBytes::default();
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The reader.
    pub fn reader(&self) -> &Reader {
        &self.reader
    }

    /// Bytes fetched so far, per role.
    pub fn bytes(&self) -> RoleBytes {
        self.bytes
    }

    fn serves_input(&self) -> bool {
        self.roles != StageRoles::Output
    }

    fn serves_output(&self) -> bool {
        self.roles != StageRoles::Input
    }

    /// Embedding rows of `ids`, `[t, hidden]` f32 (input role).
    pub fn embed(&mut self, ids: &[u32]) -> Result<Tensor> {
        let before = self.reader.net_stats();
        let ids: Vec<u64> = ids.iter().map(|&i| u64::from(i)).collect();
        let e = self.reader.embedding()?;
        e.prefetch(&ids)?;
        let x = e.rows(&ids)?.to_tensor()?;
        self.bytes.embedding_rows += delta(self.reader.net_stats(), before);
        Ok(x)
    }

    /// Runs this stage's layers on `x: [t, hidden]`, the next `t` positions.
    pub fn forward(&mut self, x: &Tensor) -> Result<Tensor> {
        let t = x.dim(0)?;
        let mut x = x.clone();
        for (layer, cache) in self.weights.iter().zip(&mut self.cache) {
            x = layer.forward(&self.cfg, &x, self.pos, cache)?;
        }
        self.pos += t;
        Ok(x)
    }

    /// Logits `[vocab]` of the last row of `x` (output role): final norm,
    /// then the resident lm_head.
    pub fn logits(&mut self, x: &Tensor) -> Result<Tensor> {
        let norm = self
            .norm
            .as_ref()
            .ok_or_else(|| DecodeError::Stages("an input stage has no lm_head".into()))?;
        let last = x.narrow(0, x.dim(0)? - 1, 1)?;
        let h = rms_norm(&last, norm, self.cfg.eps)?;
        let before = self.reader.net_stats();
        let logits = self.reader.lm_head()?.logits(&h)?;
        self.bytes.lm_head += delta(self.reader.net_stats(), before);
        Ok(logits.squeeze(0)?)
    }

    /// How the embedding and lm_head roles this stage serves were resolved.
    pub fn resolutions(&self) -> Result<Vec<RoleResolution>> {
        let mut out = Vec::new();
        if self.serves_input() {
            let r = self.reader.embedding()?.resolution();
            out.push(RoleResolution {
                role: "token_embd".into(),
                path: match r.path {
                    ReadPath::Columnar => "columnar",
                    ReadPath::Dense => "dense",
                    ReadPath::Spectral => "spectral",
                }
                .into(),
                reason: r.reason,
            });
        }
        if self.serves_output() {
            let h = self.reader.knot().header().header();
            let name = h.meta_str(keys::ROLE_LM_HEAD).unwrap_or("?").to_owned();
            let tied = h.meta_bool(keys::TIE_WORD_EMBEDDINGS).unwrap_or(false);
            out.push(RoleResolution {
                role: "lm_head".into(),
                path: "resident".into(),
                reason: if tied {
                    format!("{name} is tied to the embedding: the one matrix is pulled once, sha256-checked, and kept")
                } else {
                    format!("block {name} pulled once, sha256-checked, and kept resident")
                },
            });
        }
        Ok(out)
    }
}

/// Loads block `name` as f32, checking its shape.
fn load(reader: &Reader, name: &str, shape: &[usize]) -> Result<Tensor> {
    let (block, bytes) = reader.block_values(name).map_err(|e| match e {
        gkq_reader::ReaderError::Missing(m) => DecodeError::Weights(m),
        e => e.into(),
    })?;
    let have: Vec<usize> = block.shape.iter().map(|&d| d as usize).collect();
    if have != shape {
        return Err(DecodeError::Weights(format!(
            "block {name} has shape {have:?}, config.json implies {shape:?}"
        )));
    }
    tensor_from_block(&bytes, block.dtype, shape)
}

fn load_layer(reader: &Reader, cfg: &Config, l: usize) -> Result<Layer> {
    let n = layer_block_names(cfg, l);
    let (h, q, kv, i) = (
        cfg.hidden,
        cfg.heads * cfg.head_dim,
        cfg.kv_heads * cfg.head_dim,
        cfg.intermediate,
    );
    let bias = |k: usize, len: usize| -> Result<Option<Tensor>> {
        n.get(k).map(|name| load(reader, name, &[len])).transpose()
    };
    Ok(Layer {
        input_norm: load(reader, &n[0], &[h])?,
        q: Linear {
            w: load(reader, &n[1], &[q, h])?,
            b: bias(9, q)?,
        },
        k: Linear {
            w: load(reader, &n[2], &[kv, h])?,
            b: bias(10, kv)?,
        },
        v: Linear {
            w: load(reader, &n[3], &[kv, h])?,
            b: bias(11, kv)?,
        },
        o: Linear {
            w: load(reader, &n[4], &[h, q])?,
            b: None,
        },
        post_norm: load(reader, &n[5], &[h])?,
        gate: Linear {
            w: load(reader, &n[6], &[i, h])?,
            b: None,
        },
        up: Linear {
            w: load(reader, &n[7], &[i, h])?,
            b: None,
        },
        down: Linear {
            w: load(reader, &n[8], &[h, i])?,
            b: None,
        },
    })
}

/// The result of a decode.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Generation {
    /// The generated token ids.
    pub tokens: Vec<u32>,
    /// Hex SHA-256 of each step's logits (f32, little-endian): equal digests
    /// mean bit-identical logits.
    pub logits_sha256: Vec<String>,
    /// From the start of the prefill to the first generated token.
    pub time_to_first_token_ms: f64,
    /// Generated tokens after the first, per second.
    pub tokens_per_second: f64,
    /// Bytes fetched, per role, summed over the stages.
    pub bytes: RoleBytes,
    /// Bytes fetched by each stage, in chain order (one entry for one stage).
    pub stage_bytes: Vec<RoleBytes>,
    /// The resolution of each role.
    pub resolutions: Vec<RoleResolution>,
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
    let start = Instant::now();
    let mut tokens = Vec::with_capacity(max_new);
    let mut digests = Vec::with_capacity(max_new);
    let mut ttft = 0.0;
    let mut ids = prompt.to_vec();
    for n in 0..max_new {
        let logits = step(stages, &ids)?;
        digests.push(digest(&logits)?);
        let next = logits.argmax(D::Minus1)?.to_scalar::<u32>()?;
        if n == 0 {
            ttft = start.elapsed().as_secs_f64() * 1e3;
        }
        tokens.push(next);
        ids = vec![next];
    }
    let rest = start.elapsed().as_secs_f64() * 1e3 - ttft;
    let mut bytes = RoleBytes::default();
    let mut resolutions = Vec::new();
    for s in stages.iter() {
        bytes.add(s.bytes());
        resolutions.extend(s.resolutions()?);
    }
    let stage_bytes = stages.iter().map(Stage::bytes).collect();
    Ok(Generation {
        tokens,
        logits_sha256: digests,
        time_to_first_token_ms: ttft,
        tokens_per_second: if max_new > 1 && rest > 0.0 {
            (max_new - 1) as f64 / (rest / 1e3)
        } else {
            0.0
        },
        bytes,
        stage_bytes,
        resolutions,
    })
}

/// Token ids of `text` with the `tokenizer.json` bytes given.
pub fn tokenize(tokenizer_json: &[u8], text: &str) -> Result<Vec<u32>> {
    let t = tokenizers::Tokenizer::from_bytes(tokenizer_json)
        .map_err(|e| DecodeError::Tokenizer(e.to_string()))?;
    let enc = t
        .encode(text, false)
        .map_err(|e| DecodeError::Tokenizer(e.to_string()))?;
    Ok(enc.get_ids().to_vec())
}
