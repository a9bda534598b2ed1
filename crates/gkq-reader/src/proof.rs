//! Row proofs (FORMAT.md 7a) as the reader uses them, for both roles: the
//! chunk table of a row file's proof object (disk cache or one GET,
//! checked against the descriptor's Merkle root), and the part check that
//! verifies whole chunks of a row file as they arrive.

use std::sync::Arc;

use bytes::Bytes;
use gkq_format::merkle::{self, Hash, ProofLayout};
use gkq_format::{ColumnarDescriptor, hex};
use gkq_store::{RangeRead, ReadCheck, ReadOptions};

use crate::cache::{DiskCache, Kind, Size};
use crate::error::{ReaderError, Result};
use crate::verified::{Entry, cached};

/// The URL of the proof object of the row file at `url` (FORMAT.md 7a).
pub(crate) fn proof_url(url: &str) -> String {
    gkq_store::url::with_suffix(url, merkle::PROOF_SUFFIX)
}

/// The proof layout of `desc`, or why its rows cannot be verified.
pub(crate) fn layout(url: &str, desc: &ColumnarDescriptor) -> Result<ProofLayout> {
    merkle::layout_of(desc).ok_or_else(|| {
        ReaderError::Missing(format!(
            "{url}: the knot records no row proof for {}, so its rows cannot be verified",
            desc.object
        ))
    })
}

/// The chunk table failed its check: the row file's rows are unverifiable.
fn unverified(url: &str, e: gkq_format::Error) -> ReaderError {
    ReaderError::Unverified {
        url: url.to_owned(),
        via: format!(" (checked with the proof object {})", proof_url(url)),
        source: e.into(),
    }
}

/// The chunk table of the row file `desc` at `url`, checked against its
/// root: from the disk cache (by the root), or one GET of the proof
/// object's first bytes; with the bytes that GET moved (0 from the cache).
/// A table that fails is [`ReaderError::Unverified`]; a proof object that
/// cannot be read is the store's error (the fallback policy decides what
/// either means).
pub(crate) async fn chunk_table(
    store: &dyn RangeRead,
    disk: Option<&DiskCache>,
    url: &str,
    desc: &ColumnarDescriptor,
) -> Result<(Arc<Vec<Hash>>, u64)> {
    let l = layout(url, desc)?;
    let root = desc.proof.map(|p| hex(&p.root)).unwrap_or_default();
    let entry = Entry {
        kind: Kind::Table,
        key: &root,
        size: Size::Exact(l.table_len()),
    };
    let d = desc.clone();
    let check = move |b: &[u8]| merkle::check_table(&d, b).is_ok();
    let purl = proof_url(url);
    let fetched = std::sync::atomic::AtomicU64::new(0);
    let table = cached(disk, entry, check, || async {
        let opts = ReadOptions {
            total: merkle::proof_object_len(desc),
            ..Default::default()
        };
        let (fetched, purl) = (&fetched, &purl);
        let last = l.table_len() - 1;
        // a table that fails is fetched again (gkq-store's one loop)
        gkq_store::until_verified(store, gkq_store::refetch::BYTES, (), |(), _| async move {
            let t = store.read_vec(purl, 0, last, opts).await?;
            fetched.fetch_add(t.len() as u64, std::sync::atomic::Ordering::Relaxed);
            Ok(match merkle::check_table(desc, &t) {
                Ok(_) => gkq_store::Attempt::Verified(Bytes::from(t)),
                Err(e) => gkq_store::Attempt::Failed {
                    culprits: vec![(purl.clone(), (0, last))],
                    reason: e.to_string(),
                    error: unverified(url, e),
                    state: (),
                },
            })
        })
        .await
    })
    .await?;
    let roots = merkle::check_table(desc, &table).map_err(|e| unverified(url, e))?;
    Ok((Arc::new(roots), fetched.into_inner()))
}

/// The check of a parallel read of the whole row file: parts of whole
/// chunks, each verified against `roots` as it arrives.
pub(crate) fn chunks_check(
    desc: &ColumnarDescriptor,
    l: ProofLayout,
    roots: Arc<Vec<Hash>>,
) -> ReadCheck {
    let align = l.chunk_rows().saturating_mul(desc.row_bytes).max(1);
    let d = desc.clone();
    ReadCheck::Parts {
        align,
        check: Arc::new(move |off: u64, bytes: &[u8]| {
            let first = off / align;
            for (k, c) in bytes
                .chunks(usize::try_from(align).unwrap_or(usize::MAX))
                .enumerate()
            {
                merkle::check_chunk(&d, &roots, first + k as u64, c)?;
            }
            Ok(())
        }),
    }
}
