//! How a tool reports that it failed: `NAME: error: …` on stderr, or,
//! when it was given `--json`, one JSON object on stderr (what a script
//! parses; the exit codes are the same):
//!
//! ```json
//! {"tool": "gkq-rows", "error": {"kind": "TokenOutOfRange", "message": "…", "row": 99999}}
//! ```
//!
//! `kind` is the variant of the first typed error in the chain (`usage`
//! for a command-line error), `message` the whole chain on one line, and
//! `file`, `tensor`, `row` and `url` are there when an error of the chain
//! names one (its `path`/`file`, `tensor`, `row`/`id`, `url`/`location`
//! field).

use serde_json::{Map, Value, json};

/// Whether the command line asks for JSON output.
pub fn json_asked() -> bool {
    std::env::args_os().skip(1).any(|a| a == "--json")
}

/// The JSON object for `error` of tool `name`.
pub fn json_failure(
    name: &str,
    kind: Option<&str>,
    error: &(dyn std::error::Error + 'static),
) -> Value {
    let mut fields = Map::new();
    let mut found_kind = kind.map(str::to_owned);
    let mut e: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(err) = e {
        let debug = format!("{err:?}");
        if found_kind.is_none() {
            found_kind = variant(&debug);
        }
        for (key, value) in named_fields(&debug) {
            fields.entry(key).or_insert(value);
        }
        e = err.source();
    }
    let mut obj = Map::new();
    obj.insert(
        "kind".into(),
        json!(found_kind.unwrap_or_else(|| "error".into())),
    );
    obj.insert("message".into(), json!(gkq_format::error_chain(error)));
    obj.extend(fields);
    json!({ "tool": name, "error": obj })
}

/// `Fetch { url: … }` or `Missing("…")`: `Fetch`, `Missing`; through
/// wrappers (`Source(NoGgufFile { … })`: `NoGgufFile`); not a quoted
/// string (anyhow's context) nor an I/O error's representation.
fn variant(debug: &str) -> Option<String> {
    let mut rest = debug;
    loop {
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let after = &rest[ident.len()..];
        if !ident.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
            return None;
        }
        // a wrapper of another typed error: look inside
        if let Some(inner) = after.strip_prefix('(')
            && inner.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        {
            rest = inner;
            continue;
        }
        let typed = after.starts_with(" {") || after.starts_with('(') || after.is_empty();
        let io = matches!(ident.as_str(), "Custom" | "Os" | "Kind" | "Error");
        return (typed && !io).then_some(ident);
    }
}

/// The fields of a derived `Debug` that name what failed.
fn named_fields(debug: &str) -> Vec<(String, Value)> {
    const KEYS: [(&str, &str); 8] = [
        ("url: ", "url"),
        ("location: ", "url"),
        ("path: ", "file"),
        ("file: ", "file"),
        ("object: ", "file"),
        ("tensor: ", "tensor"),
        ("row: ", "row"),
        ("id: ", "row"),
    ];
    let mut out = Vec::new();
    for (needle, key) in KEYS {
        let Some(at) = debug.find(needle) else {
            continue;
        };
        // a field, not the tail of another name (`knot_id: `)
        let before = debug[..at].chars().last();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(v) = value_at(&debug[at + needle.len()..]) {
            // a row is a number (not a knot id)
            if key == "row" && !v.is_u64() {
                continue;
            }
            let key = match (key, &v) {
                ("url", Value::String(s)) if !s.contains("://") => "file",
                _ => key,
            };
            out.push((key.to_owned(), v));
        }
    }
    out
}

/// A quoted string (with `Debug`'s escapes), a number, or a `PathBuf`'s
/// `"…"`, at the start of `s`.
fn value_at(s: &str) -> Option<Value> {
    if let Some(rest) = s.strip_prefix('"') {
        let mut text = String::new();
        let mut chars = rest.chars();
        while let Some(c) = chars.next() {
            match c {
                '"' => return Some(json!(text)),
                '\\' => match chars.next()? {
                    'n' => text.push('\n'),
                    't' => text.push('\t'),
                    c => text.push(c),
                },
                c => text.push(c),
            }
        }
        return None;
    }
    let n: String = s.chars().take_while(char::is_ascii_digit).collect();
    n.parse::<u64>().ok().map(|n| json!(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Inner {
        #[error("{url}: not found")]
        NotFound { url: String },
    }

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("tensor {tensor:?} row {row}")]
        Row {
            tensor: String,
            row: u64,
            #[source]
            error: Inner,
        },
    }

    #[test]
    fn kind_message_and_what_failed() {
        let e = Outer::Row {
            tensor: "token_embd.weight".into(),
            row: 7,
            error: Inner::NotFound {
                url: "http://h/a \"b\".rows".into(),
            },
        };
        let v = json_failure("gkq-rows", None, &e);
        assert_eq!(v["tool"], "gkq-rows");
        assert_eq!(v["error"]["kind"], "Row");
        assert_eq!(v["error"]["tensor"], "token_embd.weight");
        assert_eq!(v["error"]["row"], 7);
        assert_eq!(v["error"]["url"], "http://h/a \"b\".rows");
        assert!(
            v["error"]["message"]
                .as_str()
                .expect("message")
                .contains("not found")
        );
        let io = std::io::Error::other("plain");
        let v = json_failure("t", Some("usage"), &io);
        assert_eq!(v["error"]["kind"], "usage");
    }
}
