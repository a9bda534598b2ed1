//! The words of a [`Resolution`]: rendered from its typed path and cause,
//! never stored, so that what a user reads and what a program tests are
//! one thing.

use gkq_format::ColumnarDescriptor;

use crate::resolve::{
    Checked, Choice, ColumnarPath, DenseCause, NoRuns, ReadPath, Resolution, Use,
};

impl Resolution {
    /// Why this path, and why not the ones before it, in words.
    pub fn reason(&self) -> String {
        render(self)
    }
}

/// The reason text of `r`.
fn render(r: &Resolution) -> String {
    match (&r.path, r.used) {
        (ReadPath::Spectral { rank }, Use::Rows) => format!(
            "spectral block of rank {rank}: never columnar; block_payload returns the factors untouched, and rows are reconstructed as U·diag(S)·Vt (FORMAT.md section 5)"
        ),
        (ReadPath::Spectral { rank }, Use::Resident) => format!(
            "spectral block of rank {rank}: reconstructed (FORMAT.md section 5) and kept resident"
        ),
        (ReadPath::Dense(cause), used) => dense(cause, used),
        (ReadPath::Columnar(c), Use::Rows) => rows(c),
        (ReadPath::Columnar(c), Use::Resident) => resident(&r.tensor, c),
    }
}

fn exactness(d: &ColumnarDescriptor, block_dtype: gkq_format::DType) -> String {
    match (d.is_block_exact(), d.dtype.is_quantized()) {
        (true, true) => format!("the {block_dtype} block's own quantized blocks"),
        (true, false) => format!("its values widen to the {block_dtype} block exactly"),
        (false, true) => format!(
            "lossy: the {block_dtype} block's values quantized to {} (no BLOCK_EXACT), taken because it was asked for",
            d.dtype
        ),
        (false, false) => {
            format!("NOT exact: its values differ from the {block_dtype} block's (no BLOCK_EXACT)")
        }
    }
}

/// Why this row file was chosen.
fn choice(c: &ColumnarPath) -> String {
    let d = &c.desc;
    match &c.choice {
        Choice::NamedByUrl => format!("{} named by the URL", d.object),
        Choice::Forced { flag, block_dtype } if *flag == "--lm-head-dtype" => {
            format!("forced by {flag}; {}", exactness(d, *block_dtype))
        }
        Choice::Forced { flag, block_dtype } => format!(
            "{} forced by {flag}; {}",
            d.object,
            exactness(d, *block_dtype)
        ),
        Choice::Narrowest {
            block_dtype,
            widest,
        } if d.row_bytes < *widest => {
            let of_source = if d.is_source_exact() {
                " and to the source's"
            } else {
                ""
            };
            format!(
                "{} rows are exact for this {block_dtype} block{of_source}: {} B/row instead of {widest}",
                d.dtype, d.row_bytes
            )
        }
        Choice::Narrowest { block_dtype, .. } if d.dtype.is_quantized() => format!(
            "{} rows: the block itself is {block_dtype}, so its rows are its own quantized blocks, scales inline ({} B/row)",
            d.dtype, d.row_bytes
        ),
        Choice::Narrowest { block_dtype, .. } => format!(
            "{} rows are the narrowest exact row file of the {block_dtype} block ({} B/row)",
            d.dtype, d.row_bytes
        ),
        Choice::Narrower {
            block_dtype,
            block_row,
        } => format!(
            "{} rows are exact for this {block_dtype} block: {} B/row instead of {block_row}, widened on the node",
            d.dtype, d.row_bytes
        ),
    }
}

fn rows(c: &ColumnarPath) -> String {
    let (url, d, why) = (&c.url, &c.desc, choice(c));
    let merkle = "every row verified against the knot's Merkle root";
    match &c.checked {
        Checked::Pinned { runs } => {
            let how = if runs.is_some() {
                "; each run of rows with its records in one range"
            } else {
                ""
            };
            format!(
                "{url}: {why}; the knot is pinned (--knot-id) and its header came from the cache, so the row file's length is not asked for; {merkle}{how}"
            )
        }
        Checked::Runs { len, stride, .. } if d.inline_proof() => format!(
            "{url}: {why}; each row followed by its record (FORMAT.md 7e; Content-Length {len} = {} rows × {stride} bytes of row and record): one range per run of rows, {merkle}",
            d.rows
        ),
        Checked::Runs {
            url: at,
            len,
            stride,
        } => format!(
            "{url}: {why}; fetched from its runs object {at} (Content-Length {len} = {} rows × {stride} bytes of row and record): one range per run of rows, {merkle}",
            d.rows
        ),
        Checked::RowFile { len, runs } => {
            let no_runs = match runs {
                None => String::new(),
                Some(NoRuns::Length { url: at, len, want }) => format!(
                    "; its runs object {at} has Content-Length {len} ≠ {want}, so rows and their records come from two objects"
                ),
                Some(NoRuns::Head { error }) => format!(
                    "; no runs object ({error}), so rows and their records come from two objects"
                ),
            };
            format!(
                "{url}: {why}; Content-Length {len} = {} rows × {} bytes; {merkle}{no_runs}",
                d.rows, d.row_bytes
            )
        }
        Checked::Chunks { chunk_rows } => format!(
            "{url}: {why}; pulled whole, every chunk of {chunk_rows} rows verified against the knot's Merkle root"
        ),
    }
}

fn resident(tensor: &str, c: &ColumnarPath) -> String {
    let chunk_rows = match c.checked {
        Checked::Chunks { chunk_rows } => chunk_rows,
        _ => 0,
    };
    format!(
        "{tensor} from {}: {}; pulled in parallel parts, every chunk of {chunk_rows} rows verified against the knot's Merkle root",
        c.url,
        choice(c)
    )
}

fn dense(cause: &DenseCause, used: Use) -> String {
    match cause {
        DenseCause::Asked => "the dense block was asked for (--dense)".into(),
        DenseCause::NotEligible { block } => {
            format!("block {block:?} does not have the COLUMNAR_ELIGIBLE flag")
        }
        DenseCause::UnknownRowFile { url, block, names } => {
            format!("{url} names none of the row files of {block:?} ({names})")
        }
        DenseCause::NoSuchDtype {
            flag,
            dtype,
            block,
            names,
        } => match used {
            Use::Rows => {
                format!("{flag} {dtype}: block {block:?} has no {dtype} row file ({names})")
            }
            Use::Resident => format!(
                "{flag} {dtype}: block {block:?} has no {dtype} row file: the dense block is pulled"
            ),
        },
        DenseCause::NoExact { block } => format!("block {block:?} has no BLOCK_EXACT row file"),
        DenseCause::NoProof { url } => match used {
            Use::Rows => format!(
                "{url}: the knot (format version 2) has no row proofs, so rows fetched by range cannot be verified (FORMAT.md 9a); repack with this gkq-pack"
            ),
            Use::Resident => format!(
                "{url}: the knot (format version 2) has no row proof, so it cannot be verified: the dense block is pulled"
            ),
        },
        DenseCause::Head { url, error, .. } => format!("HEAD {url} failed: {error}"),
        DenseCause::Length {
            url,
            len,
            expected,
            rows,
            row_bytes,
        } => format!(
            "{url}: Content-Length {len} ≠ expected {expected} ({rows} rows × {row_bytes} bytes)"
        ),
        DenseCause::Block {
            block,
            dtype,
            block_row,
        } if dtype.is_quantized() => format!(
            "block {block} pulled once, sha256-checked, and kept resident in its quantized form ({dtype}, {block_row} B/row; no exact row file is narrower), not widened"
        ),
        DenseCause::Block {
            block, block_row, ..
        } => format!(
            "block {block} pulled once, sha256-checked, and kept resident (no exact row file narrower than its {block_row} B/row)"
        ),
        DenseCause::FellBack { error } => format!("fell back to the dense block: {error}"),
    }
}
