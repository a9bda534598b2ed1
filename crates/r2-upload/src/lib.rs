//! `r2-upload`: publish a packed GKQ model to Cloudflare R2 through the S3
//! API (any S3-compatible store works with an explicit endpoint).
//!
//! 1. [`prepare`] runs the local `gkq-verify` checks (knot structure and
//!    digests, row file sizes, digests and every row) and refuses a package
//!    that fails them; it lists the objects with their sha256, taken from the
//!    knot's descriptors for row files (not recomputed) and computed for the
//!    knot while verification runs.
//! 2. [`client`] (from `gkq-store`, which owns every S3 and HTTP client)
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

pub use error::{Result, UploadError};
pub use gkq_store::StoreError;
pub use gkq_store::s3::{Endpoint, client, credentials, endpoint};
pub use gkq_store::upload::{Kind, LocalObject};
pub use local::{knot_id, prepare};

/// An error and its causes on one line, `a: b: c`.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// Runs the `gkq-verify --url` checks against the public URL of the
/// published prefix (`BASE_URL/model.knot`, `BASE_URL/<row file>`).
pub fn verify_public(out_dir: &std::path::Path, url: &str) -> Result<()> {
    let mut opts = gkq_verify::VerifyOptions::new(out_dir);
    opts.url = Some(url.to_owned());
    let report = gkq_verify::verify(&opts).map_err(|e| UploadError::PublicCheck {
        url: url.to_owned(),
        failures: vec![chain(&e)],
    })?;
    if report.passed {
        return Ok(());
    }
    Err(UploadError::PublicCheck {
        url: url.to_owned(),
        failures: local::failures(&report),
    })
}

// what the binary and an embedding publisher call; the rest of the
// engine (part limits, headers) is gkq_store::upload's
pub use gkq_store::upload::{NoProgress, Progress, UploadOptions, Uploader, part_size};
