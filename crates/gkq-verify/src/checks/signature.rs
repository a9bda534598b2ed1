//! The `signature` check (`--trust-key`): the package directory against
//! its `model.sig` (FORMAT.md section 7c) as `model_signing verify` checks
//! it, every file, none missing, none extra, and the knot id when the
//! statement names one (a `model_signing`-made signature names none);
//! with `--url`, the published signature object too, against the knot id.

use gkq_format::sig::{self, SIGNATURE_NAME};

use super::Context;
use crate::report::CheckFindings;

/// The findings and the summary (who signed).
pub(crate) fn check(cx: &Context<'_>) -> (CheckFindings, String) {
    let mut acc = CheckFindings::default();
    let local = cx.dir.join(SIGNATURE_NAME);
    let summary = match gkq_sign::verify_package(&cx.dir, &cx.trusted) {
        Ok(r) => {
            format!(
                "{} files signed by key {}{}",
                r.files,
                r.signer,
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
        match http.prefix(&url, sig::MAX_SIGNATURE_LEN) {
            Err(e) => acc.fail(url, std::io::Error::other(e)),
            Ok(b) => {
                if let Err(e) = sig::open(&b, &cx.trusted).and_then(|s| s.check_knot(id)) {
                    acc.fail(url, e);
                }
            }
        }
    }
    (acc, summary)
}
