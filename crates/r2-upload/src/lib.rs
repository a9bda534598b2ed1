//! `r2-upload`: publish a packed GKQ model to Cloudflare R2 through the S3
//! API (any S3-compatible store works with an explicit endpoint).
//!
//! 1. [`prepare`] runs the local `gkq-verify` checks (knot structure and
//!    digests, row file sizes, digests and every row) and refuses a package
//!    that fails them; it lists the objects with their sha256, taken from the
//!    knot's descriptors for row files (not recomputed) and computed for the
//!    knot while verification runs.
//! 2. `gkq_store::s3::client` (gkq-store owns every S3 and HTTP client)
//!    builds an S3 client the way R2 needs it (see its docs: region `auto`,
//!    checksums `WhenRequired`).
//! 3. [`Uploader::publish`] sends row files first and the knot last; skips
//!    objects already present with the same length and `x-amz-meta-sha256`
//!    (so a re-run after a crash sends only what is missing); uses multipart
//!    uploads with equal, disk-streamed parts above the part size; aborts a
//!    failed multipart upload; and confirms each object with a HEAD.
//!
//! Objects carry `Content-Type: application/octet-stream` and
//! `Cache-Control: public, max-age=31536000, immutable`: a published prefix
//! is never rewritten (publish a new version under a new prefix).

mod error;
mod local;
mod source;
mod upload;

pub use error::{Result, UploadError};
pub use local::{LocalObject, knot_id, prepare};
pub use source::{Staged, stage};
pub use upload::{
    NoProgress, ObjectKind, ObjectReport, Progress, UPLOAD_RETRY, UploadOptions, Uploader,
    part_size,
};

/// Runs the `gkq-verify --url` checks against the public URL of the
/// published prefix (`BASE_URL/model.knot`, `BASE_URL/<row file>`).
pub fn verify_public(out_dir: &std::path::Path, url: &str) -> Result<()> {
    let mut opts = gkq_verify::VerifyOptions::new(out_dir);
    opts.url = Some(url.to_owned());
    let report = gkq_verify::verify(&opts).map_err(|e| UploadError::PublicCheck {
        url: url.to_owned(),
        failures: vec![gkq_format::error_chain(&e)],
    })?;
    if report.passed {
        return Ok(());
    }
    Err(UploadError::PublicCheck {
        url: url.to_owned(),
        failures: report.failure_lines(),
    })
}
