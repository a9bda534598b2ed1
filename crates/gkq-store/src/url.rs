//! Locations: URLs (`http://`, `https://`, `s3://`) and local paths, and
//! the few things done to them, in one place: the objects next to a knot,
//! a suffix before the query string, and credentials, which a read URL
//! must not carry (they would be printed in errors, warnings and reports;
//! the upload side refuses them in `--endpoint` for the same reason).

use std::path::Path;

use crate::error::{Result, StoreError};

/// Whether `location` is a URL this crate reads over the network
/// (`http://`, `https://`, `s3://`) rather than a local path.
pub fn is_remote(location: &str) -> bool {
    ["http://", "https://", "s3://"]
        .iter()
        .any(|p| location.starts_with(p))
}

/// `location` split before its query string or fragment: `(path, rest)`.
pub fn split_query(location: &str) -> (&str, &str) {
    location.split_at(location.find(['?', '#']).unwrap_or(location.len()))
}

/// `location` without its query string or fragment.
pub fn without_query(location: &str) -> &str {
    split_query(location).0
}

/// The path a package is published under, from its knot's URL: the
/// directory's path without the scheme, host, query and outer slashes
/// (`https://h/models/m/v1/model.knot?x` gives `models/m/v1`); for
/// `s3://bucket/key`, the key's directory (a public bucket's URL serves
/// the bucket's root).
pub fn package_path(location: &str) -> String {
    let path = without_query(location);
    let rest = path.split_once("://").map_or(path, |(_, r)| r);
    let key = rest.split_once('/').map_or("", |(_, p)| p);
    key.rsplit_once('/')
        .map_or("", |(d, _)| d)
        .trim_matches('/')
        .to_owned()
}

/// The package asked for at `location` (FORMAT.md 7c): `package` when
/// given (`--package`); for a URL, the path it is published under
/// ([`package_path`]); for a local knot or package directory, that
/// directory, made absolute.
pub fn asked(location: &str, package: Option<&str>) -> gkq_format::sig::Asked {
    use gkq_format::sig::Asked;
    if let Some(p) = package {
        return Asked::Name(p.to_owned());
    }
    if is_remote(location) {
        return Asked::UrlPath(package_path(location));
    }
    let p = Path::new(location);
    let dir = if p.is_dir() {
        p
    } else {
        p.parent().unwrap_or_else(|| Path::new("."))
    };
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    Asked::LocalDir(dir.display().to_string())
}

/// The location of `name` next to the object at `location` (a URL keeps
/// its query string, so a presigned or tokened base still works).
pub fn sibling(location: &str, name: &str) -> String {
    if is_remote(location) {
        let (path, rest) = split_query(location);
        let base = path.rsplit_once('/').map_or(path, |(b, _)| b);
        return format!("{base}/{name}{rest}");
    }
    Path::new(location)
        .parent()
        .map(|d| d.join(name))
        .unwrap_or_else(|| Path::new(name).to_path_buf())
        .display()
        .to_string()
}

/// `name` under the base URL or directory `base`, given with or without
/// its trailing `/`.
pub fn join(base: &str, name: &str) -> String {
    format!("{}/{name}", base.trim_end_matches('/'))
}

/// `location` with `suffix` added to its last path segment, before the
/// query string (`a.rows?x` + `.proof` = `a.rows.proof?x`).
pub fn with_suffix(location: &str, suffix: &str) -> String {
    let (path, rest) = split_query(location);
    format!("{path}{suffix}{rest}")
}

/// The byte range of a URL's user-info and its `@` (`user:secret@`), if
/// it has one.
fn userinfo(url: &str) -> Option<std::ops::Range<usize>> {
    if !is_remote(url) {
        return None;
    }
    let start = url.find("://")? + 3;
    let rest = url.get(start..)?;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let at = authority.rfind('@')?;
    Some(start..start + at + 1)
}

/// `url` with any user-info replaced by `***`, for messages.
pub fn redact(url: &str) -> String {
    match userinfo(url) {
        Some(r) => format!("{}***@{}", &url[..r.start], &url[r.end..]),
        None => url.to_owned(),
    }
}

/// Refuses a URL that carries credentials (`https://KEY:SECRET@host/…`),
/// before anything could send or print them. The message shows the URL
/// with the credentials replaced by `***`.
pub fn refuse_credentials(url: &str) -> Result<()> {
    match userinfo(url) {
        Some(_) => Err(StoreError::CredentialsInUrl { url: redact(url) }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_and_suffixes_keep_the_query() {
        assert_eq!(
            sibling("https://h/m/v1/model.knot?x=1", "config.json"),
            "https://h/m/v1/config.json?x=1"
        );
        assert_eq!(sibling("out/v1/model.knot", "a.rows"), "out/v1/a.rows");
        assert_eq!(sibling("model.knot", "a.rows"), "a.rows");
        assert_eq!(
            with_suffix("https://h/a.rows?sig=2#f", ".proof"),
            "https://h/a.rows.proof?sig=2#f"
        );
        assert_eq!(without_query("https://h/a?b"), "https://h/a");
        assert_eq!(join("https://h/m/v1/", "a.rows"), "https://h/m/v1/a.rows");
        assert_eq!(join("https://h/m/v1", "a.rows"), "https://h/m/v1/a.rows");
        assert!(is_remote("s3://b/k") && !is_remote("/tmp/x"));
        assert_eq!(
            package_path("https://h:1/models/m/v1/model.knot?x=/y"),
            "models/m/v1"
        );
        assert_eq!(package_path("s3://bucket/m/v1/model.knot"), "m/v1");
        assert_eq!(package_path("https://h/model.knot"), "");
    }

    #[test]
    fn credentials_are_refused_and_never_shown() {
        let url = "http://AKID42:s3cr3t@127.0.0.1:8080/m/v1/model.knot?q=1";
        let e = refuse_credentials(url).expect_err("refused").to_string();
        assert!(!e.contains("s3cr3t") && !e.contains("AKID42"), "{e}");
        assert!(
            e.contains("http://***@127.0.0.1:8080/m/v1/model.knot?q=1"),
            "{e}"
        );
        assert_eq!(redact("https://u@h?x"), "https://***@h?x");
        assert_eq!(redact("https://u:p@h"), "https://***@h");
        assert!(
            refuse_credentials("https://h/a@b").is_ok(),
            "an @ in the path"
        );
        assert!(refuse_credentials("https://h/m/v1/model.knot").is_ok());
        assert!(refuse_credentials("out/v1/model.knot").is_ok());
    }
}
