//! Texts as a node sees them, for the tools that reason about which rows
//! sessions need (`gkq-report`, `gkq-pack --warm-corpus`):
//!
//! - [`Workload::load`]: a text file is one workload named by its stem; a
//!   `.txt` or `.md` file is one session, a `.jsonl` file one session per
//!   line, `{"text": …}` or `{"messages": [{"role", "content"}…]}`
//!   (joined as `role: content` lines); any other type is refused, naming
//!   these. A session is at most [`MAX_SESSION_BYTES`], and
//!   [`for_each_session`] streams a corpus one session at a time;
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
    /// A file refused before it is read (not a regular file).
    #[error(transparent)]
    File(#[from] gkq_files::FileError),
    /// A file type that is not a workload.
    #[error("{}: {found} is not a workload: give {WORKLOAD_TYPES}", path.display())]
    FileType {
        /// The file.
        path: PathBuf,
        /// What it is.
        found: String,
    },
    /// A session longer than [`MAX_SESSION_BYTES`].
    #[error("{}{}: a session of {len} bytes, over the limit of {MAX_SESSION_BYTES} bytes (1 MiB) for one session: split the text into sessions, one per line of a .jsonl file", path.display(), line.map_or_else(String::new, |l| format!(":{l}")))]
    SessionTooLong {
        /// The file.
        path: PathBuf,
        /// The line of a `.jsonl` file.
        line: Option<usize>,
        /// The session's (or the line's) bytes.
        len: u64,
    },
    /// Workloads that together hold more than [`MAX_WORKLOAD_BYTES`].
    #[error("{}: the texts reach {len} bytes here, over the limit of {MAX_WORKLOAD_BYTES} bytes (256 MiB) that a report holds in memory: give fewer or shorter texts", path.display())]
    WorkloadTooLong {
        /// The file where the total passed the limit.
        path: PathBuf,
        /// The total so far.
        len: u64,
    },
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

/// The longest session a node tokenizes (1 MiB of text, some 250,000
/// tokens: past any context length); a tokenizer needs about 100 bytes of
/// memory per byte of text, so this bounds what one session costs.
pub const MAX_SESSION_BYTES: u64 = 1 << 20;
/// The most text a loaded set of workloads may hold (256 MiB), for the
/// tools that keep every session (`gkq-report`); a corpus that is only
/// counted (`gkq-pack --warm-corpus`) is streamed and has no such limit.
pub const MAX_WORKLOAD_BYTES: u64 = 256 << 20;

/// The largest `tokenizer.json` read: 64 MiB (Gemma 3's, with 262,144
/// tokens and their merges, is about 33 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 64 << 20;

/// The file types a workload can be: `.txt` and `.md` (one session) and
/// `.jsonl` (one session per line).
pub const WORKLOAD_TYPES: &str = ".txt or .md (the file is one session), .jsonl (one session per line: {\"text\"} or {\"messages\"})";

/// How a workload file is read, from its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Text,
    Jsonl,
}

fn kind_of(path: &Path) -> Result<Kind> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    match ext.as_deref() {
        Some("txt" | "md" | "text") => Ok(Kind::Text),
        Some("jsonl") => Ok(Kind::Jsonl),
        other => Err(TextError::FileType {
            path: path.to_owned(),
            found: other.map_or_else(
                || "a file without an extension".to_owned(),
                |e| format!("a .{e} file"),
            ),
        }),
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TextError + '_ {
    move |error| TextError::Io {
        path: path.to_owned(),
        error,
    }
}

fn too_long(path: &Path, line: Option<usize>, len: u64) -> TextError {
    TextError::SessionTooLong {
        path: path.to_owned(),
        line,
        len,
    }
}

/// Calls `f` with the text of each session of the workload file `path`, in
/// order, holding one session at a time: a `.txt` file whole (at most
/// [`MAX_SESSION_BYTES`]), a `.jsonl` file line by line (each at most
/// that). Returns the number of sessions.
pub fn for_each_session(path: &Path, mut f: impl FnMut(&str) -> Result<()>) -> Result<usize> {
    use std::io::BufRead as _;
    let kind = kind_of(path)?;
    let (file, len) = gkq_files::open_regular(path, gkq_files::Follow::Yes)?;
    if kind == Kind::Text {
        if len > MAX_SESSION_BYTES {
            return Err(too_long(path, None, len));
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(file, len), &mut bytes)
            .map_err(io_err(path))?;
        let text = String::from_utf8(bytes).map_err(|error| TextError::NotUtf8 {
            path: path.to_owned(),
            error,
        })?;
        f(&text)?;
        return Ok(1);
    }
    // a line holds its session as a JSON string: escapes can double it
    let line_limit = 2 * MAX_SESSION_BYTES + 4096;
    let mut reader = std::io::BufReader::new(std::io::Read::take(file, len));
    let (mut n, mut count, mut buf) = (0usize, 0usize, Vec::new());
    loop {
        buf.clear();
        n += 1;
        let got = std::io::Read::take(&mut reader, line_limit + 1)
            .read_until(b'\n', &mut buf)
            .map_err(io_err(path))?;
        if got == 0 {
            return Ok(count);
        }
        if got as u64 > line_limit {
            return Err(too_long(path, Some(n), got as u64));
        }
        let line = std::str::from_utf8(&buf).map_err(|e| TextError::BadLine {
            path: path.to_owned(),
            line: n,
            reason: format!("not UTF-8 ({e})"),
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let text = jsonl_session(path, n, line)?;
        if text.len() as u64 > MAX_SESSION_BYTES {
            return Err(too_long(path, Some(n), text.len() as u64));
        }
        f(&text)?;
        count += 1;
    }
}

impl Workload {
    /// Reads a workload file (see the crate docs), at most
    /// [`MAX_WORKLOAD_BYTES`]; a file with no text is [`TextError::Empty`].
    pub fn load(path: &Path) -> Result<Workload> {
        kind_of(path)?;
        let (_, len) = gkq_files::open_regular(path, gkq_files::Follow::Yes)?;
        if len > MAX_WORKLOAD_BYTES {
            return Err(TextError::WorkloadTooLong {
                path: path.to_owned(),
                len,
            });
        }
        let mut sessions = Vec::new();
        for_each_session(path, |t| {
            sessions.push(t.to_owned());
            Ok(())
        })?;
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
        let mut total = 0u64;
        for p in paths {
            let (_, len) = gkq_files::open_regular(p, gkq_files::Follow::Yes)?;
            total = total.saturating_add(len);
            if total > MAX_WORKLOAD_BYTES {
                return Err(TextError::WorkloadTooLong {
                    path: p.clone(),
                    len: total,
                });
            }
        }
        paths.iter().map(|p| Workload::load(p)).collect()
    }
}

fn jsonl_session(path: &Path, n: usize, line: &str) -> Result<String> {
    let bad = |reason: String| TextError::BadLine {
        path: path.to_owned(),
        line: n,
        reason,
    };
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
    session_text(&v).ok_or_else(|| bad("neither {\"text\"} nor {\"messages\"}".to_owned()))
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

    /// The tokenizer in the `tokenizer.json` file `path` (at most
    /// [`MAX_TOKENIZER_BYTES`]), as [`Tokenizer::from_bytes`].
    pub fn from_file(path: &Path, rows: u64) -> Result<Tokenizer> {
        let json = gkq_files::read_bounded(
            path,
            MAX_TOKENIZER_BYTES,
            "a tokenizer.json",
            gkq_files::Follow::Yes,
        )?;
        Tokenizer::from_bytes(&json, rows)
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

    /// Issue 42, item 5, and issue 47, item 6: a session over the limit is
    /// refused before it is tokenized (a 100 MiB line took 10.4 GB), and
    /// a file type that is not read is refused naming the ones that are.
    #[test]
    fn long_sessions_and_unknown_file_types_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("data.csv");
        std::fs::write(&csv, "a,b\n1,2\n").unwrap();
        let e = Workload::load(&csv).unwrap_err().to_string();
        assert!(
            e.contains("a .csv file is not a workload") && e.contains(".jsonl"),
            "{e}"
        );
        let big = "x".repeat(MAX_SESSION_BYTES as usize + 1);
        let txt = dir.path().join("big.txt");
        std::fs::write(&txt, &big).unwrap();
        let e = Workload::load(&txt).unwrap_err().to_string();
        assert!(
            e.contains("over the limit of 1048576 bytes (1 MiB) for one session"),
            "{e}"
        );
        let jsonl = dir.path().join("big.jsonl");
        std::fs::write(
            &jsonl,
            format!("{{\"text\": \"a\"}}\n{{\"text\": \"{big}\"}}\n"),
        )
        .unwrap();
        let mut seen = 0;
        let e = for_each_session(&jsonl, |_| {
            seen += 1;
            Ok(())
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("big.jsonl:2: a session of"), "{e}");
        assert_eq!(
            seen, 1,
            "the first session was streamed before the second was refused"
        );
    }
}
