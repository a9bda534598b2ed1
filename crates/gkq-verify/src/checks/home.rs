//! Blocks stored in their row file (FORMAT.md 7e): each one's home row
//! file opened once (regular, of the length the knot gives), and a block's
//! payload read from wherever it is, a range at a time: from the knot's
//! map, or from the home row file with the records dropped. Memory stays
//! one range, as for the knot.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use gkq_format::{Block, Encoding, Knot};

use crate::files::open_regular;
use crate::report::{CheckFindings, Finding};

/// A block's home row file, open.
pub(crate) struct HomeFile {
    file: File,
    row_bytes: u64,
    stride: u64,
}

/// The home row files of the blocks stored in them, by block index, or
/// why one could not be opened.
pub(crate) struct Homes(HashMap<usize, Result<HomeFile, String>>);

/// Where a block's payload is read from.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// The knot's map.
    Knot(&'a [u8]),
    /// A home row file.
    Home(&'a HomeFile),
}

/// The buffers a read from a home row file uses: what was read (rows and
/// records), and the rows.
#[derive(Default)]
pub(crate) struct Buffers {
    raw: Vec<u8>,
    rows: Vec<u8>,
}

impl Source<'_> {
    /// Bytes `start..start + n` of the payload (whole rows for a home row
    /// file), in `bufs` when they must be read.
    pub(crate) fn read<'b>(
        &'b self,
        start: u64,
        n: usize,
        bufs: &'b mut Buffers,
    ) -> std::io::Result<&'b [u8]> {
        let home = match self {
            Source::Knot(p) => {
                let at = usize::try_from(start).unwrap_or(usize::MAX);
                return Ok(p.get(at..at.saturating_add(n)).unwrap_or_default());
            }
            Source::Home(h) => h,
        };
        let (rb, stride) = (home.row_bytes.max(1), home.stride);
        let first = start / rb;
        let rows = (start + n as u64).div_ceil(rb) - first;
        bufs.raw
            .resize(usize::try_from(rows * stride).unwrap_or(0), 0);
        home.file.read_exact_at(&mut bufs.raw, first * stride)?;
        bufs.rows.clear();
        for s in bufs.raw.chunks(stride.max(1) as usize) {
            bufs.rows
                .extend_from_slice(&s[..(rb as usize).min(s.len())]);
        }
        let skip = (start - first * rb) as usize;
        Ok(bufs.rows.get(skip..skip + n).unwrap_or_default())
    }
}

impl Homes {
    /// Opens the home row file of every block of `knot` stored in one in
    /// `dir`.
    pub(crate) fn load(knot: &Knot<'_>, dir: &Path) -> Homes {
        let mut out = HashMap::new();
        for (i, b) in knot.blocks().iter().enumerate() {
            if matches!(b.encoding, Encoding::Alias { .. }) {
                continue;
            }
            let Some((_, home)) = knot.header().home_of(i) else {
                continue;
            };
            let opened = open_regular(&dir.join(&home.object)).map_err(|e| e.to_string());
            let checked = opened.and_then(|(file, len)| match len == home.byte_len {
                true => Ok(HomeFile {
                    file,
                    row_bytes: home.row_bytes,
                    stride: home.stride(),
                }),
                false => Err(format!("{len} bytes, the knot gives {}", home.byte_len)),
            });
            out.insert(i, checked);
        }
        Homes(out)
    }

    /// Where block `index`'s payload is (following an alias): the knot,
    /// or its home row file; `None` for none that can be read.
    pub(crate) fn source<'a>(&'a self, knot: &Knot<'a>, index: usize) -> Option<Source<'a>> {
        if let Some(p) = knot.payload(index) {
            return Some(Source::Knot(p));
        }
        let data = match knot.blocks().get(index).map(|b| &b.encoding) {
            Some(Encoding::Alias { target }) => usize::try_from(*target).ok()?,
            _ => index,
        };
        self.0.get(&data)?.as_ref().ok().map(Source::Home)
    }

    /// Reports into `acc` why block `index` (`block`) cannot be checked, if
    /// it is stored in a row file that could not be opened.
    pub(crate) fn report(&self, index: usize, block: &Block, acc: &mut CheckFindings) {
        let Some(Err(reason)) = self.0.get(&index) else {
            return;
        };
        acc.fail(
            format!("block {}", block.name),
            unreadable(block, reason.clone()),
        );
    }
}

/// The finding of `block`, whose home row file cannot be read (`reason`).
pub(crate) fn unreadable(block: &Block, reason: String) -> Finding {
    Finding::HomeUnreadable {
        block: block.name.clone(),
        object: block.home().map(|d| d.object.clone()).unwrap_or_default(),
        reason,
    }
}
