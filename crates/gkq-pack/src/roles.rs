//! Which tensor is the token embedding, which the lm_head, and whether they are tied.

use gkq_format::Role;

use crate::error::{PackError, Result};
use gkq_source::ModelConfig;
use gkq_source::{SourceModel, SourceTensor};

/// The decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RolePlan {
    /// Source tensor name of the token embedding.
    pub embed: String,
    /// Source tensor name of an untied lm_head.
    pub lm_head: Option<String>,
    /// lm_head is the embedding (recorded as an alias block).
    pub tied: bool,
    /// Name of the lm_head block in the knot (the alias when tied), or
    /// `None` for a model without an output projection (a bare encoder).
    pub lm_head_block: Option<String>,
}

fn candidates(src: &SourceModel, vocab: u64) -> Vec<String> {
    let mut c: Vec<String> = src
        .tensors
        .iter()
        .filter(|t| t.shape.len() == 2 && t.shape.first() == Some(&vocab))
        .map(|t| t.name.clone())
        .collect();
    c.sort();
    c
}

fn check_shape(cfg: &ModelConfig, src: &SourceModel, t: &SourceTensor, role: Role) -> Result<()> {
    let [rows, cols] = t.shape.as_slice() else {
        return Err(PackError::NotTwoD {
            path: src.file_of(t).path.clone(),
            role,
            tensor: t.name.clone(),
            shape: t.shape.clone(),
        });
    };
    if *rows == 0 || *cols == 0 {
        return Err(PackError::EmptyRole {
            path: src.file_of(t).path.clone(),
            role,
            tensor: t.name.clone(),
            shape: t.shape.clone(),
        });
    }
    let mismatch = |field: &'static str, config_value: u64| PackError::ShapeMismatch {
        config: cfg.path.clone(),
        field,
        config_value,
        tensor: t.name.clone(),
        shape: t.shape.clone(),
    };
    if *rows != cfg.vocab_size {
        return Err(mismatch("vocab_size", cfg.vocab_size));
    }
    if let Some(h) = cfg.hidden_size
        && h != *cols
    {
        return Err(mismatch("hidden_size", h));
    }
    Ok(())
}

/// Whether two tensors have the same dtype, shape and bytes (read in chunks).
fn identical(src: &SourceModel, a: &SourceTensor, b: &SourceTensor) -> Result<bool> {
    if a.dtype != b.dtype || a.shape != b.shape || a.len != b.len {
        return Ok(false);
    }
    let mut x = vec![0u8; 4 << 20];
    let mut y = vec![0u8; 4 << 20];
    let mut at = 0u64;
    while at < a.len {
        let n = (a.len - at).min(x.len() as u64) as usize;
        src.read(a, at, &mut x[..n])?;
        src.read(b, at, &mut y[..n])?;
        if x[..n] != y[..n] {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// The token embedding: the override, else the first of the architecture's
/// names.
fn find_embed<'s>(
    cfg: &ModelConfig,
    src: &'s SourceModel,
    embed_override: Option<&str>,
) -> Result<&'s SourceTensor> {
    let vocab = cfg.vocab_size;
    if let Some(name) = embed_override {
        return src.tensor(name).ok_or_else(|| PackError::UnknownTensor {
            flag: "embed-tensor",
            name: name.to_owned(),
            dir: src.dir.clone(),
        });
    }
    let undecided = |reason: String| PackError::RoleUndecided {
        role: Role::TokenEmbd,
        reason,
        vocab,
        candidates: candidates(src, vocab),
        flag: "embed-tensor",
    };
    let roles = cfg.roles.ok_or_else(|| {
        undecided(format!(
            "model_type {:?} / architecture {:?} is not an architecture the packer knows",
            cfg.model_type, cfg.architecture
        ))
    })?;
    roles
        .embed
        .iter()
        .find_map(|n| src.tensor(n))
        .ok_or_else(|| undecided(format!("none of {:?} is in the model", roles.embed)))
}

/// Decides the roles from the config's architecture (or the overrides).
pub(crate) fn decide(
    cfg: &ModelConfig,
    src: &SourceModel,
    embed_override: Option<&str>,
    lm_head_override: Option<&str>,
) -> Result<RolePlan> {
    let embed = find_embed(cfg, src, embed_override)?;
    check_shape(cfg, src, embed, Role::TokenEmbd)?;
    let lm_names: &[&str] = cfg.roles.map_or(&["lm_head.weight"], |r| r.lm_head);
    let lm_head = match lm_head_override {
        Some(name) => Some(src.tensor(name).ok_or_else(|| PackError::UnknownTensor {
            flag: "lm-head-tensor",
            name: name.to_owned(),
            dir: src.dir.clone(),
        })?),
        None => lm_names.iter().find_map(|n| src.tensor(n)),
    };
    let Some(lm) = lm_head.filter(|lm| lm.name != embed.name) else {
        // No lm_head tensor stored. The lm_head is the embedding only when the
        // architecture has one and ties it; a bare encoder (BertModel,
        // sentence-transformers) has no output projection at all.
        if !(cfg.tie_word_embeddings && cfg.has_lm_head()) {
            return Ok(RolePlan {
                embed: embed.name.clone(),
                lm_head: None,
                tied: false,
                lm_head_block: None,
            });
        }
        let lm_head_block = lm_names
            .first()
            .copied()
            .unwrap_or("lm_head.weight")
            .to_owned();
        return Ok(RolePlan {
            embed: embed.name.clone(),
            lm_head: None,
            tied: true,
            lm_head_block: Some(lm_head_block),
        });
    };
    check_shape(cfg, src, lm, Role::LmHead)?;
    if identical(src, embed, lm)? {
        return Ok(RolePlan {
            embed: embed.name.clone(),
            lm_head: None,
            tied: true,
            lm_head_block: Some(lm.name.clone()),
        });
    }
    if cfg.tie_word_embeddings && lm_head_override.is_none() {
        return Err(PackError::TieConflict {
            config: cfg.path.clone(),
            embed: embed.name.clone(),
            lm_head: lm.name.clone(),
        });
    }
    Ok(RolePlan {
        embed: embed.name.clone(),
        lm_head: Some(lm.name.clone()),
        tied: false,
        lm_head_block: Some(lm.name.clone()),
    })
}
