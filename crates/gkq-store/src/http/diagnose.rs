//! A failed HTTP attempt diagnosed in the words a user can act on: which
//! proxy could not be reached, what is wrong with a certificate, which
//! port does not speak TLS. Only the words are decided here; the retry
//! runner decides what to do with them.

use gkq_format::root_cause;

use crate::retry::Transient;

/// The proxy `reqwest` uses for `url` from the environment, as
/// `(variable, value)`, unless `NO_PROXY` exempts the host.
pub(crate) fn proxy_for(
    url: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<(String, String)> {
    let get = |k: &str| {
        env(k)
            .filter(|v| !v.trim().is_empty())
            .map(|v| (k.to_owned(), v))
    };
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match hostport.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => hostport.split(':').next()?,
    }
    .to_ascii_lowercase();
    let no_proxy = get("NO_PROXY").or_else(|| get("no_proxy")).map(|p| p.1);
    if let Some(list) = no_proxy {
        let exempt = list.split(',').map(str::trim).any(|e| {
            let e = e.trim_start_matches('.').to_ascii_lowercase();
            e == "*" || (!e.is_empty() && (host == e || host.ends_with(&format!(".{e}"))))
        });
        if exempt {
            return None;
        }
    }
    let specific = match scheme {
        "https" => get("HTTPS_PROXY").or_else(|| get("https_proxy")),
        "http" => get("HTTP_PROXY").or_else(|| get("http_proxy")),
        _ => None,
    };
    specific
        .or_else(|| get("ALL_PROXY"))
        .or_else(|| get("all_proxy"))
}

/// What a certificate error means, from rustls' and webpki's names.
fn certificate(root: &str, ca_given: bool) -> String {
    let trust = if ca_given {
        "the --ca-cert files given do not vouch for it either"
    } else {
        "a private CA? pass --ca-cert FILE or set SSL_CERT_FILE"
    };
    let what = if root.contains("CaUsedAsEndEntity") {
        "the server presents a CA certificate as its own; it needs a leaf certificate signed by that CA (the CA goes to --ca-cert, the leaf and its key to the server)".to_owned()
    } else if root.contains("UnknownIssuer") {
        format!("the server's certificate is signed by a CA this client does not trust ({trust})")
    } else if root.contains("NotValidForName") || root.contains("not valid for name") {
        "the server's certificate is not valid for this host name (connect by a name the certificate lists)".to_owned()
    } else if root.contains("NotValidYet") || root.contains("not valid before") {
        "the server's certificate is not valid yet (is this machine's clock right?)".to_owned()
    } else if root.contains("Expired") || root.contains("expired") {
        "the server's certificate has expired (or this machine's clock is wrong)".to_owned()
    } else {
        format!("{root} ({trust})")
    };
    format!("TLS certificate problem: {what}")
}

/// A transport error (no HTTP answer, or a broken one) in words.
pub(crate) fn describe(
    e: &reqwest::Error,
    url: &str,
    ca_given: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Transient {
    let root = root_cause(e);
    let mut f = Transient {
        timeout: e.is_timeout(),
        no_conversation: e.is_connect() && !e.is_timeout(),
        ..Transient::default()
    };
    f.message = if root.contains("corrupt message") || root.contains("InvalidContentType") {
        f.permanent = true;
        format!(
            "the server does not speak TLS (an https:// URL sent to a plain http port? try http://): {root}"
        )
    } else if root.contains("certificate")
        || root.contains("Certificate")
        || root.contains("UnknownIssuer")
    {
        f.permanent = true;
        certificate(&root, ca_given)
    } else if e.is_connect()
        && let Some((var, value)) = proxy_for(url, env)
    {
        format!(
            "cannot connect to the proxy {var}={value} ({root}); the server itself was not contacted: check the proxy, or exempt the host with NO_PROXY"
        )
    } else if root.contains("Connection refused") {
        format!("connection refused: is the server running, and is the port right? ({root})")
    } else if e.is_timeout() {
        format!("timed out: {root}")
    } else {
        root
    };
    f
}

/// A hint from the body of an error answer (only the first KiB is read).
pub(crate) fn hint_from_body(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    if text.contains("plain HTTP request was sent to HTTPS port") {
        return Some(
            "the server says: \"The plain HTTP request was sent to HTTPS port\": use https://"
                .into(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn proxies_follow_the_scheme_and_no_proxy() {
        let e = env(&[("HTTPS_PROXY", "http://127.0.0.1:9")]);
        assert_eq!(
            proxy_for("https://example.com/m/model.knot", &e),
            Some(("HTTPS_PROXY".into(), "http://127.0.0.1:9".into()))
        );
        assert_eq!(proxy_for("http://example.com/x", &e), None);
        let e = env(&[
            ("https_proxy", "http://p:3128"),
            ("NO_PROXY", "localhost,.example.com"),
        ]);
        assert_eq!(proxy_for("https://cdn.example.com/x", &e), None);
        assert_eq!(proxy_for("https://example.com/x", &e), None);
        assert_eq!(proxy_for("https://localhost:8443/x", &e), None);
        assert!(proxy_for("https://other.org/x", &e).is_some());
        let e = env(&[("ALL_PROXY", "socks5://p:1080"), ("no_proxy", "*")]);
        assert_eq!(proxy_for("https://other.org/x", &e), None);
        let e = env(&[("ALL_PROXY", "http://p:1")]);
        assert_eq!(
            proxy_for("http://user:pw@[::1]:80/x", &e).map(|p| p.0),
            Some("ALL_PROXY".into())
        );
        assert_eq!(proxy_for("s3://bucket/key", &env(&[])), None);
    }

    #[test]
    fn certificate_errors_in_words() {
        let ca = certificate(
            "invalid peer certificate: Other(OtherError(CaUsedAsEndEntity))",
            true,
        );
        assert!(ca.contains("presents a CA certificate as its own"), "{ca}");
        assert!(!ca.contains("Other("), "{ca}");
        assert!(!ca.contains("pass --ca-cert"), "{ca}");
        let unknown = certificate("invalid peer certificate: UnknownIssuer", false);
        assert!(unknown.contains("pass --ca-cert FILE"), "{unknown}");
        let given = certificate("invalid peer certificate: UnknownIssuer", true);
        assert!(given.contains("do not vouch for it"), "{given}");
        assert!(certificate("certificate expired: x", false).contains("expired"));
    }

    #[test]
    fn nginx_plain_http_page_gives_a_hint() {
        let body = b"<html><head><title>400 The plain HTTP request was sent to HTTPS port</title>";
        assert!(hint_from_body(body).is_some_and(|h| h.contains("use https://")));
        assert_eq!(hint_from_body(b"<html>Not Found</html>"), None);
    }
}
