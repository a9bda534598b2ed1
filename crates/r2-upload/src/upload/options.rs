//! An upload's settings: the part sizes S3 and R2 accept, the parts in
//! flight, the retry policy, and whether a published object may be replaced.

use gkq_store::RetryPolicy;

use crate::error::{Result, UploadError};

/// Smallest part R2 and S3 accept (all but the last).
pub(crate) const MIN_PART: u64 = 5 << 20;
/// Most parts per upload.
pub(crate) const MAX_PARTS: u64 = 10_000;
/// Largest part.
pub(crate) const MAX_PART: u64 = 5 << 30;
/// Part size when none is asked for.
pub(crate) const DEFAULT_PART: u64 = 64 << 20;

/// The part size for a file of `size` bytes: the requested size (default
/// 64 MiB), at least 5 MiB, and large enough for at most 10,000 parts,
/// rounded up to a whole MiB.
pub fn part_size(size: u64, requested: Option<u64>) -> Result<u64> {
    let mib = 1u64 << 20;
    let need = size.div_ceil(MAX_PARTS).div_ceil(mib) * mib;
    let p = requested.unwrap_or(DEFAULT_PART).max(MIN_PART).max(need);
    if p > MAX_PART {
        return Err(UploadError::Options(format!(
            "{size} bytes need parts of {p} bytes, over the 5 GiB limit"
        )));
    }
    Ok(p)
}

/// The uploader's retry policy by default: 3 attempts, backoff from 200 ms.
pub const UPLOAD_RETRY: RetryPolicy = RetryPolicy {
    attempts: 3,
    backoff: std::time::Duration::from_millis(200),
    hedge: gkq_store::retry::HEDGE,
};

/// Upload settings.
#[derive(Clone, Debug)]
pub struct UploadOptions {
    /// Requested part size in bytes (adjusted by [`part_size`]); files
    /// larger than the part size go up as multipart uploads.
    pub part_size: Option<u64>,
    /// Parts in flight at once.
    pub concurrency: usize,
    /// The retry policy of every request: the parts run under it (the
    /// store's runner, the SDK's retries off for them); give the same value
    /// to [`gkq_store::s3::client`] for the other operations.
    pub retry: RetryPolicy,
    /// Replace published objects whose content differs (`--replace`).
    /// Without it, a published prefix is immutable: such an upload is
    /// refused before anything is sent.
    pub replace: bool,
}

impl Default for UploadOptions {
    fn default() -> Self {
        UploadOptions {
            part_size: None,
            concurrency: 4,
            retry: UPLOAD_RETRY,
            replace: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_sizes_respect_the_limits() {
        assert_eq!(part_size(1 << 30, None).expect("valid"), DEFAULT_PART);
        assert_eq!(part_size(1 << 30, Some(1)).expect("valid"), MIN_PART);
        // 1 TB needs parts of at least 100 MiB (rounded up to whole MiB).
        assert_eq!(part_size(1 << 40, None).expect("valid"), 105 << 20);
        assert!(part_size(u64::MAX / 2, None).is_err());
    }
}
