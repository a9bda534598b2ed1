//! Why a node trusts the knot it opened (FORMAT.md section 7c): a pinned
//! knot id, a signature by a trusted key, or (with no policy) the channel
//! it came from. Checked from the preamble's id alone, before any other
//! header field is decoded; a checked signature is kept in the disk cache
//! by knot id, so that a warm open makes no request for it.

use bytes::Bytes;
use gkq_format::KnotId;
use gkq_format::sig::{self, Asked, MAX_SIGNATURE_LEN, PublicKey, SIGNATURE_NAME};
use gkq_store::RangeRead;

use crate::cache::{DiskCache, Kind, Size};
use crate::error::{ReaderError, Result};

/// Why the knot is trusted.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "by")]
pub enum Trusted {
    /// No trust policy: whatever served the header (the URL, TLS).
    Channel,
    /// The knot id is the pinned `--knot-id`.
    Pinned,
    /// A signature by a trusted key.
    Signed {
        /// The signer's fingerprint (OMS's `hint`).
        signer: String,
        /// Whether the checked signature came from the disk cache.
        cached: bool,
        /// The package name it signs (`gkq-sign --name`), when it names one.
        #[serde(skip_serializing_if = "Option::is_none")]
        package: Option<String>,
    },
}

impl std::fmt::Display for Trusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trusted::Channel => write!(f, "trusted by the channel (no --trust-key or --knot-id)"),
            Trusted::Pinned => write!(f, "trusted by the pinned --knot-id"),
            Trusted::Signed {
                signer,
                cached,
                package,
            } => write!(
                f,
                "signed by key {signer}{}{}",
                package
                    .as_ref()
                    .map_or_else(String::new, |p| format!(" as package {p:?}")),
                if *cached {
                    " (signature from the disk cache)"
                } else {
                    ""
                }
            ),
        }
    }
}

/// The trust policy of a node.
pub(crate) struct Policy<'a> {
    pub(crate) pin: Option<KnotId>,
    pub(crate) keys: &'a [PublicKey],
    /// The package asked for, that a named signature must name.
    pub(crate) asked: Asked,
}

/// The package asked for at `location` (FORMAT.md 7c): the name given,
/// else for a URL the path it is published under, else the local
/// directory ([`gkq_store::url::asked`]).
pub(crate) fn asked(location: &str, package: Option<&str>) -> Asked {
    gkq_store::url::asked(location, package)
}

impl Policy<'_> {
    /// The signer and the package name signed, when `bytes` sign the knot
    /// `id` with a trusted key, for the package asked for; `served_by` is
    /// the mirror that served the header (`None`: the origin, or the disk
    /// cache of the origin's).
    fn signed_by(
        &self,
        bytes: &[u8],
        id: KnotId,
        served_by: Option<&str>,
    ) -> gkq_format::Result<(String, Option<String>)> {
        let signed = sig::open(bytes, self.keys)?;
        signed.check_knot(id)?;
        signed.check_package(&self.asked, served_by)?;
        Ok((signed.signer, signed.package))
    }
}

impl Policy<'_> {
    /// Whether the knot `id` at `location` is trusted, and why: the pin
    /// must be `id`; else, with keys, the signature next to the knot must
    /// sign `id` with one of them.
    pub(crate) async fn check(
        &self,
        location: &str,
        id: KnotId,
        store: &dyn RangeRead,
        (cache, served_by): (Option<&DiskCache>, Option<&str>),
    ) -> Result<Trusted> {
        if let Some(want) = self.pin {
            if want != id {
                return Err(ReaderError::KnotId {
                    location: location.to_owned(),
                    expected: want.to_string(),
                    found: id.to_string(),
                });
            }
            return Ok(Trusted::Pinned);
        }
        if self.keys.is_empty() {
            return Ok(Trusted::Channel);
        }
        let key = id.to_string();
        // a cached signature is checked once, as a fetched one is: one that
        // fails is fetched again (and replaces it)
        if let Some(c) = cache
            && let Some(b) = c
                .get(
                    Kind::Signature,
                    &key,
                    Size::AtMost(MAX_SIGNATURE_LEN),
                    |_| true,
                )
                .await
            && let Ok((signer, package)) = self.signed_by(&b, id, served_by)
        {
            return Ok(Trusted::Signed {
                signer,
                cached: true,
                package,
            });
        }
        let url = super::sibling(location, SIGNATURE_NAME);
        let Some((bytes, total)) = gkq_store::read_signature(store, location).await? else {
            let keys: Vec<&str> = self.keys.iter().map(PublicKey::hint).collect();
            return Err(ReaderError::Unsigned {
                url,
                keys: keys.join(", "),
            });
        };
        let refused = |error| ReaderError::Signature {
            url: url.clone(),
            error: Box::new(error),
        };
        if total > MAX_SIGNATURE_LEN {
            let why = format!("{total} bytes, over the limit of {MAX_SIGNATURE_LEN}");
            return Err(refused(gkq_format::Error::Signature(
                sig::SigFailure::Malformed(why),
            )));
        }
        let (signer, package) = self.signed_by(&bytes, id, served_by).map_err(refused)?;
        if let Some(c) = cache {
            c.put(Kind::Signature, &key, Bytes::from(bytes)).await;
        }
        tracing::info!(signature = %url, %signer, "signature checked");
        Ok(Trusted::Signed {
            signer,
            cached: false,
            package,
        })
    }
}
