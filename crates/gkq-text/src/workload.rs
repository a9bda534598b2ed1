//! Workload files: sessions of text, read or streamed one at a time.

use std::path::{Path, PathBuf};

use crate::{Result, TextError};

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
