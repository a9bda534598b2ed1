//! S3 (Cloudflare R2, or any S3-compatible store; feature `s3`): the
//! client configured the way R2 needs it, shared by the uploader, and
//! [`S3Store`], strict ranged reads of private objects for the reader.

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
        Some(u) => endpoint_url(u)?,
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

/// Checks an `--endpoint` URL: a scheme is required (`127.0.0.1:8014` gets
/// the `http://` suggestion), and credentials in it (`http://KEY:SECRET@host`)
/// are refused before anything could print them: they belong in the
/// environment.
pub fn endpoint_url(flag: &str) -> Result<String> {
    let u = flag.trim().trim_end_matches('/');
    let Some((scheme, rest)) = u.split_once("://") else {
        return Err(StoreError::Options(format!(
            "--endpoint {u}: not a URL; did you mean http://{u} (or https://{u})?"
        )));
    };
    if scheme != "http" && scheme != "https" {
        return Err(StoreError::Options(format!(
            "--endpoint: the scheme must be http:// or https://, not {scheme}://"
        )));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((_, host)) = authority.rsplit_once('@') {
        return Err(StoreError::Options(format!(
            "--endpoint: credentials in the URL are refused (they would show in logs and messages): give {scheme}://{host} and set R2_ACCESS_KEY_ID and R2_SECRET_ACCESS_KEY (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) instead"
        )));
    }
    Ok(u.to_owned())
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
    env: &(dyn Fn(&str) -> Option<String> + Sync),
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

/// Strict reads of objects in private buckets: `HEAD` for the length,
/// ranged `GetObject` checked like the HTTP path (the exact
/// `Content-Range`, the exact body length). The SDK retries transient
/// failures itself (standard mode, 3 attempts).
#[derive(Debug)]
pub struct S3Store {
    client: aws_sdk_s3::Client,
    endpoint: String,
    counters: std::sync::Arc<crate::stats::Counters>,
    max_read_bytes: u64,
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
                    what: op.to_owned(),
                    hint: Some(
                        "access denied: check R2_ACCESS_KEY_ID/R2_SECRET_ACCESS_KEY and the token's bucket permissions".into(),
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
                hint: None,
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

impl S3Store {
    /// A backend for `ep` with `creds`.
    pub(crate) fn new(
        ep: &Endpoint,
        creds: SharedCredentialsProvider,
        counters: std::sync::Arc<crate::stats::Counters>,
        max_read_bytes: u64,
    ) -> S3Store {
        S3Store {
            client: client(ep, creds),
            endpoint: ep.url.clone(),
            counters,
            max_read_bytes,
        }
    }

    /// A backend from the environment: `endpoint_flag` or `R2_ACCOUNT_ID`,
    /// and the credentials `r2-upload` uses (`R2_*`, `AWS_*`, a profile).
    pub(crate) async fn from_env(
        endpoint_flag: Option<&str>,
        counters: std::sync::Arc<crate::stats::Counters>,
        max_read_bytes: u64,
    ) -> Result<S3Store> {
        let env = |k: &str| std::env::var(k).ok();
        let ep = endpoint(endpoint_flag, None, &env)?;
        let creds = credentials(&env).await?;
        Ok(S3Store::new(&ep, creds, counters, max_read_bytes))
    }

    /// The endpoint, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn head_object(&self, url: &str) -> Result<crate::Head> {
        let (bucket, key) = parse_s3_url(url).ok_or_else(|| bad_url(url))?;
        self.counters.request(false);
        let h = self
            .client
            .head_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| sdk_error(url, "HeadObject", &e))?;
        Ok(crate::Head {
            len: u64::try_from(h.content_length().unwrap_or(0)).unwrap_or(0),
            etag: h.e_tag().map(str::to_owned),
            sha256: h.metadata().and_then(|m| m.get("sha256").cloned()),
        })
    }

    /// Ranged `GetObject` of `bytes=start-end`, checked like the HTTP path;
    /// `sink` gets the body as it arrives. Returns the object's length from
    /// the Content-Range. `prefix`: accept a shorter answer that ends at the
    /// object's end.
    async fn get_range(
        &self,
        url: &str,
        (start, end): (u64, u64),
        prefix: bool,
        sink: &mut (dyn FnMut(u64, &[u8]) + Send),
    ) -> Result<(u64, u64)> {
        let (bucket, key) = parse_s3_url(url).ok_or_else(|| bad_url(url))?;
        self.counters.request(false);
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
        let (got_end, total) = match crate::range::parse_content_range(&cr) {
            Some((a, b, t)) if a == start && (b == end || (prefix && b == end.min(t - 1))) => {
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
            self.counters.body(chunk.len() as u64);
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
        Ok((got_end, total))
    }
}

impl crate::read::RangeRead for S3Store {
    fn head<'a>(&'a self, location: &'a str) -> crate::read::BoxFuture<'a, Result<crate::Head>> {
        Box::pin(self.head_object(location))
    }

    fn read_into<'a>(
        &'a self,
        location: &'a str,
        start: u64,
        dest: &'a mut [u8],
        opts: crate::read::ReadOptions,
    ) -> crate::read::BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let end =
                crate::range::check_dest(location, start, dest.len() as u64, self.max_read_bytes)?;
            let mut sink = |at: u64, b: &[u8]| {
                let at = usize::try_from(at).unwrap_or(usize::MAX);
                if let Some(d) = at.checked_add(b.len()).and_then(|e| dest.get_mut(at..e)) {
                    d.copy_from_slice(b);
                }
            };
            let (_, total) = self
                .get_range(location, (start, end), false, &mut sink)
                .await?;
            if let Some(t) = opts.total.filter(|&t| t != total) {
                return Err(StoreError::ContentRange {
                    url: location.into(),
                    expected: format!("bytes {start}-{end}/{t}"),
                    found: format!("bytes {start}-{end}/{total}"),
                });
            }
            Ok(total)
        })
    }

    fn read_prefix<'a>(
        &'a self,
        location: &'a str,
        max: u64,
    ) -> crate::read::BoxFuture<'a, Result<(Vec<u8>, u64)>> {
        Box::pin(async move {
            let mut out = Vec::new();
            let mut sink = |_: u64, b: &[u8]| out.extend_from_slice(b);
            let (_, total) = self
                .get_range(location, (0, max.saturating_sub(1)), true, &mut sink)
                .await?;
            Ok((out, total))
        })
    }

    fn max_read_bytes(&self) -> u64 {
        self.max_read_bytes
    }
}

fn bad_url(url: &str) -> StoreError {
    StoreError::Client(format!("{url}: not an s3://bucket/key URL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_urls_carry_no_secrets() {
        assert_eq!(
            endpoint_url("http://127.0.0.1:8014/").ok().as_deref(),
            Some("http://127.0.0.1:8014")
        );
        let e = endpoint_url("http://AKID42:s3cr3t-value@127.0.0.1:8014")
            .expect_err("refused")
            .to_string();
        assert!(!e.contains("s3cr3t-value") && !e.contains("AKID42"), "{e}");
        assert!(e.contains("R2_SECRET_ACCESS_KEY"), "{e}");
        let e = endpoint_url("127.0.0.1:8014")
            .expect_err("no scheme")
            .to_string();
        assert!(e.contains("http://127.0.0.1:8014"), "{e}");
        assert!(endpoint_url("ftp://h").is_err());
    }

    #[test]
    fn s3_urls() {
        assert_eq!(parse_s3_url("s3://b/k/x"), Some(("b", "k/x")));
        assert_eq!(parse_s3_url("s3:///k"), None);
        assert_eq!(parse_s3_url("https://b/k"), None);
    }
}
