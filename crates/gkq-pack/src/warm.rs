//! The warm set (docs/FORMAT.md 7d): `--warm-set K` ids that most sessions
//! of a corpus need, tokenized with the package's own `tokenizer.json`
//! (`--warm-corpus FILE...`), or a list of ids (`--warm-ids FILE`, such as
//! `gkq-report --json`'s `warm_ids`); listed in the knot for every row file
//! of the token embedding, and a warm object written next to each.

use std::fs::File;
use std::path::{Path, PathBuf};

use gkq_format::warm::WarmPart;
use gkq_format::{ColumnarDescriptor, Header, Value, keys};

use crate::error::{IoContext, PackError, Result};
use crate::options::WarmOptions;
use crate::report::{FileReport, WarmSetReport};

fn refused(reason: impl Into<String>) -> PackError {
    PackError::Warm(reason.into())
}

/// The warm rows (ascending) for an embedding of `vocab` rows, with the
/// report; `None` without warm options. `tokenizer` is the source's
/// tokenizer, if it has one.
pub(crate) fn decide(
    o: &WarmOptions,
    tokenizer: SourceTokenizer<'_>,
    vocab: u64,
) -> Result<Option<(Vec<u64>, WarmSetReport)>> {
    if !o.is_set() {
        return Ok(None);
    }
    if let Some(k) = o.k
        && (k == 0 || k as u64 > vocab)
    {
        return Err(refused(format!(
            "--warm-set {k}: between 1 and the vocabulary's {vocab} rows"
        )));
    }
    let (ranked, report) = match (&o.ids, o.corpus.is_empty()) {
        (Some(_), false) => {
            return Err(refused("--warm-corpus and --warm-ids: give one of them"));
        }
        (None, true) => {
            return Err(refused(
                "--warm-set needs --warm-corpus FILE... or --warm-ids FILE",
            ));
        }
        (Some(path), true) => from_ids(path, vocab)?,
        (None, false) => {
            let Some(k) = o.k else {
                return Err(refused("--warm-corpus needs --warm-set K"));
            };
            from_corpus(&o.corpus, tokenizer, vocab, k)?
        }
    };
    let mut ids: Vec<u64> = ranked.into_iter().take(o.k.unwrap_or(usize::MAX)).collect();
    ids.sort_unstable();
    let report = WarmSetReport {
        rows: ids.len(),
        ..report
    };
    Ok(Some((ids, report)))
}

/// The longest `--warm-ids` file read: 64 MiB (ids of a warm set are a
/// few thousand at most).
const MAX_IDS_FILE: u64 = 64 << 20;

/// A file of ids, deduplicated (first place kept), each below `vocab`.
fn from_ids(path: &Path, vocab: u64) -> Result<(Vec<u64>, WarmSetReport)> {
    let text = gkq_files::read_text(
        path,
        MAX_IDS_FILE,
        "a list of token ids",
        gkq_files::Follow::Yes,
    )
    .map_err(|e| refused(format!("--warm-ids {e}")))?;
    let ids = gkq_text::parse_ids(&text)
        .map_err(|e| refused(format!("--warm-ids {}: {e}", path.display())))?;
    if let Some(id) = ids.iter().find(|&&id| id >= vocab) {
        return Err(refused(format!(
            "--warm-ids {}: token id {id} is past the vocabulary's {vocab} rows",
            path.display()
        )));
    }
    if ids.is_empty() {
        return Err(refused(format!("--warm-ids {}: no ids", path.display())));
    }
    let mut seen = std::collections::HashSet::new();
    let ids: Vec<u64> = ids.into_iter().filter(|id| seen.insert(*id)).collect();
    let report = WarmSetReport {
        rows: 0,
        from: "ids".into(),
        sessions: 0,
    };
    Ok((ids, report))
}

/// The tokenizer of a source: its `tokenizer.json`, or a GGUF's metadata.
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(not(feature = "warm-corpus"), allow(dead_code))]
pub(crate) struct SourceTokenizer<'a> {
    pub(crate) json: Option<&'a Path>,
    pub(crate) gguf: Option<&'a [u8]>,
}

#[cfg(feature = "warm-corpus")]
fn from_corpus(
    files: &[PathBuf],
    tokenizer: SourceTokenizer<'_>,
    vocab: u64,
    k: usize,
) -> Result<(Vec<u64>, WarmSetReport)> {
    let text_err = |e: gkq_text::TextError| refused(format!("--warm-corpus: {e}"));
    let t = match tokenizer {
        SourceTokenizer { json: Some(p), .. } => gkq_text::Tokenizer::from_file(p, vocab),
        SourceTokenizer { gguf: Some(g), .. } => gkq_text::Tokenizer::from_gguf_bytes(g, vocab),
        _ => {
            return Err(refused(
                "--warm-corpus: the source has no tokenizer (no tokenizer.json, not a GGUF) to tokenize it with (give --warm-ids FILE)",
            ));
        }
    }
    .map_err(text_err)?;
    if files.is_empty() {
        return Err(text_err(gkq_text::TextError::NoTexts));
    }
    // one session at a time: memory bounded by the vocabulary, not the corpus
    let mut counter = gkq_text::WarmCounter::default();
    for f in files {
        let mut text_seen = false;
        gkq_text::for_each_session(f, |text| {
            text_seen |= !text.trim().is_empty();
            counter.add(&t.encode(text)?);
            Ok(())
        })
        .map_err(text_err)?;
        if !text_seen {
            return Err(text_err(gkq_text::TextError::Empty { path: f.clone() }));
        }
    }
    let report = WarmSetReport {
        rows: 0,
        from: "corpus".into(),
        sessions: counter.sessions(),
    };
    let ids = counter.top(k);
    Ok((ids.into_iter().map(u64::from).collect(), report))
}

#[cfg(not(feature = "warm-corpus"))]
fn from_corpus(
    _: &[PathBuf],
    _: SourceTokenizer<'_>,
    _: u64,
    _: usize,
) -> Result<(Vec<u64>, WarmSetReport)> {
    Err(refused(
        "--warm-corpus: this gkq-pack was built without the warm-corpus feature (give --warm-ids FILE)",
    ))
}

/// Lists the warm rows for every row file of block `embed` (FORMAT.md 7d).
pub(crate) fn list(header: &mut Header, embed: &str, ids: &[u64]) {
    let mut objects: Vec<String> = header
        .blocks
        .iter()
        .filter(|b| b.name == embed)
        .flat_map(|b| &b.columnar)
        .filter(|d| d.proof.is_some())
        .map(|d| d.object.clone())
        .collect();
    objects.sort();
    if objects.is_empty() {
        return;
    }
    let rows = ids.iter().map(u64::to_string).collect();
    let md = &mut header.metadata;
    md.insert(keys::COLUMNAR_WARM.into(), Value::StrList(objects));
    md.insert(keys::COLUMNAR_WARM_ROWS.into(), Value::StrList(rows));
}

/// Writes the warm object of a closed row file from the row file and its
/// proof object (FORMAT.md 7d).
pub(crate) fn write(
    out: &mut crate::output::Output,
    d: &ColumnarDescriptor,
    ids: &[u64],
    (rows_path, proof_path): (&Path, &Path),
) -> Result<(FileReport, File, PathBuf)> {
    let name = gkq_format::warm::warm_object_name(&d.object);
    let (path, mut w) = out.create(&name)?;
    let (rows, proof) = (
        File::open(rows_path).at(rows_path)?,
        File::open(proof_path).at(proof_path)?,
    );
    let read = |part, at, buf: &mut [u8]| {
        use std::os::unix::fs::FileExt;
        match part {
            WarmPart::Rows => rows.read_exact_at(buf, at),
            WarmPart::Proof => proof.read_exact_at(buf, at),
        }
    };
    gkq_format::warm::write_warm(d, ids, read, &mut w).at(&path)?;
    let file = crate::output::flush_file(w, &path)?;
    let (bytes, sha256) = crate::companions::hash_file(&path)?;
    let report = FileReport {
        path: PathBuf::from(&name),
        bytes,
        sha256,
    };
    Ok((report, file, path))
}
