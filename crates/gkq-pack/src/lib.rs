//! `gkq-pack`: a Hugging Face model directory → a GKQ v2 knot plus the
//! row-aligned columnar files of its token embedding and lm_head.
//!
//! One pass over the source: each tensor is read in bounded chunks with
//! positioned reads, cast (in parallel, with rayon) where its role asks for
//! it, hashed while it is written, and fed to the source file's own hasher
//! on the way, so source digests cost no second read. Output is atomic (see
//! `output`) and deterministic.
//!
//! The stages, one module each, dependencies pointing down only:
//! `options` → `roles` (which tensor plays which role) → `spectral` (the
//! `--spectral` pre-pass) → `types` (the stored type of each tensor:
//! `--quant`) → `plan` (the header) → `run` (the pass, with
//! `rows` for the row files, `quantize` for rows converted to a block type,
//! and `companions` for the package files) →
//! `output` (the atomic commit); `report` is what comes back.

mod analyze;
mod companions;
mod error;
mod options;
mod output;
mod plan;
mod prefetch;
mod presets;
mod quantize;
mod report;
mod roles;
mod rows;
mod run;
mod spectral;
mod svd;
mod text;
mod types;
mod warm;
mod writeback;

use std::time::Instant;

use gkq_source::{ModelConfig, SourceModel, hub};
use rayon::prelude::*;

pub use analyze::{AnalyzeReport, AtRank, ENERGIES, RANKS, TensorAnalysis, analyze};
pub use error::{BadValue, PackError, Result};
pub use gkq_format::progress::{NoProgress, Progress};
pub use options::WarmOptions;
pub use options::{COMPANION_FILES, PackOptions, TOOL};
/// The points of the commit a test can stop a run at ([`set_commit_hook`]).
#[doc(hidden)]
pub use output::{CommitStep, set_commit_hook};
pub use presets::{Mix, parse_quant, preset_names};
pub use report::WarmSetReport;
pub use report::{
    CastSummary, ColumnarReport, CompanionReport, FileReport, KnotFile, PackReport, QuantReport,
};
pub use spectral::{SpectralReport, SpectralSpec, Target};
pub use text::{analysis_text, text};
pub use types::{Fallback, QuantOptions};

use companions::{companion_reports, copy_companion, find_companions};
use error::IoContext;
use options::check_dtypes;
use output::{Output, check_out_outside};
use run::Run;

/// The model's config: `config.json`, or for a GGUF what its metadata and
/// tensor names say.
pub(crate) fn model_config(located: &hub::Located, src: &SourceModel) -> Result<ModelConfig> {
    match &src.gguf {
        Some(g) => {
            let embed = src.tensor("token_embd.weight").map(|t| t.shape.as_slice());
            let tied = src.tensor("output.weight").is_none();
            Ok(g.model_config(&located.source, embed, tied))
        }
        None => Ok(ModelConfig::read(&located.dir)?),
    }
}

/// The `--dtype` list, checked, once the output directory may be written.
fn check_options(opts: &PackOptions) -> Result<Vec<gkq_format::DType>> {
    if opts.out_dir.exists() && !opts.force {
        return Err(PackError::OutDirExists {
            path: opts.out_dir.clone(),
        });
    }
    check_dtypes(&opts.dtypes)
}

/// Packs `opts.model_dir` into `opts.out_dir`.
pub fn pack(opts: &PackOptions, progress: &dyn Progress) -> Result<PackReport> {
    let started = Instant::now();
    let dtypes = check_options(opts)?;
    let located = hub::locate(&opts.model_dir)?;
    check_out_outside(&located.source, &opts.out_dir)?;
    let src = SourceModel::open(&located.source)?;
    let cfg = model_config(&located, &src)?;
    let model_id = opts.model_id.clone().or(located.model_id);
    let revision = opts.revision.clone().or(located.revision);
    let roles = roles::decide(
        &cfg,
        &src,
        opts.embed_tensor.as_deref(),
        opts.lm_head_tensor.as_deref(),
    )?;
    let types = types::decide(&opts.quant, &src, &roles, cfg.arch)?;
    let mut companions = find_companions(&located.dir)?;
    companions::gguf_companions(&src, &roles, &mut companions)?;
    let factored = spectral::factor_all(&src, &roles, &opts.spectral)?;
    let mut header = plan::plan(
        &cfg,
        &src,
        &roles,
        (&dtypes, &types, opts.lm_head_rows),
        (model_id.as_deref(), revision.as_deref()),
        &companions,
        &factored,
    )?;
    let warm = derived_objects(opts, &mut header, (&src, &roles), &companions)?;
    let (spectral_reports, spectral_payloads): (Vec<_>, Vec<_>) = factored
        .into_iter()
        .map(|f| (f.report, (f.block.name, f.payload)))
        .unzip();

    let mut out = Output::prepare(&opts.out_dir, opts.force)?;
    let mut companion_files = Vec::new();
    for c in &companions {
        companion_files.push(copy_companion(&mut out, c)?);
    }
    let mut run = Run::start(opts, progress, &mut out, header, &roles.embed, &src)?;
    run.spectral = spectral_payloads.into_iter().collect();
    run.tensors(&src)?;
    let done = run.finish(&mut out)?;
    // fsync every file before the commit, several at once
    done.files
        .par_iter()
        .chain(companion_files.par_iter())
        .try_for_each(|(f, p)| f.sync_all().at(p))?;
    let knot_bytes = std::fs::metadata(&done.knot_path)
        .at(&done.knot_path)?
        .len();
    let stale_signature = stale_signature(&mut out, &done.knot_id);
    out.commit()?;
    Ok(PackReport {
        knot_id: done.knot_id,
        knot: KnotFile {
            path: opts.out_dir.join(gkq_format::KNOT_NAME),
            bytes: knot_bytes,
        },
        columnar: done.columnar,
        companions: companion_reports(&companions, &opts.out_dir),
        tied: roles.tied,
        tensors: done.tensors,
        source_bytes: src.total_bytes(),
        seconds: started.elapsed().as_secs_f64(),
        casts: done.casts,
        quantized: done.quantized,
        fallbacks: types.fallbacks,
        spectral: spectral_reports,
        architecture: cfg.architecture,
        token_embd: roles.embed,
        lm_head: roles.lm_head_block,
        model_id,
        revision,
        peak_rss_bytes: gkq_cli::peak_rss_bytes(),
        warm,
        stale_signature,
    })
}

/// FORMAT.md 7e: each block with a row file of its own dtype is stored
/// there alone, and that row file, when the plan gives it a runs object,
/// takes the runs object's layout instead (its records inline).
fn one_copy(header: &mut gkq_format::Header) {
    use gkq_format::keys::COLUMNAR_RUNS;
    let mut runs = header.meta_list(COLUMNAR_RUNS).unwrap_or_default().to_vec();
    for b in &mut header.blocks {
        let dtype = b.dtype;
        let Some(home) = b.columnar.iter_mut().find(|d| d.dtype == dtype) else {
            continue;
        };
        if let Some(at) = runs.iter().position(|r| *r == home.object) {
            runs.remove(at);
            home.flags |= gkq_format::INLINE_PROOF;
            home.byte_len = home.rows.saturating_mul(home.stride());
        }
        b.flags |= gkq_format::IN_ROW_FILE;
    }
    match runs.is_empty() {
        true => header.metadata.remove(COLUMNAR_RUNS),
        false => header
            .metadata
            .insert(COLUMNAR_RUNS.into(), gkq_format::Value::StrList(runs)),
    };
}

/// A `model.sig` in the directory a package replaces signs the old knot:
/// it is not carried into the new package (a node would refuse the
/// package), unless the new knot is the old one. Whether one was dropped.
fn stale_signature(out: &mut output::Output, new_id: &str) -> bool {
    let same = out.old_knot_id().is_some_and(|id| id.to_string() == new_id);
    !same && out.leave_behind(gkq_format::sig::SIGNATURE_NAME)
}

/// The objects beside the row files that the plan lists: no runs objects
/// with `--no-runs`, and warm objects with a warm set (`opts.warm`, for the
/// embedding `roles.embed`, tokenized with the source's `tokenizer.json`
/// when it has one), whose report is returned.
fn derived_objects(
    opts: &PackOptions,
    header: &mut gkq_format::Header,
    (src, roles): (&SourceModel, &roles::RolePlan),
    companions: &[companions::Companion],
) -> Result<Option<WarmSetReport>> {
    if !opts.runs {
        header.metadata.remove(gkq_format::keys::COLUMNAR_RUNS);
    }
    if opts.one_copy {
        one_copy(header);
    }
    let vocab = src
        .tensor(&roles.embed)
        .and_then(|t| t.shape.first().copied())
        .unwrap_or(0);
    let json = companions
        .iter()
        .find(|c| c.name == "tokenizer.json")
        .map(|c| c.path.as_path());
    // a GGUF carries its tokenizer in its metadata
    let gguf = src.gguf.as_ref().map(|g| g.metadata_file());
    let tokenizer = warm::SourceTokenizer {
        json,
        gguf: gguf.as_deref(),
    };
    let warm = warm::decide(&opts.warm, tokenizer, vocab)?;
    Ok(warm.map(|(ids, report)| {
        warm::list(header, &roles.embed, &ids);
        report
    }))
}
