//! Publishing: each object is skipped when the bucket already holds it
//! (same length and `x-amz-meta-sha256`), else sent with one PutObject or,
//! above the part size, as a multipart upload whose parts are read from
//! disk in order, several in flight, each retried with backoff; a failure
//! that ends a multipart upload aborts it. The bytes sent are hashed as they
//! are sent and must be the bytes the knot records, else the object is not
//! completed (and the knot not published). New objects are written with
//! `If-None-Match: *`, so a racing upload to the same prefix cannot replace
//! them unseen; after the knot, the prefix is listed and every object
//! checked with a HEAD. Objects go strictly in the given order: row files
//! and companion files first, the knot last, so a knot is never visible
//! before what it names.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde::Serialize;

use crate::error::{Result, UploadError};
use crate::local::LocalObject;

mod failure;
mod options;
mod send;

pub(crate) use failure::describe;
pub use options::{UPLOAD_RETRY, UploadOptions, part_size};
use send::Sent;
pub use send::Uploader;

pub use gkq_format::ObjectKind;

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
    /// What could not be done and was not needed for this object (stale
    /// multipart uploads that could not be listed or aborted).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

pub use gkq_format::progress::{NoProgress, Progress};

impl Uploader {
    /// Fails early when the endpoint is unreachable, the credentials are
    /// refused, or the bucket does not exist.
    pub async fn check_bucket(&self) -> Result<()> {
        match self.client.head_bucket().bucket(&self.bucket).send().await {
            Ok(_) => Ok(()),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_not_found()) => {
                Err(UploadError::NoBucket {
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

    /// The package objects (row files, proofs, knots) directly under
    /// `prefix`, with their lengths.
    pub async fn list_package(&self, prefix: &str) -> Result<BTreeMap<String, u64>> {
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(prefix)
            .into_paginator()
            .send();
        let mut found = BTreeMap::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| self.s3_err("ListObjectsV2", prefix, describe(&e)))?;
            for o in page.contents() {
                if let Some(key) = o.key()
                    && is_package_object(&key[prefix.len().min(key.len())..])
                {
                    found.insert(key.to_owned(), o.size().unwrap_or(0).max(0) as u64);
                }
            }
        }
        Ok(found)
    }

    /// How `o` stands against what the bucket holds: `None` when it holds
    /// `o` already, else a line describing the difference.
    fn differs(&self, o: &LocalObject, held: &Option<(u64, Option<String>)>) -> Option<String> {
        let (len, sha) = match held {
            None => return Some(format!("s3://{}/{}: no object", self.bucket, o.key)),
            Some((len, sha)) if *len == o.bytes && sha.as_deref() == Some(&o.sha256) => {
                return None;
            }
            Some(h) => h,
        };
        let published = sha
            .as_deref()
            .map_or("without x-amz-meta-sha256".to_owned(), |s| {
                format!("sha256 {s}")
            });
        Some(format!(
            "s3://{}/{}: published {published} ({len} bytes), local sha256 {} ({} bytes)",
            self.bucket, o.key, o.sha256, o.bytes
        ))
    }

    /// Publishes `objects` in order (row files, then the knot, then its
    /// signature when there is one).
    pub async fn publish(
        &self,
        objects: &[LocalObject],
        progress: &dyn Progress,
    ) -> Result<Vec<ObjectReport>> {
        let after_knot = objects
            .iter()
            .skip_while(|o| o.kind != ObjectKind::Knot)
            .skip(1);
        if after_knot.clone().any(|o| o.kind != ObjectKind::Signature) || after_knot.count() > 1 {
            return Err(UploadError::Options(
                "the knot must be the last object published, or be followed by its signature alone"
                    .into(),
            ));
        }
        let prefix = prefix_of(objects);
        let existing = self.precheck(objects, &prefix).await?;
        progress.start(objects.iter().map(|o| o.bytes).sum());
        let mut reports = Vec::new();
        for (o, exists) in objects.iter().zip(existing) {
            reports.push(self.publish_one(o, exists, progress).await?);
        }
        self.final_check(objects, &prefix).await?;
        Ok(reports)
    }

    /// Published prefixes are immutable (Cache-Control: immutable): finds
    /// every object that exists with other content, and every package
    /// object of the prefix this package does not name, before anything
    /// is sent. With `replace`, the foreign ones are deleted.
    async fn precheck(
        &self,
        objects: &[LocalObject],
        prefix: &str,
    ) -> Result<Vec<Option<(u64, Option<String>)>>> {
        let mut existing = Vec::new();
        let mut conflicts = Vec::new();
        for o in objects {
            let exists = self.head(&o.key).await?;
            if exists.is_some()
                && let Some(line) = self.differs(o, &exists)
            {
                conflicts.push(line);
            }
            existing.push(exists);
        }
        let ours: BTreeSet<&str> = objects.iter().map(|o| o.key.as_str()).collect();
        let foreign: Vec<String> = self
            .list_package(prefix)
            .await?
            .into_keys()
            .filter(|k| !ours.contains(k.as_str()))
            .collect();
        for k in &foreign {
            conflicts.push(format!(
                "s3://{}/{k}: published, and not part of this package",
                self.bucket
            ));
        }
        if !conflicts.is_empty() && !self.opts.replace {
            return Err(UploadError::WouldReplace {
                endpoint: self.endpoint.clone(),
                conflicts,
            });
        }
        for k in &foreign {
            self.client
                .delete_object()
                .bucket(&self.bucket)
                .key(k)
                .send()
                .await
                .map_err(|e| self.s3_err("DeleteObject", k, describe(&e)))?;
        }
        Ok(existing)
    }

    async fn publish_one(
        &self,
        o: &LocalObject,
        exists: Option<(u64, Option<String>)>,
        progress: &dyn Progress,
    ) -> Result<ObjectReport> {
        let t = Instant::now();
        let mut report = ObjectReport {
            key: o.key.clone(),
            bytes: o.bytes,
            sha256: o.sha256.clone(),
            status: "skipped",
            parts: 0,
            seconds: 0.0,
            notes: Vec::new(),
        };
        if exists.is_some() && self.differs(o, &exists).is_none() {
            progress.advance(o.bytes);
            report.seconds = t.elapsed().as_secs_f64();
            return Ok(report);
        }
        let fresh = exists.is_none();
        let part = part_size(o.bytes, self.opts.part_size)?;
        let sent = if o.bytes > part {
            let (sent, notes) = self.multipart(o, part, fresh, progress).await?;
            report.notes = notes;
            sent
        } else {
            self.single(o, fresh, progress).await?
        };
        let held = self.head(&o.key).await?;
        match (sent, self.differs(o, &held)) {
            (Sent::Parts(n), None) => {
                report.status = "uploaded";
                report.parts = n;
            }
            // Published by another upload in between, with these very bytes.
            (Sent::Taken, None) => progress.advance(o.bytes),
            (Sent::Taken, Some(_)) => {
                let (len, sha) = held.unwrap_or((0, None));
                return Err(UploadError::Raced {
                    bucket: self.bucket.clone(),
                    key: o.key.clone(),
                    expected: o.sha256.clone(),
                    found: format!(
                        "{len} bytes, sha256 {}",
                        sha.unwrap_or_else(|| "missing".into())
                    ),
                });
            }
            (Sent::Parts(_), Some(found)) => {
                return Err(UploadError::Mismatch {
                    bucket: self.bucket.clone(),
                    key: o.key.clone(),
                    expected: format!("{} bytes, sha256 {}", o.bytes, o.sha256),
                    found,
                });
            }
        }
        report.seconds = t.elapsed().as_secs_f64();
        Ok(report)
    }

    /// After the last object: the prefix holds exactly this package, each
    /// object with this package's length and digest.
    async fn final_check(&self, objects: &[LocalObject], prefix: &str) -> Result<()> {
        let mut problems = Vec::new();
        let ours: BTreeSet<&str> = objects.iter().map(|o| o.key.as_str()).collect();
        for k in self.list_package(prefix).await?.into_keys() {
            if !ours.contains(k.as_str()) {
                problems.push(format!(
                    "s3://{}/{k}: not part of this package",
                    self.bucket
                ));
            }
        }
        for o in objects {
            let held = self.head(&o.key).await?;
            problems.extend(self.differs(o, &held));
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(UploadError::Mixed {
            bucket: self.bucket.clone(),
            prefix: prefix.to_owned(),
            problems,
        })
    }
}

/// The prefix of a package: the knot's key up to its last `/` (or, without
/// a knot, the first object's).
fn prefix_of(objects: &[LocalObject]) -> String {
    let key = objects
        .iter()
        .find(|o| o.kind == ObjectKind::Knot)
        .or(objects.first())
        .map_or("", |o| o.key.as_str());
    key.rfind('/').map_or("", |i| &key[..=i]).to_owned()
}

/// A name a package object may have: `*.knot`, `*.rows`, `*.rows.proof`,
/// `*.rows.runs`, directly under the prefix.
fn is_package_object(name: &str) -> bool {
    !name.contains('/')
        && (name.ends_with(".knot")
            || name == gkq_format::sig::SIGNATURE_NAME
            || name.ends_with(".rows")
            || name.ends_with(".rows.proof")
            || name.ends_with(".rows.runs"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(key: &str, kind: ObjectKind) -> LocalObject {
        LocalObject {
            key: key.into(),
            path: std::path::PathBuf::from(key),
            bytes: 1,
            sha256: String::new(),
            kind,
        }
    }

    #[test]
    fn prefix_is_the_knots_directory() {
        let objs = [
            obj("m/v1/a.rows", ObjectKind::Rows),
            obj("m/v1/model.knot", ObjectKind::Knot),
        ];
        assert_eq!(prefix_of(&objs), "m/v1/");
        assert_eq!(prefix_of(&[obj("model.knot", ObjectKind::Knot)]), "");
        assert_eq!(prefix_of(&[]), "");
    }

    #[test]
    fn package_objects_are_knots_rows_and_proofs_at_the_top() {
        for yes in [
            "model.knot",
            "token_embd.bf16.rows",
            "token_embd.bf16.rows.proof",
        ] {
            assert!(is_package_object(yes), "{yes}");
        }
        for no in ["config.json", "v0/model.knot", "rows", "a.rows.bak"] {
            assert!(!is_package_object(no), "{no}");
        }
    }
}
