//! The recorded figures of section 3.1 (spectral blocks) and 3.5
//! (quantized blocks): three lists per kind, validated by one table rule.

use crate::error::{Error, Result};
use crate::model::{Block, Encoding, Header, keys};

/// A table of figures per block (section 3.1): three lists, all or none,
/// of the same length; the first names blocks of the kind `is_kind` says,
/// each once and in table order; the other two hold decimals with a finite
/// value (`shares`: the second one at most 1 as written).
struct FigureTable {
    keys: [&'static str; 3],
    kind: &'static str,
    is_kind: fn(&Block) -> bool,
    shares: bool,
    bad: fn(&'static str, String) -> Error,
}

impl FigureTable {
    fn validate(&self, h: &Header) -> Result<()> {
        let lists = self.keys.map(|k| (k, h.meta_list(k)));
        let present: Vec<_> = lists.iter().filter(|(_, l)| l.is_some()).collect();
        if present.is_empty() {
            return Ok(());
        }
        if let Some((missing, _)) = lists.iter().find(|(_, l)| l.is_none()) {
            return Err(Error::ListIncomplete {
                present: present.first().map_or("", |(k, _)| k),
                missing,
            });
        }
        let [(kb, Some(blocks)), (k1, Some(first)), (k2, Some(second))] = lists else {
            return Ok(());
        };
        if first.len() != blocks.len() || second.len() != blocks.len() {
            let reason = format!(
                "{} blocks but {} and {} figures",
                blocks.len(),
                first.len(),
                second.len()
            );
            return Err((self.bad)(kb, reason));
        }
        let mut previous: Option<usize> = None;
        for ((name, a), b) in blocks.iter().zip(first).zip(second) {
            let index = h
                .blocks
                .iter()
                .position(|b| b.name == *name && (self.is_kind)(b))
                .ok_or_else(|| {
                    (self.bad)(kb, format!("{name:?} is not a {} of the knot", self.kind))
                })?;
            if previous.is_some_and(|p| p >= index) {
                let reason = format!("{name:?} is listed twice or out of table order");
                return Err((self.bad)(kb, reason));
            }
            previous = Some(index);
            if !crate::spectral::is_figure(a, false) {
                let reason = format!("{name:?}: {a:?} is not a decimal with a finite f64 value");
                return Err((self.bad)(k1, reason));
            }
            if !crate::spectral::is_figure(b, self.shares) {
                let what = if self.shares {
                    "in [0, 1]"
                } else {
                    "with a finite f64 value"
                };
                return Err((self.bad)(
                    k2,
                    format!("{name:?}: {b:?} is not a decimal {what}"),
                ));
            }
        }
        Ok(())
    }
}

/// `spectral.blocks`, `spectral.rel_frobenius_error`, `spectral.energy_kept`
/// (the energy at most 1), and `quant.blocks`, `quant.rmse`,
/// `quant.max_abs_error` (section 3.5).
pub(crate) fn validate_figures(h: &Header) -> Result<()> {
    FigureTable {
        keys: [
            keys::SPECTRAL_BLOCKS,
            keys::SPECTRAL_REL_ERROR,
            keys::SPECTRAL_ENERGY,
        ],
        kind: "spectral block",
        is_kind: |b| matches!(b.encoding, Encoding::Spectral { .. }),
        shares: true,
        bad: |key, reason| Error::SpectralMetadata { key, reason },
    }
    .validate(h)?;
    FigureTable {
        keys: [
            keys::QUANT_BLOCKS,
            keys::QUANT_RMSE,
            keys::QUANT_MAX_ABS_ERROR,
        ],
        kind: "quantized dense block",
        is_kind: |b| b.dtype.is_quantized() && matches!(b.encoding, Encoding::Dense(_)),
        shares: false,
        bad: |key, reason| Error::QuantMetadata { key, reason },
    }
    .validate(h)
}
