//! Blocks stored in their row file (FORMAT.md 7e): each one's payload,
//! read once from its home row file (regular, of the length the knot
//! gives; its records dropped), for the checks that read payloads. Such a
//! payload is held in memory for the run, unlike the knot's, which is
//! mapped and released chunk by chunk.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use gkq_format::{Block, Encoding, Knot};

use crate::files::open_regular;
use crate::report::{CheckFindings, Finding};

/// The payloads of the blocks stored in their row files, by block index,
/// or why one could not be read.
pub(crate) struct Homes(HashMap<usize, Result<Vec<u8>, String>>);

impl Homes {
    /// Reads the payload of every block of `knot` stored in a row file of
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
            let path = dir.join(&home.object);
            let read = open_regular(&path).and_then(|(file, len)| {
                if len != home.byte_len {
                    return Err(std::io::Error::other(format!(
                        "{len} bytes, the knot gives {}",
                        home.byte_len
                    )));
                }
                let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
                file.take(len).read_to_end(&mut bytes)?;
                Ok(gkq_format::rows_of(&bytes, home.row_bytes, home.stride()))
            });
            out.insert(i, read.map_err(|e| e.to_string()));
        }
        Homes(out)
    }

    /// The index of the block that holds block `index`'s data (itself, or
    /// an alias's target).
    fn data_index(knot: &Knot<'_>, index: usize) -> usize {
        match knot.blocks().get(index).map(|b| &b.encoding) {
            Some(Encoding::Alias { target }) => usize::try_from(*target).unwrap_or(usize::MAX),
            _ => index,
        }
    }

    /// The payload of block `index` (following an alias): the knot's, or
    /// the one read from its row file.
    pub(crate) fn payload<'a>(&'a self, knot: &Knot<'a>, index: usize) -> Option<&'a [u8]> {
        knot.payload(index).or_else(|| {
            let got = self.0.get(&Self::data_index(knot, index))?;
            got.as_deref().ok()
        })
    }

    /// Reports into `acc` why block `index` (`block`) cannot be checked, if
    /// it is stored in a row file that could not be read.
    pub(crate) fn report(&self, index: usize, block: &Block, acc: &mut CheckFindings) {
        let Some(Err(reason)) = self.0.get(&index) else {
            return;
        };
        let object = block.home().map(|d| d.object.clone()).unwrap_or_default();
        let finding = Finding::HomeUnreadable {
            block: block.name.clone(),
            object,
            reason: reason.clone(),
        };
        acc.fail(format!("block {}", block.name), finding);
    }
}
