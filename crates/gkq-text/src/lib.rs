//! Texts as a node sees them, for the tools that reason about which rows
//! sessions need (`gkq-report`, `gkq-pack --warm-corpus`):
//!
//! - [`Workload::load`]: a text file is one workload named by its stem; a
//!   `.txt` (or any other) file is one session, a `.jsonl` file one session
//!   per line, `{"text": …}` or `{"messages": [{"role", "content"}…]}`
//!   (joined as `role: content` lines: tokenizer.json carries no chat
//!   template);
//! - [`Tokenizer`]: a package's `tokenizer.json` with padding and
//!   truncation off and special tokens added, as a node tokenizes; one
//!   with more ids than the embedding has rows is refused;
//! - [`warm_set`]: the ids the most sessions need;
//! - [`parse_ids`]: a list of ids as people and tools write them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What went wrong with a text, a tokenizer or a list of ids.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TextError {
    /// A file could not be read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// A text file is not UTF-8.
    #[error("{}: not UTF-8 text ({error})", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Where it stops being UTF-8.
        #[source]
        error: std::string::FromUtf8Error,
    },
    /// A line of a `.jsonl` workload is not a session.
    #[error("{}:{line}: {reason}", path.display())]
    BadLine {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// Why.
        reason: String,
    },
    /// A workload without text.
    #[error("{}: an empty workload (no text)", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// No workload files at all.
    #[error("no texts were given")]
    NoTexts,
    /// The tokenizer cannot be loaded or fails on a text.
    #[error("the tokenizer: {0}")]
    Tokenizer(String),
    /// The tokenizer has more ids than the embedding has rows.
    #[error(
        "the tokenizer has {ids} ids but the package's embedding has {rows} rows: not this package's tokenizer"
    )]
    TokenizerVocab {
        /// Ids of the tokenizer (added tokens included).
        ids: u64,
        /// Rows of the embedding.
        rows: u64,
    },
    /// A list of ids that does not parse.
    #[error("{0}")]
    BadIds(String),
}

/// `Result` with [`TextError`].
pub type Result<T, E = TextError> = std::result::Result<T, E>;

/// One workload: a name and the text of each session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// The file's stem.
    pub name: String,
    /// One text per session.
    pub sessions: Vec<String>,
}

impl Workload {
    /// Reads a workload file (see the crate docs); a file with no text is
    /// [`TextError::Empty`].
    pub fn load(path: &Path) -> Result<Workload> {
        let bytes = std::fs::read(path).map_err(|error| TextError::Io {
            path: path.to_owned(),
            error,
        })?;
        let text = String::from_utf8(bytes).map_err(|error| TextError::NotUtf8 {
            path: path.to_owned(),
            error,
        })?;
        let sessions = if path.extension().is_some_and(|e| e == "jsonl") {
            jsonl_sessions(path, &text)?
        } else {
            vec![text]
        };
        if sessions.iter().all(|t| t.trim().is_empty()) {
            return Err(TextError::Empty {
                path: path.to_owned(),
            });
        }
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Workload { name, sessions })
    }

    /// Every file of `paths`, in order; none at all is [`TextError::NoTexts`].
    pub fn load_all(paths: &[PathBuf]) -> Result<Vec<Workload>> {
        if paths.is_empty() {
            return Err(TextError::NoTexts);
        }
        paths.iter().map(|p| Workload::load(p)).collect()
    }
}

fn jsonl_sessions(path: &Path, text: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| TextError::BadLine {
            path: path.to_owned(),
            line: n + 1,
            reason,
        };
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        out.push(
            session_text(&v)
                .ok_or_else(|| bad("neither {\"text\"} nor {\"messages\"}".to_owned()))?,
        );
    }
    Ok(out)
}

fn session_text(v: &serde_json::Value) -> Option<String> {
    if let Some(t) = v["text"].as_str() {
        return Some(t.to_owned());
    }
    let msgs = v["messages"].as_array()?;
    let lines: Vec<String> = msgs
        .iter()
        .map(|m| {
            let role = m["role"].as_str().unwrap_or("");
            let content = m["content"].as_str().unwrap_or("");
            format!("{role}: {content}")
        })
        .collect();
    Some(lines.join("\n"))
}

/// A package's tokenizer, as a node uses it (feature `tokenizer`).
#[cfg(feature = "tokenizer")]
pub struct Tokenizer(tokenizers::Tokenizer);

#[cfg(feature = "tokenizer")]
impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("ids", &self.0.get_vocab_size(true))
            .finish()
    }
}

#[cfg(feature = "tokenizer")]
impl Tokenizer {
    /// The tokenizer of `tokenizer.json` bytes, for an embedding of `rows`
    /// rows: padding and truncation off; more ids than rows is
    /// [`TextError::TokenizerVocab`].
    pub fn from_bytes(json: &[u8], rows: u64) -> Result<Tokenizer> {
        let mut t = tokenizers::Tokenizer::from_bytes(json)
            .map_err(|e| TextError::Tokenizer(e.to_string()))?;
        t.with_padding(None);
        t.with_truncation(None)
            .map_err(|e| TextError::Tokenizer(e.to_string()))?;
        let ids = t.get_vocab_size(true) as u64;
        if ids > rows {
            return Err(TextError::TokenizerVocab { ids, rows });
        }
        Ok(Tokenizer(t))
    }

    /// The ids of `text`, special tokens added as the tokenizer adds them.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .0
            .encode(text, true)
            .map_err(|e| TextError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Every session of every workload, tokenized: `(name, ids per session)`.
    pub fn encode_all(&self, workloads: &[Workload]) -> Result<Vec<(String, Vec<Vec<u32>>)>> {
        workloads
            .iter()
            .map(|w| {
                let ids: Result<Vec<Vec<u32>>> =
                    w.sessions.iter().map(|s| self.encode(s)).collect();
                Ok((w.name.clone(), ids?))
            })
            .collect()
    }
}

/// The `k` ids the most sessions need, most needed first: ranked by the
/// number of sessions that hold the id (a node fetches a row once per
/// session at most, however often the session repeats it), then by
/// occurrences, then by the smaller id (so the set is reproducible).
/// Fewer than `k` when the sessions hold fewer distinct ids.
pub fn warm_set<'a>(sessions: impl IntoIterator<Item = &'a [u32]>, k: usize) -> Vec<u32> {
    let mut count: HashMap<u32, (u64, u64)> = HashMap::new();
    for s in sessions {
        let mut seen = std::collections::HashSet::new();
        for &id in s {
            let c = count.entry(id).or_default();
            c.1 += 1;
            if seen.insert(id) {
                c.0 += 1;
            }
        }
    }
    let mut ranked: Vec<(u32, (u64, u64))> = count.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.into_iter().take(k).map(|(id, _)| id).collect()
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

    #[test]
    fn workloads_load_by_kind_and_refuse_bad_text() {
        let dir = tempfile::tempdir().unwrap();
        let txt = dir.path().join("prose.txt");
        std::fs::write(&txt, "Hello there.").unwrap();
        let jsonl = dir.path().join("chat.jsonl");
        std::fs::write(
            &jsonl,
            "{\"text\": \"a\"}\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
        )
        .unwrap();
        let w = Workload::load_all(&[txt, jsonl.clone()]).unwrap();
        assert_eq!(w[0].name, "prose");
        assert_eq!(w[1].sessions, ["a", "user: hi"]);
        let bin = dir.path().join("bin.txt");
        std::fs::write(&bin, [0xff, 0xfe]).unwrap();
        assert!(matches!(
            Workload::load(&bin),
            Err(TextError::NotUtf8 { .. })
        ));
        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, " \n").unwrap();
        assert!(matches!(
            Workload::load(&empty),
            Err(TextError::Empty { .. })
        ));
        std::fs::write(&jsonl, "{\"x\": 1}\n").unwrap();
        assert!(matches!(
            Workload::load(&jsonl),
            Err(TextError::BadLine { line: 1, .. })
        ));
        assert!(matches!(Workload::load_all(&[]), Err(TextError::NoTexts)));
    }
}
