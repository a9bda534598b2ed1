//! Sending one object: the bytes are read once, hashed as they are sent,
//! and compared with the digest the knot records before the object is
//! completed. Each request carries its SHA-256 as `x-amz-checksum-sha256`,
//! so a server that checks it (S3, R2) also refuses bytes damaged on the way.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart};
use bytes::{Bytes, BytesMut};
use gkq_format::hex;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::failure::{SdkFailure, describe, precondition_failed, transient};
use super::options::UploadOptions;
use crate::error::{Result, UploadError};
use crate::local::LocalObject;
use aws_sdk_s3::config::retry::RetryConfig;
use gkq_format::progress::Progress;
use gkq_store::retry::{Attempt, Outcome, Runner, Transient};

/// How a conditional write ended.
pub(crate) enum Sent {
    /// Sent, in this many parts.
    Parts(u64),
    /// The key was taken in between (`If-None-Match: *` refused it).
    Taken,
}

fn b64(digest: &[u8]) -> String {
    aws_smithy_types::base64::encode(digest)
}

fn io_err(path: &Path, e: std::io::Error) -> UploadError {
    UploadError::Io {
        path: path.to_path_buf(),
        error: e,
    }
}

/// Hashes `bytes` into `whole` and alone, off the async workers.
async fn hash_part(mut whole: Sha256, bytes: Bytes) -> (Sha256, [u8; 32]) {
    tokio::task::spawn_blocking(move || {
        whole.update(&bytes);
        (whole, Sha256::digest(&bytes).into())
    })
    .await
    .expect("hashing does not panic")
}

/// `Cache-Control` of every object: objects are immutable under a versioned prefix.
pub(crate) const CACHE_CONTROL: &str = "public, max-age=31536000, immutable";

/// Publishes objects to one bucket.
#[derive(Clone, Debug)]
pub struct Uploader {
    pub(super) client: aws_sdk_s3::Client,
    pub(super) bucket: String,
    pub(super) endpoint: String,
    pub(super) opts: UploadOptions,
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

    pub(super) fn s3_err(&self, op: &'static str, key: &str, failure: SdkFailure) -> UploadError {
        match failure {
            SdkFailure::Denied => UploadError::AccessDenied {
                op,
                endpoint: self.endpoint.clone(),
                bucket: self.bucket.clone(),
            },
            SdkFailure::Unreachable(reason) => UploadError::Unreachable {
                endpoint: self.endpoint.clone(),
                reason,
            },
            SdkFailure::Other(message) => UploadError::S3 {
                op,
                bucket: self.bucket.clone(),
                key: key.to_owned(),
                endpoint: self.endpoint.clone(),
                message,
            },
        }
    }
}

impl Uploader {
    fn changed(&self, o: &LocalObject, found: String, found_bytes: u64) -> UploadError {
        UploadError::ChangedOnDisk {
            path: o.path.clone(),
            object: format!("s3://{}/{}", self.bucket, o.key),
            expected: o.sha256.clone(),
            found,
            found_bytes,
        }
    }

    /// One PutObject of the whole file, `If-None-Match: *` when `fresh`.
    pub(crate) async fn single(
        &self,
        o: &LocalObject,
        fresh: bool,
        progress: &dyn Progress,
    ) -> Result<Sent> {
        let (path, len) = (o.path.clone(), o.bytes);
        // a regular file, no link, read no further than the length checked
        let read = tokio::task::spawn_blocking(move || {
            gkq_files::read_bounded(&path, len, "an object to upload", gkq_files::Follow::No)
        })
        .await
        .map_err(|e| io_err(&o.path, std::io::Error::other(e)))?;
        let bytes = Bytes::from(read?);
        let (_, digest) = hash_part(Sha256::new(), bytes.clone()).await;
        if hex(&digest) != o.sha256 || bytes.len() as u64 != o.bytes {
            return Err(self.changed(o, hex(&digest), bytes.len() as u64));
        }
        let mut put = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(&o.key)
            .content_length(o.bytes as i64)
            .content_type(o.content_type())
            .cache_control(CACHE_CONTROL)
            .metadata("sha256", &o.sha256)
            .checksum_sha256(b64(&digest))
            .body(ByteStream::from(bytes));
        if fresh {
            put = put.if_none_match("*");
        }
        match put.send().await {
            Ok(_) => {
                progress.advance(o.bytes);
                Ok(Sent::Parts(1))
            }
            Err(e) if fresh && precondition_failed(&e) => Ok(Sent::Taken),
            Err(e) => Err(self.s3_err("PutObject", &o.key, describe(&e))),
        }
    }

    /// A multipart upload in parts of `part` bytes; see [`Uploader::send_parts`].
    pub(crate) async fn multipart(
        &self,
        o: &LocalObject,
        part: u64,
        fresh: bool,
        progress: &dyn Progress,
    ) -> Result<(Sent, Vec<String>)> {
        let notes = self.abort_stale(&o.key).await;
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(&o.key)
            .content_type(o.content_type())
            .cache_control(CACHE_CONTROL)
            .metadata("sha256", &o.sha256)
            .checksum_algorithm(ChecksumAlgorithm::Sha256)
            .send()
            .await
            .map_err(|e| self.s3_err("CreateMultipartUpload", &o.key, describe(&e)))?;
        let Some(upload_id) = created.upload_id().map(str::to_owned) else {
            let why = SdkFailure::Other("no upload id in the answer".into());
            return Err(self.s3_err("CreateMultipartUpload", &o.key, why));
        };
        let sent = match self.send_parts(o, part, &upload_id, progress).await {
            Ok(parts) => self.complete(o, &upload_id, parts, fresh).await,
            Err(e) => Err(e),
        };
        if !matches!(sent, Ok(Sent::Parts(_))) {
            self.abort(&o.key, &upload_id).await;
        }
        sent.map(|s| (s, notes))
    }

    async fn complete(
        &self,
        o: &LocalObject,
        upload_id: &str,
        parts: Vec<CompletedPart>,
        fresh: bool,
    ) -> Result<Sent> {
        let n = parts.len() as u64;
        let mut done = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(&o.key)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            );
        if fresh {
            done = done.if_none_match("*");
        }
        match done.send().await {
            Ok(_) => Ok(Sent::Parts(n)),
            Err(e) if fresh && precondition_failed(&e) => Ok(Sent::Taken),
            Err(e) => Err(self.s3_err("CompleteMultipartUpload", &o.key, describe(&e))),
        }
    }

    /// Aborts multipart uploads of `key` left by an interrupted run; returns
    /// a note for each that could not be listed or aborted.
    async fn abort_stale(&self, key: &str) -> Vec<String> {
        let list = self
            .client
            .list_multipart_uploads()
            .bucket(&self.bucket)
            .prefix(key)
            .send()
            .await;
        let list = match list {
            Ok(l) => l,
            Err(e) => {
                let why = match describe(&e) {
                    SdkFailure::Denied => "access denied".to_owned(),
                    SdkFailure::Unreachable(m) | SdkFailure::Other(m) => m,
                };
                return vec![format!(
                    "s3://{}/{key}: could not list stale multipart uploads to abort them ({why}); parts of an interrupted earlier run may still be stored: abort them in the provider's console or with a lifecycle rule",
                    self.bucket
                )];
            }
        };
        let mut notes = Vec::new();
        for u in list.uploads() {
            if u.key() == Some(key)
                && let Some(id) = u.upload_id()
                && let Err(e) = self.try_abort(key, id).await
            {
                notes.push(format!(
                    "s3://{}/{key}: stale multipart upload {id} could not be aborted: {e}",
                    self.bucket
                ));
            }
        }
        notes
    }

    async fn try_abort(&self, key: &str, upload_id: &str) -> Result<()> {
        self.client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| self.s3_err("AbortMultipartUpload", key, describe(&e)))
    }

    async fn abort(&self, key: &str, upload_id: &str) {
        if let Err(e) = self.try_abort(key, upload_id).await {
            tracing::warn!("{e}");
        }
    }

    /// Reads the parts in order from one file handle, hashing each alone
    /// and the whole file as they go, and sends up to `concurrency` at
    /// once. The whole digest must be the recorded one, else nothing is
    /// completed.
    async fn send_parts(
        &self,
        o: &LocalObject,
        part: u64,
        upload_id: &str,
        progress: &dyn Progress,
    ) -> Result<Vec<CompletedPart>> {
        let (file, _) = gkq_files::open_regular(&o.path, gkq_files::Follow::No)?;
        let mut file = tokio::fs::File::from_std(file);
        let count = o.bytes.div_ceil(part);
        let permits = Arc::new(Semaphore::new(self.opts.concurrency.max(1)));
        let mut tasks: JoinSet<Result<(CompletedPart, u64)>> = JoinSet::new();
        let mut parts = Vec::with_capacity(count as usize);
        let mut whole = Sha256::new();
        let mut collect = |done: std::result::Result<Result<(CompletedPart, u64)>, _>| {
            let (p, len) =
                done.map_err(|e| UploadError::Options(format!("part task failed: {e}")))??;
            progress.advance(len);
            parts.push(p);
            Ok::<_, UploadError>(())
        };
        for n in 1..=count {
            let permit = permits.clone().acquire_owned().await.expect("never closed");
            let offset = (n - 1) * part;
            let len = part.min(o.bytes - offset);
            let bytes = match read_at(&mut file, offset, len).await {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    let now = tokio::fs::metadata(&o.path).await.map_or(0, |m| m.len());
                    return Err(self.changed(o, "unknown: it is shorter".into(), now));
                }
                Err(e) => return Err(io_err(&o.path, e)),
            };
            let (w, digest) = hash_part(whole, bytes.clone()).await;
            whole = w;
            let (me, key, id) = (self.clone(), o.key.clone(), upload_id.to_owned());
            tasks.spawn(async move {
                let _permit = permit;
                let p = me.send_part(&key, &id, n as i32, offset, bytes, digest);
                p.await.map(|p| (p, len))
            });
            // Surface failures early instead of queueing every part first.
            while let Some(done) = tasks.try_join_next() {
                collect(done)?;
            }
        }
        while let Some(done) = tasks.join_next().await {
            collect(done)?;
        }
        let digest = whole.finalize();
        let mut rest = [0u8; 1];
        let grown = file.read(&mut rest).await.map_err(|e| io_err(&o.path, e))? > 0;
        if hex(&digest) != o.sha256 || grown {
            let now = tokio::fs::metadata(&o.path).await.map_or(0, |m| m.len());
            return Err(self.changed(o, hex(&digest), now));
        }
        parts.sort_by_key(|p| p.part_number());
        Ok(parts)
    }

    /// One part under the store's retry runner (the one every request of
    /// the workspace runs under) with the uploader's policy, transient
    /// failures (timeouts, connection failures, 5xx, 429) retried, any
    /// other final; the SDK's own retries off for it. The SDK's attempt
    /// timeout bounds each attempt.
    async fn send_part(
        &self,
        key: &str,
        upload_id: &str,
        n: i32,
        offset: u64,
        bytes: Bytes,
        digest: [u8; 32],
    ) -> Result<CompletedPart> {
        let len = bytes.len() as u64;
        let what = format!("part {n} (bytes {offset}-{})", offset + len - 1);
        let runner = Runner::new(self.opts.retry, PART_DEADLINE, key, &what);
        let attempt = || {
            let put = self
                .client
                .upload_part()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .part_number(n)
                .content_length(len as i64)
                .checksum_sha256(b64(&digest))
                .body(ByteStream::from(bytes.clone()))
                .customize()
                .config_override(
                    aws_sdk_s3::Config::builder().retry_config(RetryConfig::disabled()),
                );
            async move {
                match put.send().await {
                    Ok(out) => Attempt::Done(
                        CompletedPart::builder()
                            .set_e_tag(out.e_tag().map(str::to_owned))
                            .checksum_sha256(b64(&digest))
                            .part_number(n)
                            .build(),
                    ),
                    Err(e) if transient(&e) => Attempt::Retry(Transient::msg(match describe(&e) {
                        SdkFailure::Denied => "access denied".to_owned(),
                        SdkFailure::Unreachable(m) | SdkFailure::Other(m) => m,
                    })),
                    Err(e) => Attempt::Fail(describe(&e)),
                }
            }
        };
        let on_timeout = || Transient::msg(format!("{what}: timed out"));
        runner.run(attempt, on_timeout).await.map_err(|o| {
            let failure = match o {
                Outcome::Failed(f) => f,
                Outcome::Exhausted { last, .. } => SdkFailure::Other(last.message),
            };
            let failure = match failure {
                SdkFailure::Other(m) => SdkFailure::Other(format!("{what}: {m}")),
                other => other,
            };
            self.s3_err("UploadPart", key, failure)
        })
    }
}

/// How long one attempt of a part may take: the SDK's own attempt timeout
/// (300 s) bounds it first; this only keeps a stuck attempt from lasting.
const PART_DEADLINE: Duration = Duration::from_secs(600);

/// `len` bytes of `file` at `offset`.
async fn read_at(file: &mut tokio::fs::File, offset: u64, len: u64) -> std::io::Result<Bytes> {
    file.seek(std::io::SeekFrom::Start(offset)).await?;
    let mut buf = BytesMut::zeroed(len as usize);
    file.read_exact(&mut buf).await?;
    Ok(buf.freeze())
}
