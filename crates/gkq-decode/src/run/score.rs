//! `--perplexity` and `--kl-divergence`: a text scored as llama-perplexity
//! scores it, one line (or one JSON object) as its final estimate; with
//! `--kl-divergence-base FILE` the base run's log-probabilities written to
//! FILE, or a second run compared with them (`gkq_decode::kl_divergence`).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{Out, RunOptions, write_err};
use gkq_decode::{DecodeError, KlDivergence, Result, Stage};

fn usage(m: &str) -> DecodeError {
    DecodeError::Usage(m.into())
}

/// `--perplexity`: the text of the prompt scored; with
/// `--kl-divergence-base`, the file written whole or not at all.
pub(crate) fn perplexity(
    o: &RunOptions,
    stage: &mut Stage,
    n_ctx: usize,
    out: &mut Out<'_>,
) -> Result<()> {
    let super::Prompt::Text(text) = &o.prompt else {
        return Err(usage(
            "--perplexity scores a text: give it with -f FILE (or -p TEXT)",
        ));
    };
    let t = super::prompt::tokenizer(o, stage)?;
    let tokens = t.encode(text)?;
    let n_ctx = match n_ctx {
        0 => stage.config().position_limit(),
        n => n,
    };
    let run = (t.added_bos(), o.ubatch);
    let p = match &o.kl_base {
        None => gkq_decode::perplexity(stage, &tokens, n_ctx, run, None)?,
        Some(path) => {
            let mut file = temp_beside(path)?;
            let mut w = std::io::BufWriter::new(file.as_file_mut());
            let p = gkq_decode::perplexity(stage, &tokens, n_ctx, run, Some(&mut w))?;
            w.flush().map_err(io(path))?;
            drop(w);
            file.persist(path).map_err(|e| io(path)(e.error))?;
            p
        }
    };
    if o.json {
        let v = serde_json::to_value(&p).map_err(|e| usage(&e.to_string()))?;
        return writeln!(out.stdout, "{v}").map_err(write_err);
    }
    writeln!(
        out.stdout,
        "Final estimate: PPL = {:.4} +/- {:.5} ({} chunks of {} tokens, {} tokens scored, {} in the text)",
        p.perplexity, p.stderr, p.chunks, p.n_ctx, p.scored, p.tokens
    )
    .map_err(write_err)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DecodeError + '_ {
    move |error| DecodeError::Io {
        path: path.to_owned(),
        error,
    }
}

/// A temporary file in `path`'s directory, renamed over it when the run
/// succeeds and removed when it does not.
fn temp_beside(path: &Path) -> Result<tempfile::NamedTempFile> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    tempfile::Builder::new()
        .prefix(".kld-")
        .permissions(std::fs::Permissions::from_mode(0o644))
        .tempfile_in(dir)
        .map_err(io(path))
}

/// `--kl-divergence`: the base file against this model, over its tokens
/// (the text of -f or -p, if given, is not used: the file holds them).
pub(crate) fn kl_divergence(o: &RunOptions, stage: &mut Stage, out: &mut Out<'_>) -> Result<()> {
    let Some(path) = &o.kl_base else {
        return Err(usage(
            "--kl-divergence compares with a base file: give it with --kl-divergence-base FILE",
        ));
    };
    let t = super::prompt::tokenizer(o, stage)?;
    let k = gkq_decode::kl_divergence(stage, path, (t.added_bos(), o.ubatch))?;
    if o.json {
        let v = serde_json::to_value(&k).map_err(|e| usage(&e.to_string()))?;
        return writeln!(out.stdout, "{v}").map_err(write_err);
    }
    out.stdout
        .write_all(kl_text(&k).as_bytes())
        .map_err(write_err)
}

/// llama-perplexity's summary lines for `k`.
fn kl_text(k: &KlDivergence) -> String {
    format!(
        "Mean PPL(Q)                   : {:10.6}\n\
         Mean PPL(base)                : {:10.6}\n\
         Mean ln(PPL(Q)/PPL(base))     : {:10.6}\n\
         Mean    KLD: {:10.6} ± {:10.6}\n\
         Maximum KLD: {:10.6}\n\
         99.0%   KLD: {:10.6}\n\
         Median  KLD: {:10.6}\n\
         RMS Δp    : {:6.3} %\n\
         Same top p: {:6.3} %\n\
         ({} chunks of {} tokens, {} positions scored)\n",
        k.perplexity,
        k.perplexity_base,
        k.ln_ratio,
        k.kld,
        k.kld_stderr,
        k.kld_max,
        k.kld_p99,
        k.kld_median,
        100.0 * k.rms_dp,
        100.0 * k.same_top,
        k.chunks,
        k.n_ctx,
        k.scored
    )
}
