//! The dense fallback, one policy for both roles (FORMAT.md 7a): when the
//! columnar path fails in a way the knot's dense block avoids, the node
//! loads the block (which `payload_sha256` authenticates) and says why; a
//! failure the dense block would meet too (an unreachable server, a
//! timeout, a server that keeps failing) is reported as what it is.

use gkq_store::StoreError;

use crate::error::ReaderError;

/// Whether a failure of the columnar path (a row file, its proof or runs
/// object) means: read the dense block instead. The same rule for the
/// embedding's rows and the lm_head's pull.
pub(crate) fn falls_back(e: &ReaderError) -> bool {
    match e {
        ReaderError::Unverified { .. } => true,
        ReaderError::Shared(inner) => falls_back(inner),
        ReaderError::Store(s) => matches!(
            s,
            StoreError::IgnoresRange { .. }
                | StoreError::NotFound { .. }
                | StoreError::Status { .. }
                | StoreError::Redirect { .. }
                | StoreError::ContentRange { .. }
                | StoreError::BodyLength { .. }
                | StoreError::PastEnd { .. }
                | StoreError::ObjectLength { .. }
                | StoreError::NoLength { .. }
                | StoreError::PartCheck { .. }
                | StoreError::Io { .. }
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(e: StoreError) -> ReaderError {
        ReaderError::Store(e)
    }

    /// The policy as a table: each failure and what it means, for the
    /// embedding's rows and the lm_head's pull alike (both ask this one
    /// function; before, the lm_head fell back on Status, Redirect,
    /// ContentRange, BodyLength and Io errors and the embedding did not).
    #[test]
    fn the_policy_is_one_table_for_both_roles() {
        let u = || "http://h/a.rows".to_owned();
        let table: Vec<(&str, ReaderError, bool)> = vec![
            (
                "ignores Range",
                store(StoreError::IgnoresRange {
                    url: u(),
                    start: 0,
                    end: 9,
                }),
                true,
            ),
            (
                "404",
                store(StoreError::NotFound {
                    url: u(),
                    how: "HTTP 404".into(),
                }),
                true,
            ),
            (
                "403",
                store(StoreError::Status {
                    url: u(),
                    status: 403,
                    what: "GET".into(),
                    hint: None,
                }),
                true,
            ),
            (
                "redirect",
                store(StoreError::Redirect {
                    url: u(),
                    status: 301,
                    location: "/x".into(),
                }),
                true,
            ),
            (
                "Content-Range",
                store(StoreError::ContentRange {
                    url: u(),
                    expected: "a".into(),
                    found: "b".into(),
                }),
                true,
            ),
            (
                "short body",
                store(StoreError::BodyLength {
                    url: u(),
                    start: 0,
                    end: 9,
                    expected: 10,
                    found: 5,
                }),
                true,
            ),
            (
                "past the end",
                store(StoreError::PastEnd {
                    url: u(),
                    start: 0,
                    end: 9,
                    len: 5,
                }),
                true,
            ),
            (
                "wrong length",
                store(StoreError::ObjectLength {
                    url: u(),
                    expected: 10,
                    found: 5,
                }),
                true,
            ),
            (
                "no length",
                store(StoreError::NoLength {
                    url: u(),
                    what: "HEAD",
                }),
                true,
            ),
            (
                "a bad chunk",
                store(StoreError::PartCheck {
                    url: u(),
                    start: 0,
                    end: 9,
                    source: "x".into(),
                }),
                true,
            ),
            (
                "local I/O",
                store(StoreError::Io {
                    path: "a".into(),
                    error: std::io::Error::other("x"),
                }),
                true,
            ),
            (
                "unverified rows",
                ReaderError::Unverified {
                    url: u(),
                    via: String::new(),
                    source: "x".into(),
                },
                true,
            ),
            (
                "unreachable",
                store(StoreError::Transport {
                    url: u(),
                    message: "refused".into(),
                    attempts: 3,
                    timeout: false,
                    no_conversation: true,
                }),
                false,
            ),
            (
                "timeout",
                store(StoreError::Transport {
                    url: u(),
                    message: "timed out".into(),
                    attempts: 3,
                    timeout: true,
                    no_conversation: false,
                }),
                false,
            ),
            (
                "5xx after retries",
                store(StoreError::Transport {
                    url: u(),
                    message: "HTTP 503".into(),
                    attempts: 3,
                    timeout: false,
                    no_conversation: false,
                }),
                false,
            ),
            (
                "credentials in the URL",
                store(StoreError::CredentialsInUrl { url: u() }),
                false,
            ),
            (
                "out of range id",
                ReaderError::TokenOutOfRange { id: 9, vocab: 2 },
                false,
            ),
        ];
        for (what, e, dense) in table {
            assert_eq!(falls_back(&e), dense, "{what}");
            let shared = ReaderError::Shared(std::sync::Arc::new(e));
            assert_eq!(falls_back(&shared), dense, "shared: {what}");
        }
    }
}
