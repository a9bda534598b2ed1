//! The `signature` check (`--trust-key`): the package directory against
//! its `model.sig` (FORMAT.md section 7c) as `model_signing verify` checks
//! it, every file, none missing, none extra, and the knot id when the
//! statement names one (a `model_signing`-made signature names none);
//! with `--url`, the published signature object too, against the knot id.

use gkq_format::sig::{self, SIGNATURE_NAME};

use super::Context;
use crate::report::CheckFindings;

/// The package asked for (FORMAT.md 7c): `--package`, else the path the
/// package is published under (`--url`, or the URL checked), else its
/// directory.
fn asked(cx: &Context<'_>) -> sig::Asked {
    let at = match &cx.opts.url {
        Some(base) => gkq_store::url::join(base, gkq_format::KNOT_NAME),
        None => cx.dir.display().to_string(),
    };
    gkq_store::url::asked(&at, cx.opts.package.as_deref())
}

/// The findings and the summary (who signed, and the package it names).
pub(crate) fn check(cx: &Context<'_>) -> (CheckFindings, String) {
    let mut acc = CheckFindings::default();
    let local = cx.dir.join(SIGNATURE_NAME);
    let asked = asked(cx);
    let summary = match gkq_sign::verify_package(&cx.dir, &cx.trusted) {
        Ok(r) => {
            let knot = r.knot_id.clone().unwrap_or_default();
            if let Err(e) = asked.check(r.package.as_deref(), None, &knot) {
                acc.fail(local.display().to_string(), e);
            }
            format!(
                "{} files signed by key {}{}{}",
                r.files,
                r.signer,
                r.package
                    .as_ref()
                    .map_or_else(String::new, |p| format!(" as package {p:?}")),
                r.knot_id.map_or(
                    " (a model_signing signature: no knot id)".to_owned(),
                    |id| { format!(", knot {id}") }
                )
            )
        }
        Err(e) => {
            acc.fail(local.display().to_string(), e);
            "the package against model.sig".to_owned()
        }
    };
    if let (Some(base), Some(http)) = (&cx.opts.url, &cx.http) {
        let url = gkq_store::url::join(base, SIGNATURE_NAME);
        let id = cx.knot.header().id();
        match http.signature(&gkq_store::url::join(base, gkq_format::KNOT_NAME)) {
            Err(e) => acc.fail(url, std::io::Error::other(e)),
            Ok(None) => acc.fail(
                url.clone(),
                std::io::Error::other(format!("{url}: no signature object is published")),
            ),
            Ok(Some(b)) => {
                let checked = sig::open(&b, &cx.trusted).and_then(|s| {
                    s.check_knot(id)
                        .and_then(|()| s.check_package(&asked, None))
                });
                if let Err(e) = checked {
                    acc.fail(url, e);
                }
            }
        }
    }
    (acc, summary)
}
