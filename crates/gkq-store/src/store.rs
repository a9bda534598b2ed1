//! [`Store`]: reads by URL scheme. `http(s)://` goes through [`Http`];
//! `s3://bucket/key` through an S3 reader (feature `s3`), for private
//! buckets read with credentials.

use crate::error::{Result, StoreError};
use crate::http::{Head, Http, HttpConfig, NetStats};

/// Every read of one reader, whatever the scheme.
#[derive(Debug)]
pub struct Store {
    http: Http,
    #[cfg(feature = "s3")]
    s3: Option<crate::s3::S3Reader>,
}

/// Whether `location` is a URL this crate reads (`http://`, `https://`, `s3://`).
pub fn is_remote(location: &str) -> bool {
    ["http://", "https://", "s3://"]
        .iter()
        .any(|p| location.starts_with(p))
}

fn is_s3(url: &str) -> bool {
    url.starts_with("s3://")
}

impl Store {
    /// HTTP(S) only; `s3://` URLs need [`Store::with_s3`].
    pub fn new(config: HttpConfig) -> Result<Store> {
        Ok(Store {
            http: Http::new(config)?,
            #[cfg(feature = "s3")]
            s3: None,
        })
    }

    /// Adds the reader of `s3://` URLs.
    #[cfg(feature = "s3")]
    pub fn with_s3(mut self, reader: crate::s3::S3Reader) -> Store {
        self.s3 = Some(reader);
        self
    }

    #[cfg(feature = "s3")]
    fn s3(&self, url: &str) -> Result<&crate::s3::S3Reader> {
        self.s3.as_ref().ok_or_else(|| {
            StoreError::Client(format!(
                "{url}: no S3 credentials were set up for s3:// URLs"
            ))
        })
    }

    #[cfg(not(feature = "s3"))]
    fn no_s3<T>(url: &str) -> Result<T> {
        Err(StoreError::Client(format!(
            "{url}: s3:// URLs need a build with the `s3` feature (cargo install --path crates/gkq-reader --features s3)"
        )))
    }

    /// The HTTP client.
    pub fn http(&self) -> &Http {
        &self.http
    }

    /// Counters so far (S3 reads included in requests and payload bytes).
    pub fn stats(&self) -> NetStats {
        self.http.stats()
    }

    /// Whether requests are multiplexed on one connection (HTTP/2 seen).
    pub fn multiplexed(&self) -> bool {
        self.http.multiplexed()
    }

    /// The HTTP settings.
    pub fn config(&self) -> &HttpConfig {
        self.http.config()
    }

    /// HEAD.
    pub fn head(&self, url: &str) -> Result<Head> {
        if is_s3(url) {
            #[cfg(feature = "s3")]
            {
                self.http.count_external(1, 0);
                return self.s3(url)?.head(url);
            }
            #[cfg(not(feature = "s3"))]
            return Self::no_s3(url);
        }
        self.http.head(url)
    }

    /// HEAD: the length.
    pub fn content_length(&self, url: &str) -> Result<u64> {
        self.head(url).map(|h| h.len)
    }

    /// See [`Http::get_prefix`].
    pub fn get_prefix(&self, url: &str, max: u64) -> Result<(Vec<u8>, u64)> {
        if is_s3(url) {
            #[cfg(feature = "s3")]
            {
                let mut out = Vec::new();
                let total = self.s3(url)?.get_range(
                    url,
                    0,
                    max.saturating_sub(1),
                    true,
                    &mut crate::http::collect_into(&mut out),
                )?;
                self.http.count_external(1, out.len() as u64);
                return Ok((out, total));
            }
            #[cfg(not(feature = "s3"))]
            return Self::no_s3(url);
        }
        self.http.get_prefix(url, max)
    }

    /// See [`Http::get_range_vec`].
    pub fn get_range_vec(
        &self,
        url: &str,
        start: u64,
        end: u64,
        total: Option<u64>,
    ) -> Result<Vec<u8>> {
        if is_s3(url) {
            #[cfg(feature = "s3")]
            {
                crate::http::check_read(url, start, end, self.config().max_read_bytes)?;
                let mut out = Vec::new();
                let got_total = self.s3(url)?.get_range(
                    url,
                    start,
                    end,
                    false,
                    &mut crate::http::collect_into(&mut out),
                )?;
                if let Some(t) = total.filter(|&t| t != got_total) {
                    return Err(StoreError::ContentRange {
                        url: url.into(),
                        expected: format!("bytes {start}-{end}/{t}"),
                        found: format!("bytes {start}-{end}/{got_total}"),
                    });
                }
                self.http.count_external(1, out.len() as u64);
                return Ok(out);
            }
            #[cfg(not(feature = "s3"))]
            return Self::no_s3(url);
        }
        self.http.get_range_vec(url, start, end, total)
    }
}
