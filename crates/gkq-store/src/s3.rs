//! S3 (Cloudflare R2, or any S3-compatible store; feature `s3`): the
//! client configured the way R2 needs it, shared by the uploader, and
//! [`S3Reader`], strict ranged reads of private objects for the reader.

use std::time::Duration;

use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, ProvideCredentials, Region, RequestChecksumCalculation,
    ResponseChecksumValidation, SharedCredentialsProvider,
};

use crate::error::{Result, StoreError};

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
            None => return Err(StoreError::NoEndpoint),
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
        return Err(StoreError::Credentials { detail: None });
    }
    let profile = aws_config::profile::ProfileFileCredentialsProvider::builder().build();
    match profile.provide_credentials().await {
        Ok(c) => Ok(SharedCredentialsProvider::new(c)),
        Err(e) => Err(StoreError::Credentials {
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

/// `(bucket, key)` of an `s3://bucket/key` URL.
pub fn parse_s3_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("s3://")?;
    let (bucket, key) = rest.split_once('/')?;
    (!bucket.is_empty()).then_some((bucket, key))
}

/// Blocking, strict reads of objects in private buckets: `HEAD` for the
/// length, ranged `GetObject` checked like the HTTP path (the exact
/// `Content-Range`, the exact body length). The SDK is async; a runtime of
/// its own drives it, and any thread may call in.
#[derive(Debug)]
pub struct S3Reader {
    client: aws_sdk_s3::Client,
    rt: tokio::runtime::Runtime,
    endpoint: String,
}

fn sdk_error<E>(
    url: &str,
    op: &str,
    e: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> StoreError
where
    E: std::error::Error + aws_sdk_s3::error::ProvideErrorMetadata + 'static,
{
    use aws_sdk_s3::error::SdkError;
    match e {
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            if status == 403 {
                return StoreError::Status {
                    url: url.into(),
                    status,
                    what: format!(
                        "{op} (access denied: check R2_ACCESS_KEY_ID/R2_SECRET_ACCESS_KEY and the token's bucket permissions)"
                    ),
                };
            }
            StoreError::Status {
                url: url.into(),
                status,
                what: format!(
                    "{op}{}",
                    s.err()
                        .code()
                        .map_or_else(String::new, |c| format!(" ({c})"))
                ),
            }
        }
        other => {
            let mut cur: &(dyn std::error::Error + 'static) = other;
            while let Some(next) = cur.source() {
                cur = next;
            }
            StoreError::Transport {
                url: url.into(),
                message: cur.to_string(),
                attempts: 3,
                timeout: matches!(other, SdkError::TimeoutError(_)),
                no_conversation: matches!(other, SdkError::DispatchFailure(_)),
            }
        }
    }
}

impl S3Reader {
    /// A reader for `ep` with `creds`.
    pub fn new(ep: &Endpoint, creds: SharedCredentialsProvider) -> Result<S3Reader> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| StoreError::Client(format!("tokio runtime: {e}")))?;
        Ok(S3Reader {
            client: client(ep, creds),
            rt,
            endpoint: ep.url.clone(),
        })
    }

    /// A reader from the environment: `--endpoint` or `R2_ACCOUNT_ID`, and
    /// the credentials `r2-upload` uses (`R2_*`, `AWS_*`, a profile).
    pub fn from_env(endpoint_flag: Option<&str>) -> Result<S3Reader> {
        let env = |k: &str| std::env::var(k).ok();
        let ep = endpoint(endpoint_flag, None, &env)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Client(format!("tokio runtime: {e}")))?;
        let creds = rt.block_on(credentials(&env))?;
        S3Reader::new(&ep, creds)
    }

    /// The endpoint, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// HEAD: length, ETag and `x-amz-meta-sha256`.
    pub fn head(&self, url: &str) -> Result<crate::Head> {
        let (bucket, key) = parse_s3_url(url).ok_or_else(|| bad_url(url))?;
        let h = self
            .rt
            .block_on(self.client.head_object().bucket(bucket).key(key).send())
            .map_err(|e| sdk_error(url, "HeadObject", &e))?;
        Ok(crate::Head {
            len: u64::try_from(h.content_length().unwrap_or(0)).unwrap_or(0),
            etag: h.e_tag().map(str::to_owned),
            sha256: h.metadata().and_then(|m| m.get("sha256").cloned()),
        })
    }

    /// Ranged `GetObject` of `bytes=start-end`, checked like the HTTP path;
    /// returns the object's length from the Content-Range. `prefix`: accept
    /// a shorter answer that ends at the object's end.
    pub fn get_range(
        &self,
        url: &str,
        start: u64,
        end: u64,
        prefix: bool,
        sink: &mut dyn FnMut(u64, &[u8]),
    ) -> Result<u64> {
        let (bucket, key) = parse_s3_url(url).ok_or_else(|| bad_url(url))?;
        self.rt.block_on(async {
            let out = self
                .client
                .get_object()
                .bucket(bucket)
                .key(key)
                .range(format!("bytes={start}-{end}"))
                .send()
                .await
                .map_err(|e| sdk_error(url, "GetObject", &e))?;
            let cr = out.content_range().unwrap_or_default().to_owned();
            let parsed = crate::http::parse_content_range(&cr);
            let (got_end, total) = match parsed {
                Some((a, b, t))
                    if a == start && (b == end || (prefix && t > 0 && b == end.min(t - 1))) =>
                {
                    (b, t)
                }
                _ => {
                    return Err(StoreError::ContentRange {
                        url: url.into(),
                        expected: format!("bytes {start}-{end}/…"),
                        found: cr,
                    });
                }
            };
            let want = got_end - start + 1;
            let mut body = out.body;
            let mut got = 0u64;
            while let Some(chunk) = body.try_next().await.map_err(|e| StoreError::Transport {
                url: url.into(),
                message: e.to_string(),
                attempts: 1,
                timeout: false,
                no_conversation: false,
            })? {
                if got + chunk.len() as u64 > want {
                    return Err(StoreError::BodyLength {
                        url: url.into(),
                        start,
                        end: got_end,
                        expected: want,
                        found: got + chunk.len() as u64,
                    });
                }
                sink(got, &chunk);
                got += chunk.len() as u64;
            }
            if got != want {
                return Err(StoreError::BodyLength {
                    url: url.into(),
                    start,
                    end: got_end,
                    expected: want,
                    found: got,
                });
            }
            Ok(total)
        })
    }
}

fn bad_url(url: &str) -> StoreError {
    StoreError::Client(format!("{url}: not an s3://bucket/key URL"))
}
