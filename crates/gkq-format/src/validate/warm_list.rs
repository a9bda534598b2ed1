//! `columnar.warm` and `columnar.warm_rows` (docs/FORMAT.md section 7d).

use crate::error::{Error, Result};
use crate::layout::{MAX_LIST_LEN, row_number};
use crate::model::{Header, keys};

/// `columnar.warm` and `columnar.warm_rows` (section 7d): both or neither;
/// the first strictly ascending names of row files with a row proof; the
/// second 1..=`MAX_LIST_LEN` canonical decimals, strictly ascending, each
/// below every listed row file's `rows`.
pub(crate) fn validate_warm(h: &Header) -> Result<()> {
    let bad = Error::WarmMetadata;
    let (objects, rows) = match (
        h.meta_list(keys::COLUMNAR_WARM),
        h.meta_list(keys::COLUMNAR_WARM_ROWS),
    ) {
        (None, None) => return Ok(()),
        (Some(_), None) => {
            return Err(Error::ListIncomplete {
                present: keys::COLUMNAR_WARM,
                missing: keys::COLUMNAR_WARM_ROWS,
            });
        }
        (None, Some(_)) => {
            return Err(Error::ListIncomplete {
                present: keys::COLUMNAR_WARM_ROWS,
                missing: keys::COLUMNAR_WARM,
            });
        }
        (Some(o), Some(r)) => (o, r),
    };
    if rows.is_empty() || rows.len() > MAX_LIST_LEN as usize {
        return Err(bad(format!(
            "columnar.warm_rows has {} entries: 1 to {MAX_LIST_LEN} allowed",
            rows.len()
        )));
    }
    let mut last: Option<u64> = None;
    for s in rows {
        let Some(n) = row_number(s) else {
            return Err(bad(format!(
                "columnar.warm_rows entry {s:?} is not a canonical decimal row number"
            )));
        };
        if last.is_some_and(|l| l >= n) {
            return Err(bad(format!(
                "columnar.warm_rows must be strictly ascending ({n} after {})",
                last.unwrap_or_default()
            )));
        }
        last = Some(n);
    }
    let max = last.unwrap_or_default();
    if objects.is_empty() {
        return Err(bad(
            "columnar.warm lists no row file, while columnar.warm_rows lists rows".into(),
        ));
    }
    let files =
        super::listed_row_files(h, objects).map_err(|e| bad(format!("columnar.warm: {e}")))?;
    for d in files {
        if d.proof.is_none() {
            return Err(bad(format!(
                "columnar.warm: {:?} has no row proof (a version 2 descriptor)",
                d.object
            )));
        }
        if max >= d.rows {
            return Err(bad(format!(
                "columnar.warm_rows: row {max} is past the end of {:?} ({} rows)",
                d.object, d.rows
            )));
        }
    }
    Ok(())
}
