//! The GKQ v2 knot format.
//!
//! The normative specification is `docs/FORMAT.md` at the root of the
//! repository; this crate implements it and nothing else.
//!
//! **Invariant:** this is the only crate that knows the byte layout of a knot,
//! and it does no I/O of its own: the parser works on byte slices (an mmap, or
//! a prefix fetched over HTTP), and the writer on any `Write + Seek`.
//!
//! - [`parse_prefix`]: learn the header from the first bytes of a knot, or how
//!   many bytes are still needed (what a remote reader uses).
//! - [`Knot::parse`]: validate a whole knot held in memory, then borrow its
//!   payloads without copying.
//! - [`KnotWriter`]: write a knot from streamed payloads, hashing as it writes.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

pub mod arch;
mod cast;
mod dtype;
mod error;
mod figures;
pub mod gguf;
mod id;
mod knot;
pub mod layout;
pub mod merkle;
mod model;
mod objects;
mod parse;
pub mod progress;
pub mod quant;
pub mod runs;
pub mod sig;
mod spectral;
mod validate;
pub mod warm;
mod write;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod testutil;

pub use cast::{CastReport, cast_row, decode_f32, first_inexact, max_abs_diff};
pub use dtype::DType;
pub use error::{Error, Result, error_chain, root_cause};
pub use id::KnotId;
pub use knot::{
    Knot, KnotHeader, Prefix, RowsOf, check_payload_digest, check_row_file_digest,
    check_row_file_len, into_rows, parse_prefix, prefix_id,
};
pub use model::{
    BLOCK_EXACT, Block, COLUMNAR_ELIGIBLE, ColumnarDescriptor, Encoding, Header, IN_ROW_FILE,
    INLINE_PROOF, KNOT_NAME, Metadata, Payload, Preamble, Quant, QuantFigure, Role, RowProof,
    SOURCE_EXACT, SpectralFigure, Value, keys, rows_object_name, shape_bytes,
};
pub use objects::{ObjectKind, PackageObject};
pub use quant::QUANTIZED;
pub use spectral::{FrobeniusError, SpectralParts, decimal, reconstruct_spectral};
pub use write::{KnotWriter, encode_prefix};

/// Lowercase hex of a digest, as stored in `source.sha256`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len().saturating_mul(2));
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}
