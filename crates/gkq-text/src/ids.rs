//! Warm sets and lists of ids.

use std::collections::HashMap;

use crate::{Result, TextError};

/// Counts sessions' ids one session at a time, for [`warm_set`]: memory
/// bounded by the distinct ids (the vocabulary), not by the corpus.
#[derive(Clone, Debug, Default)]
pub struct WarmCounter {
    count: HashMap<u32, (u64, u64)>,
    sessions: usize,
}

impl WarmCounter {
    /// Counts one session's ids.
    pub fn add(&mut self, session: &[u32]) {
        let mut seen = std::collections::HashSet::new();
        for &id in session {
            let c = self.count.entry(id).or_default();
            c.1 += 1;
            if seen.insert(id) {
                c.0 += 1;
            }
        }
        self.sessions += 1;
    }

    /// Sessions counted.
    pub fn sessions(&self) -> usize {
        self.sessions
    }

    /// The `k` ids the most sessions need (see [`warm_set`]).
    pub fn top(self, k: usize) -> Vec<u32> {
        let mut ranked: Vec<(u32, (u64, u64))> = self.count.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked.into_iter().take(k).map(|(id, _)| id).collect()
    }
}

/// The `k` ids the most sessions need, most needed first: ranked by the
/// number of sessions that hold the id (a node fetches a row once per
/// session at most, however often the session repeats it), then by
/// occurrences, then by the smaller id (so the set is reproducible).
/// Fewer than `k` when the sessions hold fewer distinct ids.
pub fn warm_set<'a>(sessions: impl IntoIterator<Item = &'a [u32]>, k: usize) -> Vec<u32> {
    let mut c = WarmCounter::default();
    for s in sessions {
        c.add(s);
    }
    c.top(k)
}

/// Token ids as written: a JSON array, a JSON object with a `warm_ids`
/// array (`gkq-report --json`), or decimals separated by commas and/or
/// white space, with `#` comments to the end of a line.
pub fn parse_ids(text: &str) -> Result<Vec<u64>> {
    let t = text.trim();
    if t.starts_with('[') || t.starts_with('{') {
        let v: serde_json::Value =
            serde_json::from_str(t).map_err(|e| TextError::BadIds(format!("not JSON: {e}")))?;
        let list = if v.is_array() { &v } else { &v["warm_ids"] };
        let Some(list) = list.as_array() else {
            return Err(TextError::BadIds(
                "a JSON object without a \"warm_ids\" array".into(),
            ));
        };
        return list
            .iter()
            .map(|x| {
                x.as_u64()
                    .ok_or_else(|| TextError::BadIds(format!("{x} is not a token id")))
            })
            .collect();
    }
    t.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.split(|c: char| c == ',' || c.is_whitespace()))
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u64>()
                .map_err(|_| TextError::BadIds(format!("bad token id {s:?}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_warm_set_counts_sessions_before_occurrences() {
        let a: &[u32] = &[5, 5, 5, 5, 1];
        let b: &[u32] = &[1, 2];
        let c: &[u32] = &[2, 9];
        // 1 and 2 are in two sessions each (and occur twice each: the
        // smaller id first), 5 in one session only, however often
        assert_eq!(warm_set([a, b, c], 3), [1, 2, 5]);
        assert_eq!(warm_set([a, b, c], 10), [1, 2, 5, 9]);
        assert!(warm_set([a], 0).is_empty());
    }

    #[test]
    fn ids_parse_in_every_written_form() {
        assert_eq!(parse_ids("1, 2 3\n4 # four\n").unwrap(), [1, 2, 3, 4]);
        assert_eq!(parse_ids("[7, 8]").unwrap(), [7, 8]);
        assert_eq!(
            parse_ids(r#"{"knot_id": "x", "warm_ids": [3, 1]}"#).unwrap(),
            [3, 1]
        );
        for bad in ["1, x", "[-1]", r#"{"other": 1}"#, "[1,"] {
            assert!(matches!(parse_ids(bad), Err(TextError::BadIds(_))), "{bad}");
        }
    }
}
