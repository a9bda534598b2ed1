//! A knot opened from a local path (mmap) or an http(s) URL (header by at
//! most two range requests; blocks fetched on demand and checked against
//! their sha256).

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use gkq_format::{Block, Encoding, KnotHeader, Prefix, parse_prefix};
use sha2::{Digest, Sha256};

use crate::error::{ReaderError, Result};
use gkq_store::Store as Http;

/// First range fetched from a remote knot: most headers fit.
pub(crate) const FIRST_FETCH: u64 = 64 * 1024;

enum Where {
    Local { map: memmap2::Mmap },
    Remote { url: String },
}

/// An opened knot.
pub struct KnotHandle {
    location: String,
    header: KnotHeader,
    place: Where,
}

impl std::fmt::Debug for KnotHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KnotHandle")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

fn knot_err(location: &str, e: gkq_format::Error) -> ReaderError {
    ReaderError::Knot {
        location: location.to_owned(),
        error: Box::new(e),
    }
}

/// Whether `location` is a URL (`http://`, `https://`, `s3://`) rather than a path.
pub fn is_url(location: &str) -> bool {
    gkq_store::is_remote(location)
}

impl KnotHandle {
    /// Opens `location`: a path, or an http(s) URL.
    pub fn open(location: &str, http: &Http) -> Result<KnotHandle> {
        if is_url(location) {
            return Self::open_remote(location, http);
        }
        let path = PathBuf::from(location);
        let file = File::open(&path).map_err(|error| ReaderError::Io {
            path: path.clone(),
            error,
        })?;
        // SAFETY: read-only map; the knot is an immutable published artefact.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|error| ReaderError::Io {
            path: path.clone(),
            error,
        })?;
        let knot = gkq_format::Knot::parse(&map).map_err(|e| knot_err(location, e))?;
        let header = knot.header().clone();
        Ok(KnotHandle {
            location: location.to_owned(),
            header,
            place: Where::Local { map },
        })
    }

    fn open_remote(url: &str, http: &Http) -> Result<KnotHandle> {
        // One ranged GET gives the first bytes and, in its Content-Range,
        // the knot's length: no HEAD round trip before it.
        let (first, total) = http.get_prefix(url, FIRST_FETCH)?;
        let header = match parse_prefix(&first).map_err(|e| knot_err(url, e))? {
            Prefix::Complete(h) => *h,
            Prefix::NeedBytes { total: need } => {
                if need > total {
                    return Err(knot_err(
                        url,
                        gkq_format::Error::HeaderTruncated {
                            header_end: need,
                            available: total,
                        },
                    ));
                }
                let mut all = first;
                all.extend(http.get_range_vec(url, all.len() as u64, need - 1, Some(total))?);
                match parse_prefix(&all).map_err(|e| knot_err(url, e))? {
                    Prefix::Complete(h) => *h,
                    Prefix::NeedBytes { total } => {
                        return Err(knot_err(
                            url,
                            gkq_format::Error::HeaderTruncated {
                                header_end: total,
                                available: all.len() as u64,
                            },
                        ));
                    }
                }
            }
        };
        if header.preamble().file_len != total {
            return Err(knot_err(
                url,
                gkq_format::Error::FileSize {
                    file_len: header.preamble().file_len,
                    actual: total,
                },
            ));
        }
        Ok(KnotHandle {
            location: url.to_owned(),
            header,
            place: Where::Remote {
                url: url.to_owned(),
            },
        })
    }

    /// Path or URL.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The validated header.
    pub fn header(&self) -> &KnotHeader {
        &self.header
    }

    /// Whether the knot is remote.
    pub fn is_remote(&self) -> bool {
        matches!(self.place, Where::Remote { .. })
    }

    /// Index of block `name`.
    pub fn index(&self, name: &str) -> Result<usize> {
        self.header.header().block_index(name).ok_or_else(|| {
            ReaderError::Missing(format!("{}: no block named {name:?}", self.location))
        })
    }

    /// The block holding the data of block `index` (an alias resolved).
    pub fn data_block(&self, index: usize) -> Result<&Block> {
        self.header.header().resolve(index).ok_or_else(|| {
            ReaderError::Missing(format!("{}: block {index} has no data", self.location))
        })
    }

    /// The payload of block `index` (following an alias), read whole and
    /// checked against its sha256. Remote knots fetch only that block.
    pub fn payload(&self, index: usize, http: &Http) -> Result<Arc<[u8]>> {
        let name = self.data_block(index)?.name.clone();
        let p = self.header.payload_of(index).ok_or_else(|| {
            ReaderError::Missing(format!("{}: block {name:?} has no payload", self.location))
        })?;
        let bytes: Vec<u8> = match &self.place {
            Where::Local { map } => map
                .get(p.offset as usize..(p.offset + p.len) as usize)
                .unwrap_or_default()
                .to_vec(),
            Where::Remote { url } if p.len > 0 => http.get_range_vec(
                url,
                p.offset,
                p.offset + p.len - 1,
                Some(self.header.preamble().file_len),
            )?,
            Where::Remote { .. } => Vec::new(),
        };
        let digest: [u8; 32] = Sha256::digest(&bytes).into();
        if digest != p.sha256 {
            return Err(ReaderError::Digest {
                what: format!("{}: block {name:?}", self.location),
                expected: gkq_format::hex(&p.sha256),
                found: gkq_format::hex(&digest),
            });
        }
        Ok(bytes.into())
    }

    /// A companion file of the package (`package.files`, docs/FORMAT.md
    /// 3.1: `config.json`, `tokenizer.json`, …), next to the knot, read whole
    /// and checked against the digest the knot records before it is returned.
    pub fn package_file(&self, name: &str, http: &Http) -> Result<Vec<u8>> {
        let files = self.header.header().package_files();
        let Some(&(_, want)) = files.iter().find(|(f, _)| *f == name) else {
            let names: Vec<&str> = files.iter().map(|(f, _)| *f).collect();
            return Err(ReaderError::Missing(format!(
                "{}: the knot lists no package file {name:?} (package.files: {})",
                self.location,
                names.join(", ")
            )));
        };
        let (what, bytes) = match &self.place {
            Where::Local { .. } => {
                let path = PathBuf::from(&self.location)
                    .parent()
                    .map(|d| d.join(name))
                    .unwrap_or_else(|| PathBuf::from(name));
                let bytes = std::fs::read(&path).map_err(|error| ReaderError::Io {
                    path: path.clone(),
                    error,
                })?;
                (path.display().to_string(), bytes)
            }
            Where::Remote { url } => {
                let (path, rest) = url.split_at(url.find(['?', '#']).unwrap_or(url.len()));
                let base = path.rsplit_once('/').map_or(path, |(b, _)| b);
                let url = format!("{base}/{name}{rest}");
                let len = http.content_length(&url)?;
                let bytes = if len == 0 {
                    Vec::new()
                } else {
                    http.get_range_vec(&url, 0, len - 1, Some(len))?
                };
                (url, bytes)
            }
        };
        let found = gkq_format::hex(&Sha256::digest(&bytes));
        if found != want {
            return Err(ReaderError::Digest {
                what,
                expected: want.to_owned(),
                found,
            });
        }
        Ok(bytes)
    }

    /// The values of block `index` (following an alias) as dense bytes in
    /// the block's dtype: the payload of a dense block, or the
    /// reconstruction of a spectral block (docs/FORMAT.md section 5), never
    /// the raw factors read as rows.
    pub fn dense_values(&self, index: usize, http: &Http) -> Result<Arc<[u8]>> {
        let block = self.data_block(index)?;
        let bytes = self.payload(index, http)?;
        match block.encoding {
            Encoding::Spectral { .. } => gkq_format::reconstruct_spectral(block, &bytes)
                .map(Arc::from)
                .map_err(|e| knot_err(&self.location, e)),
            _ => Ok(bytes),
        }
    }
}
