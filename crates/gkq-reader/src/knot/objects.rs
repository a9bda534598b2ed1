//! What a knot names, fetched and verified: block payloads (in parallel
//! parts, checked against their sha256), their values (a spectral block
//! reconstructed), and companion files (checked against `package.sha256`),
//! each through the disk cache by its digest.

use bytes::Bytes;
use gkq_format::{Encoding, RowsOf, hex};
use gkq_store::refetch::{Attempt, BYTES};
use gkq_store::{RangeRead, ReadCheck, ReadChecked, ReadOptions, StoreError};
use sha2::{Digest, Sha256};

use super::{KnotHandle, knot_err};
use crate::cache::{DiskCache, Kind, Size};
use crate::error::{ReaderError, Result};
use crate::verified::{Entry, cached, sha256_is};

use gkq_format::layout::MAX_COMPANION;
/// A companion file of at most this many bytes comes whole in one request
/// (configs; a tokenizer is fetched once its length is known).
const SMALL_COMPANION: u64 = 64 << 10;

/// A local row file is read in steps of about this many bytes (whole rows
/// with their records), into two buffers in turn: one is hashed and its
/// rows kept while the other is read. The peak holds the rows and the two
/// buffers, not the whole file with its records beside the rows (Gemma 3's
/// tied lm_head: 237 MB read for 178 MB of rows).
const STEP: u64 = 4 << 20;

/// The rows of the local row file `at` (`home`, FORMAT.md 7e), read in
/// steps of [`STEP`], hashed in order on the blocking pool while the next
/// step is read, and returned once the whole file's digest is the knot's;
/// a mismatch reads the file again once, then fails as the store's own
/// digest check fails (the file's range and both digests).
async fn rows_in_steps(
    store: &dyn RangeRead,
    at: &str,
    home: &gkq_format::ColumnarDescriptor,
) -> std::result::Result<Vec<u8>, StoreError> {
    let (len, want, stride) = (home.byte_len, home.sha256, home.stride().max(1));
    let cap = store.max_read_bytes();
    if len > cap {
        // refused before the rows' room is reserved, as any read over the cap
        return Err(StoreError::TooLarge {
            url: at.to_owned(),
            start: 0,
            end: len - 1,
            len,
            cap,
        });
    }
    let step = usize::try_from((STEP / stride).max(1) * stride).unwrap_or(usize::MAX);
    let opts = ReadOptions {
        total: Some(len),
        ..ReadOptions::default()
    };
    gkq_store::until_verified(store, BYTES, (), |(), _| async move {
        let task = |e: tokio::task::JoinError| StoreError::Client(format!("hash task: {e}"));
        let acc = (Sha256::new(), RowsOf::new(len, home.row_bytes, stride));
        // the step before (at first none) is hashed while this one is read
        let mut work = tokio::task::spawn_blocking(move || (acc, Vec::new()));
        let (mut off, mut buf) = (0u64, Vec::new());
        while off < len {
            buf.resize(step.min(usize::try_from(len - off).unwrap_or(step)), 0);
            let read = store.read_into(at, off, &mut buf, opts);
            let (got, done) = futures_util::future::join(read, work).await;
            let (mut acc, spare) = done.map_err(task)?;
            got?;
            off += buf.len() as u64;
            let full = std::mem::replace(&mut buf, spare);
            work = tokio::task::spawn_blocking(move || {
                // each piece rowed while it is still in cache from hashing
                for piece in full.chunks(64 << 10) {
                    acc.0.update(piece);
                    acc.1.push(piece);
                }
                (acc, full)
            });
        }
        let (acc, _) = work.await.map_err(task)?;
        let found = <[u8; 32]>::from(acc.0.finalize());
        if found == want {
            return Ok(Attempt::Verified(acc.1.finish()));
        }
        let end = len.saturating_sub(1);
        Ok(gkq_store::digest_mismatch(
            at,
            (0, end),
            (&want, &found),
            (),
        ))
    })
    .await
}

/// A digest mismatch of the store, named for what it was.
fn digest(what: String, e: StoreError) -> ReaderError {
    match e {
        StoreError::Digest {
            expected, found, ..
        } => ReaderError::Digest {
            what,
            expected,
            found,
        },
        e => e.into(),
    }
}

impl KnotHandle {
    /// The payload of block `index` (following an alias): from the disk
    /// cache, or read in parallel parts; checked against its sha256 either way.
    pub(crate) async fn payload(
        &self,
        index: usize,
        store: &dyn RangeRead,
        cache: Option<&DiskCache>,
    ) -> Result<Bytes> {
        let name = self.data_block(index)?.name.clone();
        if let Some((p, home)) = self.header.home_of(index) {
            let home = home.clone();
            return self.payload_from_home(&name, p, &home, store, cache).await;
        }
        let p = self.header.payload_of(index).ok_or_else(|| {
            ReaderError::Missing(format!("{}: block {name:?} has no payload", self.location))
        })?;
        let key = hex(&p.sha256);
        let entry = Entry {
            kind: Kind::Blob,
            key: &key,
            size: Size::Exact(p.len),
        };
        let fetch = || async {
            let t = std::time::Instant::now();
            let total = Some(self.header.preamble().file_len);
            let check = ReadCheck::Sha256(p.sha256);
            let bytes = store
                .read_checked(&self.location, (p.offset, p.len), total, check)
                .await
                .map_err(|e| {
                    let (start, end) = (p.offset, p.offset + p.len.saturating_sub(1));
                    let what = format!(
                        "{}: block {name:?} (bytes {start}-{end}, fetched twice)",
                        self.location
                    );
                    digest(what, e)
                })?;
            tracing::debug!(block = %name, bytes = p.len, ms = t.elapsed().as_millis() as u64, "block pulled and verified");
            Ok(bytes)
        };
        let cache = cache.filter(|_| self.remote);
        match cached(cache, entry, sha256_is(p.sha256), fetch).await {
            Err(e) => Err(self.another_knot(store, e).await),
            ok => ok,
        }
    }

    /// The payload of block `name` stored in its row file `home` (FORMAT.md
    /// 7e): the file whole, checked against its digest, less its records;
    /// through the disk cache by the payload's digest (which checks a
    /// cached copy).
    async fn payload_from_home(
        &self,
        name: &str,
        p: gkq_format::Payload,
        home: &gkq_format::ColumnarDescriptor,
        store: &dyn RangeRead,
        cache: Option<&DiskCache>,
    ) -> Result<Bytes> {
        let key = hex(&p.sha256);
        let entry = Entry {
            kind: Kind::Blob,
            key: &key,
            size: Size::Exact(p.len),
        };
        let at = self.sibling(&home.object);
        let fetch = || async {
            let what = || format!("{at}: the row file of block {name:?}");
            // the file's digest, from the knot, authenticates its rows: the
            // payload (FORMAT.md 7e), taken without a second pass
            if !self.remote {
                let rows = rows_in_steps(store, &at, home).await;
                return Ok(Bytes::from(rows.map_err(|e| digest(what(), e))?));
            }
            let check = ReadCheck::Sha256(home.sha256);
            let file = store
                .read_checked(&at, (0, home.byte_len), Some(home.byte_len), check)
                .await
                .map_err(|e| digest(what(), e))?;
            let rows = gkq_format::into_rows(Vec::from(file), home.row_bytes, home.stride());
            Ok(Bytes::from(rows))
        };
        let cache = cache.filter(|_| self.remote);
        match cached(cache, entry, sha256_is(p.sha256), fetch).await {
            Err(e) => Err(self.another_knot(store, e).await),
            ok => ok,
        }
    }

    /// A companion file of the package (`package.files`, docs/FORMAT.md
    /// 3.1: `config.json`, `tokenizer.json`, …), next to the knot, read whole
    /// and checked against the digest the knot records before it is returned.
    pub(crate) async fn package_file(
        &self,
        name: &str,
        store: &dyn RangeRead,
        cache: Option<&DiskCache>,
    ) -> Result<Bytes> {
        let files = self.header.header().package_files();
        let Some(&(_, want)) = files.iter().find(|(f, _)| *f == name) else {
            let names: Vec<&str> = files.iter().map(|(f, _)| *f).collect();
            return Err(ReaderError::NoPackageFile {
                location: self.location.clone(),
                name: name.to_owned(),
                listed: names.join(", "),
            });
        };
        // the format's digest spelling, checked (the header's validation
        // already refused any other)
        let sha = *gkq_format::KnotId::parse(want)
            .map_err(|e| knot_err(&self.location, e))?
            .digest();
        let at = self.sibling(name);
        let entry = Entry {
            kind: Kind::Blob,
            key: want,
            size: Size::AtMost(MAX_COMPANION),
        };
        let fetch = || async {
            // one request for a small file (config.json): no HEAD first
            let r = store.read_small_checked(&at, SMALL_COMPANION, sha).await;
            r.map_err(|e| match e {
                StoreError::NotFound { .. } => ReaderError::PackageFileAbsent {
                    name: name.to_owned(),
                    location: at.clone(),
                },
                e => digest(at.clone(), e),
            })
        };
        let cache = cache.filter(|_| self.remote);
        match cached(cache, entry, sha256_is(sha), fetch).await {
            Err(e @ ReaderError::Digest { .. }) => Err(self.another_knot(store, e).await),
            r => r,
        }
    }

    /// The values of block `index` (following an alias) as dense bytes in
    /// the block's dtype: the payload of a dense block, or the
    /// reconstruction of a spectral block (docs/FORMAT.md section 5), never
    /// the raw factors read as rows.
    pub(crate) async fn dense_values(
        &self,
        index: usize,
        store: &dyn RangeRead,
        cache: Option<&DiskCache>,
    ) -> Result<Bytes> {
        let block = self.data_block(index)?.clone();
        let bytes = self.payload(index, store, cache).await?;
        let Encoding::Spectral { .. } = block.encoding else {
            return Ok(bytes);
        };
        let location = self.location.clone();
        tokio::task::spawn_blocking(move || {
            gkq_format::reconstruct_spectral(&block, &bytes)
                .map(Bytes::from)
                .map_err(|e| knot_err(&location, e))
        })
        .await
        .map_err(|source| ReaderError::Task {
            what: "spectral reconstruction".into(),
            source,
        })?
    }
}
