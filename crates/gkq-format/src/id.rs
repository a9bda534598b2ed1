//! The knot id: the SHA-256 of a knot's preamble and header (section 2's
//! `header_sha256`), written as 64 hex digits. It authenticates everything
//! the knot names, so a node pins a model by it (`--knot-id`). Parsing is
//! strict: anything but 64 hex digits (either case) is refused, so an id
//! can never be a path, a URL or a partial digest.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A knot id: 32 bytes, shown as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KnotId([u8; 32]);

impl KnotId {
    /// The id of a knot whose `header_sha256` is `digest`.
    pub fn from_digest(digest: [u8; 32]) -> KnotId {
        KnotId(digest)
    }

    /// The 32 bytes.
    pub fn digest(&self) -> &[u8; 32] {
        &self.0
    }

    /// Parses a knot id as the format writes it (section 7c, a resource
    /// digest, `package.sha256`): exactly 64 lowercase hex digits, nothing
    /// around them.
    pub fn parse(s: &str) -> Result<KnotId> {
        if s.trim() != s {
            return Err(Error::BadKnotId {
                given: shown(s),
                reason: "a knot id is 64 hex digits, with nothing around them",
            });
        }
        if s.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(Error::BadKnotId {
                given: shown(s),
                reason: "hex digits are lowercase (0-9, a-f)",
            });
        }
        KnotId::parse_given(s)
    }

    /// Parses a knot id a person gave (`--knot-id`): 64 hex digits, lower-
    /// or upper-case; surrounding white space (a pasted line) is allowed,
    /// nothing else.
    pub fn parse_given(s: &str) -> Result<KnotId> {
        let t = s.trim();
        let bad = |reason: &'static str| Error::BadKnotId {
            given: shown(s),
            reason,
        };
        if t.len() != 64 {
            return Err(bad("a knot id is 64 hex digits"));
        }
        let mut out = [0u8; 32];
        for (o, pair) in out.iter_mut().zip(t.as_bytes().chunks_exact(2)) {
            let hi = hex_digit(pair.first().copied());
            let lo = hex_digit(pair.get(1).copied());
            match (hi, lo) {
                (Some(h), Some(l)) => *o = h.wrapping_shl(4) | l,
                _ => {
                    return Err(bad(
                        "only the hex digits 0-9, a-f (and A-F in a flag) are allowed",
                    ));
                }
            }
        }
        Ok(KnotId(out))
    }
}

fn hex_digit(b: Option<u8>) -> Option<u8> {
    char::from(b?)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// What was given, quoted and cut short (an id is never long).
fn shown(s: &str) -> String {
    let cut: String = s.chars().take(80).collect();
    if cut.len() < s.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

impl fmt::Display for KnotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::hex(&self.0))
    }
}

impl fmt::Debug for KnotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KnotId({self})")
    }
}

/// What a person gives: as [`KnotId::parse_given`].
impl FromStr for KnotId {
    type Err = Error;
    fn from_str(s: &str) -> Result<KnotId> {
        KnotId::parse_given(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_64_hex_digits_are_an_id() {
        let lower = "8a2fa89091986612d1e4dcd9b8c2aef01198c55f9f4e8183b61f6fe5712baf28";
        let id = KnotId::parse(lower).expect("lower case");
        assert_eq!(id.to_string(), lower);
        // a flag takes what a person pastes; the format, the canonical form only
        assert_eq!(
            KnotId::parse_given(&lower.to_ascii_uppercase()).ok(),
            Some(id)
        );
        assert_eq!(KnotId::parse_given(&format!(" {lower}\n")).ok(), Some(id));
        // issue 42: a signed statement whose knot id has a trailing space, or
        // capitals, is not 7c's 64 hex digits
        for loose in [
            format!("{lower} "),
            format!(" {lower}"),
            lower.to_ascii_uppercase(),
        ] {
            assert!(KnotId::parse(&loose).is_err(), "{loose:?}");
        }
        for bad in [
            "../../../victim.txt",
            "",
            &lower[..63],
            &format!("{lower}0"),
            &format!("{}g", &lower[..63]),
            &format!("{}/x", &lower[..62]),
            &"é".repeat(32),
        ] {
            let e = KnotId::parse(bad).expect_err(bad);
            assert!(matches!(e, Error::BadKnotId { .. }), "{bad}: {e}");
        }
        let e = KnotId::parse("../../../victim.txt").expect_err("a path");
        assert_eq!(
            e.to_string(),
            "\"../../../victim.txt\" is not a knot id: a knot id is 64 hex digits"
        );
        let long = "x".repeat(1000);
        assert!(KnotId::parse(&long).expect_err("long").to_string().len() < 200);
    }
}
