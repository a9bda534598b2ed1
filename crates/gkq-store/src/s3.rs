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

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::gate::Gate;
use crate::range::{Expect, check_dest};
use crate::retry::{Attempt, RetryPolicy, Runner, Transient};
use crate::stats::{Counters, NetStats};

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

/// An S3 client for R2, as the uploader uses it.
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
/// - The SDK's standard retries set from `policy` (its attempts, its first
///   backoff, doubled), the one policy of the caller: an operation that
///   runs under the caller's own runner (the uploader's parts) turns them
///   off for itself, so that no request is retried twice over.
pub fn client(
    ep: &Endpoint,
    creds: SharedCredentialsProvider,
    policy: &RetryPolicy,
) -> aws_sdk_s3::Client {
    let retry = RetryConfig::standard()
        .with_max_attempts(policy.attempts())
        .with_initial_backoff(policy.backoff);
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(5))
        .operation_attempt_timeout(Duration::from_secs(300))
        .build();
    aws_sdk_s3::Client::from_conf(conf(ep, creds, retry, timeouts))
}

/// The client of [`S3Store`]: the SDK neither retries nor times out on its
/// own, since every read runs under the store's runner (its retry policy,
/// `--timeout` and `--min-throughput` deadline), as HTTP reads do.
fn read_client(
    ep: &Endpoint,
    creds: SharedCredentialsProvider,
    connect: Duration,
) -> aws_sdk_s3::Client {
    let timeouts = TimeoutConfig::builder().connect_timeout(connect).build();
    aws_sdk_s3::Client::from_conf(conf(ep, creds, RetryConfig::disabled(), timeouts))
}

fn conf(
    ep: &Endpoint,
    creds: SharedCredentialsProvider,
    retry: RetryConfig,
    timeouts: TimeoutConfig,
) -> aws_sdk_s3::Config {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    let https = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https();
    aws_sdk_s3::config::Builder::new()
        .http_client(https)
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(ep.region.clone()))
        .endpoint_url(ep.url.clone())
        .force_path_style(true)
        .credentials_provider(creds)
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .retry_config(retry)
        .timeout_config(timeouts)
        .build()
}

/// `(bucket, key)` of an `s3://bucket/key` URL.
pub fn parse_s3_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("s3://")?;
    let (bucket, key) = rest.split_once('/')?;
    (!bucket.is_empty()).then_some((bucket, key))
}

/// Strict reads of objects in private buckets: `HeadObject` for the
/// length, ranged `GetObject` checked like the HTTP path (the exact
/// `Content-Range`, the exact body length). Each call runs under the
/// store's retry runner: its policy, `--timeout` and `--min-throughput`
/// deadline, as the HTTP backend does (the SDK's own retries and timeouts
/// are off).
#[derive(Debug)]
pub struct S3Store {
    client: aws_sdk_s3::Client,
    endpoint: String,
    config: StoreConfig,
    counters: Counters,
    gate: Gate,
    /// The ETag first seen for each object: later GetObjects send it as
    /// `If-Match` and must answer with it (`crate::answer::Validators`).
    validators: crate::answer::Validators,
}

type Try<T> = Attempt<T, StoreError>;

/// An SDK failure: a final error, or one worth another attempt.
fn attempt_error<E>(
    url: &str,
    op: &str,
    e: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> Try<std::convert::Infallible>
where
    E: std::error::Error + aws_sdk_s3::error::ProvideErrorMetadata + 'static,
{
    use aws_sdk_s3::error::SdkError;
    let SdkError::ServiceError(s) = e else {
        return Attempt::Retry(Transient {
            timeout: matches!(e, SdkError::TimeoutError(_)),
            no_conversation: matches!(e, SdkError::DispatchFailure(d) if !d.is_timeout()),
            ..Transient::msg(gkq_format::root_cause(e))
        });
    };
    let status = s.raw().status().as_u16();
    let code = s
        .err()
        .code()
        .map_or_else(String::new, |c| format!(" ({c})"));
    if crate::retry::transient_status(status) {
        return Attempt::Retry(Transient::msg(format!("HTTP {status} for {op}{code}")));
    }
    Attempt::Fail(match status {
        404 => StoreError::NotFound {
            url: url.into(),
            how: format!("HTTP 404 for {op}{code}"),
        },
        403 => StoreError::Status {
            url: url.into(),
            status,
            what: op.to_owned(),
            hint: Some(
                "access denied: check R2_ACCESS_KEY_ID/R2_SECRET_ACCESS_KEY and the token's bucket permissions".into(),
            ),
        },
        _ => StoreError::Status {
            url: url.into(),
            status,
            what: format!("{op}{code}"),
            hint: None,
        },
    })
}

impl S3Store {
    /// A backend for `ep` with `creds`, reading under `config`.
    pub fn new(ep: &Endpoint, creds: SharedCredentialsProvider, config: StoreConfig) -> S3Store {
        S3Store {
            client: read_client(ep, creds, config.timeout),
            endpoint: ep.url.clone(),
            gate: Gate::new(config.parallel),
            config,
            counters: Counters::default(),
            validators: crate::answer::Validators::default(),
        }
    }

    /// A backend from the environment: `config.s3_endpoint` or
    /// `R2_ACCOUNT_ID`, and the credentials `r2-upload` uses (`R2_*`,
    /// `AWS_*`, a profile).
    pub async fn from_env(config: StoreConfig) -> Result<S3Store> {
        let env = |k: &str| std::env::var(k).ok();
        let ep = endpoint(config.s3_endpoint.as_deref(), None, &env)?;
        let creds = credentials(&env).await?;
        Ok(S3Store::new(&ep, creds, config))
    }

    /// The endpoint, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The counters of every call this backend made.
    pub fn stats(&self) -> NetStats {
        self.counters.snapshot()
    }

    fn runner<'a>(&'a self, url: &'a str, what: &'a str, bytes: u64) -> Runner<'a> {
        Runner::new(self.config.retry, self.config.deadline(bytes), url, what)
            .counted(&self.counters)
    }

    async fn head_once(&self, url: &str) -> Try<crate::Head> {
        let Some((bucket, key)) = parse_s3_url(url) else {
            return Attempt::Fail(bad_url(url));
        };
        let h = match self
            .client
            .head_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
        {
            Ok(h) => h,
            Err(e) => return never(attempt_error(url, "HeadObject", &e)),
        };
        let Some(len) = h.content_length().and_then(|l| u64::try_from(l).ok()) else {
            return Attempt::Fail(StoreError::NoLength {
                url: url.into(),
                what: "HeadObject",
            });
        };
        Attempt::Done(crate::Head {
            len,
            etag: h.e_tag().map(str::to_owned),
            sha256: h.metadata().and_then(|m| m.get("sha256").cloned()),
        })
    }

    /// One ranged `GetObject` of `bytes=start-end`, checked like the HTTP
    /// path ([`crate::answer`]) and streamed into `dest`: the end the body
    /// covers and the object's length.
    async fn get_once(
        &self,
        url: &str,
        (start, end): (u64, u64),
        expect: Expect,
        (dest, got): (&Mutex<&mut [u8]>, &AtomicU64),
    ) -> Try<(u64, u64)> {
        let Some((bucket, key)) = parse_s3_url(url) else {
            return Attempt::Fail(bad_url(url));
        };
        let was = self.validators.get(url);
        let get = self.client.get_object().bucket(bucket).key(key);
        let get = get
            .range(format!("bytes={start}-{end}"))
            .set_if_match(was.clone());
        let out = match get.send().await {
            Ok(o) => o,
            // If-Match refused: the object is not the version first seen
            Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 412) => {
                return Attempt::Fail(StoreError::Changed {
                    url: url.into(),
                    was: was.unwrap_or_default(),
                    now: "another (the server refused If-Match)".into(),
                });
            }
            Err(e) => return never(attempt_error(url, "GetObject", &e)),
        };
        let etag = out.e_tag().map(str::to_owned);
        let cr = out.content_range().unwrap_or_default().to_owned();
        let mut body = out.body;
        let checks = (&self.validators, etag.as_deref(), cr.as_str());
        let at = (url, (start, end), expect);
        crate::answer::accept(&mut body, at, checks, dest, (&self.counters, got)).await
    }

    /// [`S3Store::get_once`] under the runner; a 416 (a range past the
    /// end) is [`StoreError::PastEnd`] with the object's length, which S3
    /// servers do not all send with it: then a HEAD asks for it.
    async fn get_range(
        &self,
        url: &str,
        (start, end): (u64, u64),
        expect: Expect,
        dest: &mut [u8],
    ) -> Result<(u64, u64)> {
        let what = format!("bytes={start}-{end}");
        let bytes = end - start + 1;
        let deadline = self.config.deadline(bytes);
        let (dest, got) = (Mutex::new(dest), AtomicU64::new(0));
        let on_timeout = || {
            Transient::msg(format!(
                "timed out: {what}: no complete answer within {:.1} s, the deadline for {bytes} bytes; {} bytes had arrived",
                deadline.as_secs_f64(),
                got.load(Ordering::Relaxed)
            ))
        };
        let r = self
            .runner(url, &what, bytes)
            .run(
                || self.get_once(url, (start, end), expect, (&dest, &got)),
                on_timeout,
            )
            .await
            .map_err(|o| crate::http::finished(url, o));
        match r {
            Err(StoreError::Status { status: 416, .. }) => Err(StoreError::PastEnd {
                url: url.into(),
                start,
                end,
                len: crate::read::RangeRead::head(self, url).await?.len,
            }),
            r => r,
        }
    }
}

impl crate::answer::Body for aws_sdk_s3::primitives::ByteStream {
    async fn chunk(&mut self) -> std::result::Result<Option<bytes::Bytes>, (String, bool)> {
        self.try_next()
            .await
            .map_err(|e| (gkq_format::root_cause(&e), false))
    }
}

/// An attempt that cannot be `Done` (an error), as an attempt of any type.
fn never<T>(a: Try<std::convert::Infallible>) -> Try<T> {
    match a {
        Attempt::Retry(f) => Attempt::Retry(f),
        Attempt::Fail(e) => Attempt::Fail(e),
        Attempt::Done(never) => match never {},
    }
}

impl crate::read::RangeRead for S3Store {
    fn head<'a>(&'a self, location: &'a str) -> crate::read::BoxFuture<'a, Result<crate::Head>> {
        Box::pin(async move {
            let timeout = self.config.timeout;
            let on_timeout = || {
                Transient::msg(format!(
                    "timed out: no answer to HeadObject within {:.1} s",
                    timeout.as_secs_f64()
                ))
            };
            Runner::new(self.config.retry, timeout, location, "HeadObject")
                .counted(&self.counters)
                .run(|| self.head_once(location), on_timeout)
                .await
                .map_err(|o| crate::http::finished(location, o))
        })
    }

    fn read_into<'a>(
        &'a self,
        location: &'a str,
        start: u64,
        dest: &'a mut [u8],
        opts: crate::read::ReadOptions,
    ) -> crate::read::BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let end = check_dest(
                location,
                start,
                dest.len() as u64,
                self.config.max_read_bytes,
            )?;
            let expect = Expect::Exact(opts.total);
            let (_, total) = self.get_range(location, (start, end), expect, dest).await?;
            Ok(total)
        })
    }

    fn read_prefix<'a>(
        &'a self,
        location: &'a str,
        max: u64,
    ) -> crate::read::BoxFuture<'a, Result<(Vec<u8>, u64)>> {
        let cap = self.config.max_read_bytes;
        Box::pin(crate::answer::read_prefix(
            location,
            max,
            cap,
            async |range, out| (self.get_range(location, range, Expect::Prefix, out)).await,
        ))
    }

    fn max_read_bytes(&self) -> u64 {
        self.config.max_read_bytes
    }

    fn gate(&self) -> &Gate {
        &self.gate
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
