//! Pure functions from row ids to byte ranges. The cache and the HTTP layer
//! wrap these; nothing here does I/O.

/// A run of consecutive rows `[first, first + count)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowRun {
    /// First row.
    pub first: u64,
    /// Number of rows.
    pub count: u64,
}

impl RowRun {
    /// Whether `row` is in the run.
    pub fn contains(&self, row: u64) -> bool {
        row >= self.first && row < self.first + self.count
    }
}

/// Merges sorted, distinct row ids into runs. Two ids are in one run when at
/// most `max_gap` rows lie between them (those gap rows are fetched too: a
/// little extra beats another round trip). A run never exceeds `max_rows`
/// rows unless a single id does.
pub fn coalesce(sorted_ids: &[u64], max_gap: u64, max_rows: u64) -> Vec<RowRun> {
    let mut runs: Vec<RowRun> = Vec::new();
    for &id in sorted_ids {
        match runs.last_mut() {
            Some(r)
                if id >= r.first + r.count
                    && id - (r.first + r.count) <= max_gap
                    && id - r.first < max_rows.max(1) =>
            {
                r.count = id - r.first + 1;
            }
            _ => runs.push(RowRun {
                first: id,
                count: 1,
            }),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_and_gapped_rows_merge() {
        assert_eq!(
            coalesce(&[1, 2, 3], 0, 100),
            vec![RowRun { first: 1, count: 3 }]
        );
        assert_eq!(
            coalesce(&[1, 3], 0, 100),
            vec![RowRun { first: 1, count: 1 }, RowRun { first: 3, count: 1 }]
        );
        assert_eq!(
            coalesce(&[1, 3], 1, 100),
            vec![RowRun { first: 1, count: 3 }]
        );
        assert_eq!(
            coalesce(&[1, 5, 6, 20], 3, 100),
            vec![
                RowRun { first: 1, count: 6 },
                RowRun {
                    first: 20,
                    count: 1
                }
            ]
        );
        assert_eq!(coalesce(&[], 3, 100), vec![]);
    }

    #[test]
    fn runs_are_capped() {
        let ids: Vec<u64> = (0..10).collect();
        assert_eq!(
            coalesce(&ids, 0, 4),
            vec![
                RowRun { first: 0, count: 4 },
                RowRun { first: 4, count: 4 },
                RowRun { first: 8, count: 2 }
            ]
        );
    }

    #[test]
    fn a_run_contains_its_rows_only() {
        let r = RowRun { first: 2, count: 3 };
        assert!(r.contains(4) && !r.contains(5) && !r.contains(1));
    }
}
