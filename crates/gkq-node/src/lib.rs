//! The node tools' work (`src/bin/` holds their flags and output):
//! `export` writes a package as a GGUF, `report` computes and measures the
//! bandwidth a workload costs; each returns values and [`NodeError`]s. The
//! tools that are a reader's lookups (`gkq-rows`, `gkq-inspect`) and the
//! mirror engine's front (`gkq-mirror`) are wholly binaries.

mod error;
pub mod export;
pub mod report;

pub use error::NodeError;
