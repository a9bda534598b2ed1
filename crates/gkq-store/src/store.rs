//! [`Store`]: one [`RangeRead`] for every location a reader meets, routed
//! by scheme: `http(s)://` to [`HttpStore`], `s3://bucket/key` to the S3
//! backend (feature `s3`; endpoint and credentials from the environment,
//! set up on first use), anything else to [`LocalStore`] as a path. All of
//! them count into one set of [`NetStats`], and bulk reads share one
//! [`Gate`] of parts in flight.

use crate::config::StoreConfig;
use crate::error::Result;
use crate::http::HttpStore;
use crate::local::LocalStore;
use crate::parallel::Gate;
use crate::read::{BoxFuture, Head, RangeRead, ReadOptions};
use crate::stats::NetStats;

/// The features this build of gkq-store has, for `--version` lines.
pub const FEATURES: &[&str] = &[
    #[cfg(feature = "s3")]
    "s3",
];

/// Every read of one reader or verifier, whatever the scheme.
#[derive(Debug)]
pub struct Store {
    http: HttpStore,
    local: LocalStore,
    #[cfg(feature = "s3")]
    s3: tokio::sync::OnceCell<crate::s3::S3Store>,
    gate: Gate,
    config: StoreConfig,
}

impl Store {
    /// A store with `config`.
    pub fn new(config: StoreConfig) -> Result<Store> {
        Ok(Store {
            http: HttpStore::new(config.clone())?,
            local: LocalStore::new(&config),
            #[cfg(feature = "s3")]
            s3: tokio::sync::OnceCell::new(),
            gate: Gate::new(config.parallel),
            config,
        })
    }

    /// The settings.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Counters so far (S3 calls included).
    pub fn stats(&self) -> NetStats {
        let http = self.http.stats();
        #[cfg(feature = "s3")]
        if let Some(s3) = self.s3.get() {
            return http.plus(&s3.stats());
        }
        http
    }

    /// The backend of `location`.
    async fn backend(&self, location: &str) -> Result<&dyn RangeRead> {
        crate::url::refuse_credentials(location)?;
        if location.starts_with("http://") || location.starts_with("https://") {
            return Ok(&self.http);
        }
        if !location.starts_with("s3://") {
            return Ok(&self.local);
        }
        #[cfg(feature = "s3")]
        {
            let s3 = self
                .s3
                .get_or_try_init(|| crate::s3::S3Store::from_env(self.config.clone()))
                .await?;
            Ok(s3)
        }
        #[cfg(not(feature = "s3"))]
        Err(crate::StoreError::NoS3 {
            url: location.to_owned(),
        })
    }
}

impl RangeRead for Store {
    fn head<'a>(&'a self, location: &'a str) -> BoxFuture<'a, Result<Head>> {
        Box::pin(async move { self.backend(location).await?.head(location).await })
    }

    fn read_into<'a>(
        &'a self,
        location: &'a str,
        start: u64,
        dest: &'a mut [u8],
        opts: ReadOptions,
    ) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            self.backend(location)
                .await?
                .read_into(location, start, dest, opts)
                .await
        })
    }

    fn read_prefix<'a>(
        &'a self,
        location: &'a str,
        max: u64,
    ) -> BoxFuture<'a, Result<(Vec<u8>, u64)>> {
        Box::pin(async move {
            self.backend(location)
                .await?
                .read_prefix(location, max)
                .await
        })
    }

    fn max_read_bytes(&self) -> u64 {
        self.config.max_read_bytes
    }

    /// One gate for every bulk read of the store, whatever the backend.
    fn gate(&self) -> &Gate {
        &self.gate
    }

    fn multiplexed(&self) -> bool {
        self.http.multiplexed()
    }
}
