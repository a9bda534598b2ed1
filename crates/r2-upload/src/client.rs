//! The S3 client, configured the way Cloudflare R2 needs it.

use std::time::Duration;

use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, ProvideCredentials, Region, RequestChecksumCalculation,
    ResponseChecksumValidation, SharedCredentialsProvider,
};

use crate::error::{Result, UploadError};

/// Where to publish and how to authenticate.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// `https://<account>.r2.cloudflarestorage.com`, or any S3-compatible endpoint.
    pub url: String,
    /// `auto` for R2.
    pub region: String,
}

/// Resolves the endpoint: `--endpoint` wins, else `R2_ACCOUNT_ID`.
pub fn endpoint(
    flag: Option<&str>,
    region: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Endpoint> {
    let url = match flag {
        Some(u) => u.trim_end_matches('/').to_owned(),
        None => match env("R2_ACCOUNT_ID").filter(|a| !a.is_empty()) {
            Some(account) => format!("https://{account}.r2.cloudflarestorage.com"),
            None => return Err(UploadError::NoEndpoint),
        },
    };
    Ok(Endpoint {
        url,
        region: region.unwrap_or("auto").to_owned(),
    })
}

/// Static credentials from `R2_ACCESS_KEY_ID`/`R2_SECRET_ACCESS_KEY`, else
/// `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`);
/// `None` when neither pair is set (profiles are tried next).
pub fn env_credentials(env: &dyn Fn(&str) -> Option<String>) -> Option<Credentials> {
    let get = |k: &str| env(k).filter(|v| !v.is_empty());
    if let (Some(id), Some(secret)) = (get("R2_ACCESS_KEY_ID"), get("R2_SECRET_ACCESS_KEY")) {
        return Some(Credentials::new(id, secret, None, None, "R2_* environment"));
    }
    if let (Some(id), Some(secret)) = (get("AWS_ACCESS_KEY_ID"), get("AWS_SECRET_ACCESS_KEY")) {
        return Some(Credentials::new(
            id,
            secret,
            get("AWS_SESSION_TOKEN"),
            None,
            "AWS_* environment",
        ));
    }
    None
}

/// Credentials from the environment, else from the AWS profile files
/// (`AWS_PROFILE`, `~/.aws/credentials`). Fails with the variables to set.
pub async fn credentials(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<SharedCredentialsProvider> {
    if let Some(c) = env_credentials(env) {
        return Ok(SharedCredentialsProvider::new(c));
    }
    let file = env("AWS_SHARED_CREDENTIALS_FILE")
        .or_else(|| env("HOME").map(|h| format!("{h}/.aws/credentials")));
    let has_file = file
        .as_deref()
        .is_some_and(|f| std::path::Path::new(f).is_file());
    if env("AWS_PROFILE").is_none() && !has_file {
        return Err(UploadError::Credentials { detail: None });
    }
    let profile = aws_config::profile::ProfileFileCredentialsProvider::builder().build();
    match profile.provide_credentials().await {
        Ok(c) => Ok(SharedCredentialsProvider::new(c)),
        Err(e) => Err(UploadError::Credentials {
            detail: Some(format!("no usable AWS profile: {e}")),
        }),
    }
}

/// An S3 client for R2.
///
/// - Region `auto` (R2 has no regions; SigV4 still needs one).
/// - `request_checksum_calculation` and `response_checksum_validation` are
///   `WhenRequired`: SDK releases since early 2025 add CRC32 checksum headers
///   to every upload by default, which R2 answered with `501 NotImplemented`,
///   and R2 refuses two checksums on one request. Integrity is ensured
///   instead by the sha256 stored as `x-amz-meta-sha256` and checked with a
///   HEAD after each upload, and by `gkq-verify`.
/// - Path-style addressing, so any S3-compatible endpoint works (and the
///   local test server).
/// - Standard retries (3 attempts, exponential backoff) and timeouts, on top
///   of which part uploads are retried by this crate.
pub fn client(ep: &Endpoint, creds: SharedCredentialsProvider) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::config::Builder::new()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(ep.region.clone()))
        .endpoint_url(ep.url.clone())
        .force_path_style(true)
        .credentials_provider(creds)
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .retry_config(RetryConfig::standard().with_max_attempts(3))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_attempt_timeout(Duration::from_secs(300))
                .build(),
        )
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}
