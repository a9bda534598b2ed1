//! Publishing: each object is skipped when the bucket already holds it
//! (same length and `x-amz-meta-sha256`), else sent with one PutObject or,
//! above the part size, as a multipart upload whose parts are streamed from
//! disk at their offsets, several in flight, each retried with backoff; a
//! failure that ends a multipart upload aborts it. Every object is checked
//! with a HEAD afterwards. Objects go strictly in the given order: row
//! files and companion files first, the knot last, so a knot is never
//! visible before what it names.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::{ByteStream, Length};
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::error::{Result, StoreError};

use std::path::PathBuf;

/// What an object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A columnar row file.
    Rows,
    /// The proof object of a row file (FORMAT.md 7a).
    Proof,
    /// A companion file (config, tokenizer) listed in `package.files`.
    Companion,
    /// The knot.
    Knot,
}

/// One file to publish.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LocalObject {
    /// Object key (prefix + file name).
    pub key: String,
    /// Local path.
    pub path: PathBuf,
    /// Length.
    pub bytes: u64,
    /// Hex SHA-256 of the file.
    pub sha256: String,
    /// Rows, companion or knot.
    pub kind: Kind,
}

impl LocalObject {
    /// The `Content-Type` it is served with.
    pub fn content_type(&self) -> &'static str {
        let name = self.path.to_string_lossy();
        if name.ends_with(".json") {
            "application/json"
        } else if name.ends_with(".txt") {
            "text/plain; charset=utf-8"
        } else {
            CONTENT_TYPE
        }
    }
}

/// Smallest part R2 and S3 accept (all but the last).
pub const MIN_PART: u64 = 5 << 20;
/// Most parts per upload.
pub const MAX_PARTS: u64 = 10_000;
/// Largest part.
pub const MAX_PART: u64 = 5 << 30;
/// Part size when none is asked for.
pub const DEFAULT_PART: u64 = 64 << 20;

/// `Content-Type` of the knot and row files (JSON and text companion files get their own).
pub const CONTENT_TYPE: &str = "application/octet-stream";
/// `Cache-Control` of every object: objects are immutable under a versioned prefix.
pub const CACHE_CONTROL: &str = "public, max-age=31536000, immutable";

/// The part size for a file of `size` bytes: the requested size (default
/// 64 MiB), at least 5 MiB, and large enough for at most 10,000 parts,
/// rounded up to a whole MiB.
pub fn part_size(size: u64, requested: Option<u64>) -> Result<u64> {
    let mib = 1u64 << 20;
    let need = size.div_ceil(MAX_PARTS).div_ceil(mib) * mib;
    let p = requested.unwrap_or(DEFAULT_PART).max(MIN_PART).max(need);
    if p > MAX_PART {
        return Err(StoreError::Options(format!(
            "{size} bytes need parts of {p} bytes, over the 5 GiB limit"
        )));
    }
    Ok(p)
}

/// Upload settings.
#[derive(Clone, Debug)]
pub struct UploadOptions {
    /// Requested part size in bytes (adjusted by [`part_size`]); files
    /// larger than the part size go up as multipart uploads.
    pub part_size: Option<u64>,
    /// Parts in flight at once.
    pub concurrency: usize,
    /// Attempts per part (on top of the SDK's own retries).
    pub part_attempts: u32,
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
            part_attempts: 3,
            replace: false,
        }
    }
}

/// What happened to one object (`--json`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ObjectReport {
    /// Object key.
    pub key: String,
    /// Length.
    pub bytes: u64,
    /// Hex SHA-256 (stored as `x-amz-meta-sha256`).
    pub sha256: String,
    /// `uploaded` or `skipped`.
    pub status: &'static str,
    /// Parts sent (1 for a single PutObject, 0 when skipped).
    pub parts: u64,
    /// Wall time.
    pub seconds: f64,
}

pub use gkq_format::progress::{NoProgress, Progress};

/// Publishes objects to one bucket.
#[derive(Clone, Debug)]
pub struct Uploader {
    client: aws_sdk_s3::Client,
    bucket: String,
    endpoint: String,
    opts: UploadOptions,
}

/// What an S3 call's failure means to the user.
#[derive(Debug)]
pub(crate) enum Failure {
    /// HTTP 403.
    Denied,
    /// No HTTP answer: connection refused, DNS, TLS.
    Unreachable(String),
    /// Anything else, as one short line.
    Other(String),
}

/// The innermost cause of an error, which is the part that says what happened
/// (`Connection refused (os error 111)`), without the SDK's debug structure.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// One short line for an SDK error; [`DisplayErrorContext`] only as a last
/// resort, for errors that carry nothing better.
pub(crate) fn describe<E>(e: &SdkError<E, HttpResponse>) -> Failure
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
{
    match e {
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            if status == 403 {
                return Failure::Denied;
            }
            let err = s.err();
            match (err.code(), err.message()) {
                (Some(c), Some(m)) => Failure::Other(format!("{c}: {m} (HTTP {status})")),
                (Some(c), None) => Failure::Other(format!("{c} (HTTP {status})")),
                _ => Failure::Other(format!("HTTP {status}")),
            }
        }
        SdkError::DispatchFailure(d) if !d.is_timeout() => Failure::Unreachable(root_cause(e)),
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => {
            Failure::Other(format!("timed out: {}", root_cause(e)))
        }
        SdkError::ResponseError(_) => {
            Failure::Other(format!("the response could not be read: {}", root_cause(e)))
        }
        _ => Failure::Other(DisplayErrorContext(e).to_string()),
    }
}

/// Worth another attempt: timeouts, connection failures, 5xx and 429.
fn transient<E>(e: &SdkError<E, HttpResponse>) -> bool {
    match e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(s) => {
            let st = s.raw().status().as_u16();
            st >= 500 || st == 429
        }
        _ => false,
    }
}

impl Uploader {
    /// An uploader for `bucket` through `client` (`endpoint` only names the server in messages).
    pub fn new(
        client: aws_sdk_s3::Client,
        bucket: &str,
        endpoint: &str,
        opts: UploadOptions,
    ) -> Uploader {
        Uploader {
            client,
            bucket: bucket.to_owned(),
            endpoint: endpoint.to_owned(),
            opts,
        }
    }

    fn s3_err(&self, op: &'static str, key: &str, failure: Failure) -> StoreError {
        match failure {
            Failure::Denied => StoreError::AccessDenied {
                op,
                endpoint: self.endpoint.clone(),
                bucket: self.bucket.clone(),
            },
            Failure::Unreachable(reason) => StoreError::Unreachable {
                endpoint: self.endpoint.clone(),
                reason,
            },
            Failure::Other(message) => StoreError::S3 {
                op,
                bucket: self.bucket.clone(),
                key: key.to_owned(),
                endpoint: self.endpoint.clone(),
                message,
            },
        }
    }

    /// Fails early when the endpoint is unreachable, the credentials are
    /// refused, or the bucket does not exist.
    pub async fn check_bucket(&self) -> Result<()> {
        match self.client.head_bucket().bucket(&self.bucket).send().await {
            Ok(_) => Ok(()),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => {
                Err(StoreError::NoBucket {
                    bucket: self.bucket.clone(),
                    endpoint: self.endpoint.clone(),
                })
            }
            Err(e) => Err(self.s3_err("HeadBucket", "", describe(&e))),
        }
    }

    /// `(length, x-amz-meta-sha256)` of an object, or `None` if absent.
    pub async fn head(&self, key: &str) -> Result<Option<(u64, Option<String>)>> {
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(h) => Ok(Some((
                h.content_length().unwrap_or(-1).max(0) as u64,
                h.metadata().and_then(|m| m.get("sha256").cloned()),
            ))),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => Ok(None),
            Err(e) => Err(self.s3_err("HeadObject", key, describe(&e))),
        }
    }

    async fn confirm(&self, o: &LocalObject) -> Result<()> {
        match self.head(&o.key).await? {
            Some((len, sha)) if len == o.bytes && sha.as_deref() == Some(&o.sha256) => Ok(()),
            Some((len, sha)) => Err(StoreError::Mismatch {
                bucket: self.bucket.clone(),
                key: o.key.clone(),
                expected: format!("{} bytes, sha256 {}", o.bytes, o.sha256),
                found: format!(
                    "{len} bytes, sha256 {}",
                    sha.unwrap_or_else(|| "missing".into())
                ),
            }),
            None => Err(StoreError::Mismatch {
                bucket: self.bucket.clone(),
                key: o.key.clone(),
                expected: format!("{} bytes", o.bytes),
                found: "no object".into(),
            }),
        }
    }

    /// Publishes `objects` in order (row files, then the knot).
    pub async fn publish(
        &self,
        objects: &[LocalObject],
        progress: &dyn Progress,
    ) -> Result<Vec<ObjectReport>> {
        if let Some(i) = objects.iter().position(|o| o.kind == Kind::Knot)
            && i + 1 != objects.len()
        {
            return Err(StoreError::Options(
                "the knot must be the last object published".into(),
            ));
        }
        // Published prefixes are immutable (Cache-Control: immutable): find
        // every object that exists with other content before sending anything.
        let mut existing = Vec::new();
        let mut conflicts = Vec::new();
        for o in objects {
            let exists = self.head(&o.key).await?;
            if let Some((len, sha)) = &exists
                && (*len != o.bytes || sha.as_deref() != Some(o.sha256.as_str()))
            {
                conflicts.push(format!(
                    "s3://{}/{}: published {} ({len} bytes), local sha256 {} ({} bytes)",
                    self.bucket,
                    o.key,
                    sha.as_deref()
                        .map_or("without x-amz-meta-sha256".to_owned(), |s| format!(
                            "sha256 {s}"
                        )),
                    o.sha256,
                    o.bytes
                ));
            }
            existing.push(exists);
        }
        if !conflicts.is_empty() && !self.opts.replace {
            return Err(StoreError::WouldReplace {
                endpoint: self.endpoint.clone(),
                conflicts,
            });
        }
        progress.start(objects.iter().map(|o| o.bytes).sum());
        let mut reports = Vec::new();
        for (o, exists) in objects.iter().zip(existing) {
            let t = Instant::now();
            if let Some((len, Some(sha))) = &exists
                && *len == o.bytes
                && *sha == o.sha256
            {
                progress.advance(o.bytes);
                reports.push(ObjectReport {
                    key: o.key.clone(),
                    bytes: o.bytes,
                    sha256: o.sha256.clone(),
                    status: "skipped",
                    parts: 0,
                    seconds: t.elapsed().as_secs_f64(),
                });
                continue;
            }
            let part = part_size(o.bytes, self.opts.part_size)?;
            let parts = if o.bytes > part {
                self.multipart(o, part, progress).await?
            } else {
                self.single(o, progress).await?
            };
            self.confirm(o).await?;
            reports.push(ObjectReport {
                key: o.key.clone(),
                bytes: o.bytes,
                sha256: o.sha256.clone(),
                status: "uploaded",
                parts,
                seconds: t.elapsed().as_secs_f64(),
            });
        }
        Ok(reports)
    }

    async fn single(&self, o: &LocalObject, progress: &dyn Progress) -> Result<u64> {
        let body = ByteStream::from_path(&o.path)
            .await
            .map_err(|e| StoreError::Io {
                path: o.path.clone(),
                error: std::io::Error::other(e),
            })?;
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(&o.key)
            .body(body)
            .content_length(o.bytes as i64)
            .content_type(o.content_type())
            .cache_control(CACHE_CONTROL)
            .metadata("sha256", &o.sha256)
            .send()
            .await
            .map_err(|e| self.s3_err("PutObject", &o.key, describe(&e)))?;
        progress.advance(o.bytes);
        Ok(1)
    }

    /// Aborts multipart uploads of `key` left by an interrupted run.
    async fn abort_stale(&self, key: &str) {
        let Ok(list) = self
            .client
            .list_multipart_uploads()
            .bucket(&self.bucket)
            .prefix(key)
            .send()
            .await
        else {
            return;
        };
        for u in list.uploads() {
            if u.key() == Some(key)
                && let Some(id) = u.upload_id()
            {
                let _ = self
                    .client
                    .abort_multipart_upload()
                    .bucket(&self.bucket)
                    .key(key)
                    .upload_id(id)
                    .send()
                    .await;
            }
        }
    }

    async fn multipart(&self, o: &LocalObject, part: u64, progress: &dyn Progress) -> Result<u64> {
        self.abort_stale(&o.key).await;
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(&o.key)
            .content_type(o.content_type())
            .cache_control(CACHE_CONTROL)
            .metadata("sha256", &o.sha256)
            .send()
            .await
            .map_err(|e| self.s3_err("CreateMultipartUpload", &o.key, describe(&e)))?;
        let upload_id = created
            .upload_id()
            .ok_or_else(|| {
                self.s3_err(
                    "CreateMultipartUpload",
                    &o.key,
                    Failure::Other("no upload id in the answer".into()),
                )
            })?
            .to_owned();
        match self.send_parts(o, part, &upload_id, progress).await {
            Ok(parts) => {
                let n = parts.len() as u64;
                let done = self
                    .client
                    .complete_multipart_upload()
                    .bucket(&self.bucket)
                    .key(&o.key)
                    .upload_id(&upload_id)
                    .multipart_upload(
                        CompletedMultipartUpload::builder()
                            .set_parts(Some(parts))
                            .build(),
                    )
                    .send()
                    .await;
                match done {
                    Ok(_) => Ok(n),
                    Err(e) => {
                        self.abort(&o.key, &upload_id).await;
                        Err(self.s3_err("CompleteMultipartUpload", &o.key, describe(&e)))
                    }
                }
            }
            Err(e) => {
                self.abort(&o.key, &upload_id).await;
                Err(e)
            }
        }
    }

    async fn abort(&self, key: &str, upload_id: &str) {
        let _ = self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .send()
            .await;
    }

    async fn send_parts(
        &self,
        o: &LocalObject,
        part: u64,
        upload_id: &str,
        progress: &dyn Progress,
    ) -> Result<Vec<CompletedPart>> {
        let count = o.bytes.div_ceil(part);
        let permits = Arc::new(Semaphore::new(self.opts.concurrency.max(1)));
        let mut tasks: JoinSet<Result<(CompletedPart, u64)>> = JoinSet::new();
        let mut parts = Vec::with_capacity(count as usize);
        for n in 1..=count {
            let permit = permits
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let me = self.clone();
            let (key, path, id) = (o.key.clone(), o.path.clone(), upload_id.to_owned());
            let offset = (n - 1) * part;
            let len = part.min(o.bytes - offset);
            tasks.spawn(async move {
                let _permit = permit;
                me.send_part(&key, &path, &id, n as i32, offset, len)
                    .await
                    .map(|p| (p, len))
            });
            // Surface failures early instead of queueing every part first.
            while let Some(done) = tasks.try_join_next() {
                let (p, len) =
                    done.map_err(|e| StoreError::Options(format!("part task failed: {e}")))??;
                progress.advance(len);
                parts.push(p);
            }
        }
        while let Some(done) = tasks.join_next().await {
            let (p, len) =
                done.map_err(|e| StoreError::Options(format!("part task failed: {e}")))??;
            progress.advance(len);
            parts.push(p);
        }
        parts.sort_by_key(|p| p.part_number());
        Ok(parts)
    }

    async fn send_part(
        &self,
        key: &str,
        path: &std::path::Path,
        upload_id: &str,
        n: i32,
        offset: u64,
        len: u64,
    ) -> Result<CompletedPart> {
        let mut delay = Duration::from_millis(200);
        let attempts = self.opts.part_attempts.max(1);
        for attempt in 1..=attempts {
            let body = ByteStream::read_from()
                .path(path)
                .offset(offset)
                .length(Length::Exact(len))
                .build()
                .await
                .map_err(|e| StoreError::Io {
                    path: path.to_path_buf(),
                    error: std::io::Error::other(e),
                })?;
            let r = self
                .client
                .upload_part()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .part_number(n)
                .content_length(len as i64)
                .body(body)
                .send()
                .await;
            match r {
                Ok(out) => {
                    return Ok(CompletedPart::builder()
                        .set_e_tag(out.e_tag().map(str::to_owned))
                        .part_number(n)
                        .build());
                }
                Err(e) if attempt < attempts && transient(&e) => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(e) => {
                    let failure = match describe(&e) {
                        Failure::Other(m) => Failure::Other(format!(
                            "part {n} (bytes {offset}-{}): {m}",
                            offset + len - 1
                        )),
                        other => other,
                    };
                    return Err(self.s3_err("UploadPart", key, failure));
                }
            }
        }
        unreachable!("the last attempt returns")
    }
}
