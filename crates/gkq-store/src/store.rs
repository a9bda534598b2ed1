//! [`Store`]: one [`RangeRead`] for every location a reader meets, routed
//! by scheme: `http(s)://` to [`HttpStore`], `s3://bucket/key` to the S3
//! backend (feature `s3`; endpoint and credentials from the environment,
//! set up on first use), anything else to [`LocalStore`] as a path. All of
//! them count into one set of [`NetStats`], and bulk reads share one
//! [`Gate`] of parts in flight.

use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::gate::Gate;
use crate::http::HttpStore;
use crate::local::LocalStore;
use std::time::{Duration, Instant};

use crate::read::{BoxFuture, Head, RangeRead, ReadOptions};
use crate::sources::{SourceReport, Sources};
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
    sources: std::sync::OnceLock<Sources>,
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
            sources: std::sync::OnceLock::new(),
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

    /// Spreads the reads of objects under `origin` (a base URL) over it
    /// and `mirrors` (see [`Sources`]), header reads too when
    /// `headers_anywhere` (trust that does not depend on the channel);
    /// once, before the first read.
    pub fn set_mirrors(&self, origin: &str, mirrors: &[String], headers_anywhere: bool) {
        if !mirrors.is_empty() {
            let _ = self.sources.set(Sources::new(
                origin,
                mirrors,
                headers_anywhere,
                &self.config.retry,
            ));
        }
    }

    /// What each source did (empty without mirrors).
    pub fn sources(&self) -> Vec<SourceReport> {
        self.sources.get().map(Sources::report).unwrap_or_default()
    }

    /// A read from the one backend of `location`.
    async fn read_direct(
        &self,
        location: &str,
        start: u64,
        dest: &mut [u8],
        opts: ReadOptions,
    ) -> Result<u64> {
        self.backend(location)
            .await?
            .read_into(location, start, dest, opts)
            .await
    }

    /// A read of object `name` from the next live source, hedged once its
    /// size class has a median (see [`Sources`]).
    async fn read_spread(
        &self,
        s: &Sources,
        (name, location): (&str, &str),
        start: u64,
        dest: &mut [u8],
        opts: ReadOptions,
    ) -> Result<u64> {
        let len = dest.len();
        let end = start.saturating_add(len as u64).saturating_sub(1);
        let mut f = Failover::new(s, (name, location, start), format!("bytes {start}-{end}"));
        loop {
            let (i, url, t) = f.next()?;
            let got = match (s.hedge_after(len), s.other(i)) {
                (Some(after), Some(j)) => {
                    let alt = s.url(j, name, location);
                    self.hedged(s, [(i, &url), (j, &alt)], after, start, dest, opts)
                        .await
                }
                _ => self
                    .read_direct(&url, start, dest, opts)
                    .await
                    .map(|n| (n, i))
                    .map_err(|e| (e, i)),
            };
            match got {
                Ok((n, won)) => return Ok(f.done(n, (i, won), len, t)),
                Err((e, who)) => f.failed(e, who),
            }
        }
    }

    /// The read at `first`, and after `after` the same read at `second`
    /// into a spare buffer: the first answer wins, the other is cancelled.
    /// The source that answered, or the one that failed.
    async fn hedged(
        &self,
        s: &Sources,
        [(i, url), (j, alt)]: [(usize, &String); 2],
        after: Duration,
        start: u64,
        dest: &mut [u8],
        opts: ReadOptions,
    ) -> std::result::Result<(u64, usize), (crate::StoreError, usize)> {
        use futures_util::future::{Either, select};
        let mut spare = vec![0u8; dest.len()];
        let first = Box::pin(self.read_direct(url, start, dest, opts));
        let second = Box::pin(async {
            tokio::time::sleep(after).await;
            self.read_direct(alt, start, &mut spare, opts).await
        });
        let (got, first) = match select(first, second).await {
            Either::Left((got, _)) => return got.map(|n| (n, i)).map_err(|e| (e, i)),
            Either::Right(second_won) => second_won,
        };
        match got {
            Ok(n) => {
                drop(first);
                dest.copy_from_slice(&spare);
                Ok((n, j))
            }
            Err(e) => {
                s.drop_source(j, format!("{alt}: a hedged read at {start}: {e}"));
                first.await.map(|n| (n, i)).map_err(|e| (e, i))
            }
        }
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

impl Store {
    /// The sources and the object name of `location`, when header reads of
    /// it are spread over mirrors.
    fn header_spread<'a>(&self, location: &'a str) -> Option<(&Sources, &'a str)> {
        let s = self.sources.get().filter(|s| s.headers_anywhere())?;
        Some((s, s.name_of(location)?))
    }
}

impl RangeRead for Store {
    fn head<'a>(&'a self, location: &'a str) -> BoxFuture<'a, Result<Head>> {
        Box::pin(async move {
            let Some((s, name)) = self.header_spread(location) else {
                return self.backend(location).await?.head(location).await;
            };
            let mut f = Failover::new(s, (name, location, u64::MAX), "HEAD".into());
            loop {
                let (i, url, t) = f.next()?;
                match self.backend(&url).await?.head(&url).await {
                    Ok(h) => return Ok(f.done(h, (i, i), 0, t)),
                    Err(e) => f.failed(e, i),
                }
            }
        })
    }

    fn read_into<'a>(
        &'a self,
        location: &'a str,
        start: u64,
        dest: &'a mut [u8],
        opts: ReadOptions,
    ) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let spread = self
                .sources
                .get()
                .and_then(|s| Some((s, s.name_of(location)?)));
            match spread {
                Some((s, name)) => {
                    self.read_spread(s, (name, location), start, dest, opts)
                        .await
                }
                None => self.read_direct(location, start, dest, opts).await,
            }
        })
    }

    fn distrust(&self, location: &str, range: (u64, u64), reason: &str) -> bool {
        self.sources
            .get()
            .is_some_and(|s| s.distrust(location, range, reason))
    }

    fn served_by(&self, location: &str, start: u64) -> Option<String> {
        self.sources.get()?.served_by(location, start)
    }

    fn refetches(&self) -> bool {
        self.config.retry.attempts > 1
    }

    fn read_prefix<'a>(
        &'a self,
        location: &'a str,
        max: u64,
    ) -> BoxFuture<'a, Result<(Vec<u8>, u64)>> {
        Box::pin(async move {
            let Some((s, name)) = self.header_spread(location) else {
                return self
                    .backend(location)
                    .await?
                    .read_prefix(location, max)
                    .await;
            };
            let mut f = Failover::new(s, (name, location, 0), format!("the first {max} bytes"));
            loop {
                let (i, url, t) = f.next()?;
                match self.backend(&url).await?.read_prefix(&url, max).await {
                    Ok(p) => {
                        let len = p.0.len();
                        return Ok(f.done(p, (i, i), len, t));
                    }
                    Err(e) => f.failed(e, i),
                }
            }
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

/// One request's walk over the sources: the next live one (round robin),
/// a mirror that fails dropped with the evidence, an origin failure sent
/// to the live mirrors and then returned naming every mirror dropped (see
/// [`Sources`]).
struct Failover<'a> {
    s: &'a Sources,
    name: &'a str,
    location: &'a str,
    start: u64,
    what: String,
    origin_failed: Option<StoreError>,
}

impl<'a> Failover<'a> {
    fn new(s: &'a Sources, (name, location, start): (&'a str, &'a str, u64), what: String) -> Self {
        Failover {
            s,
            name,
            location,
            start,
            what,
            origin_failed: None,
        }
    }

    /// The next source to ask, its URL and the time it was asked; the
    /// error when none is left.
    fn next(&mut self) -> Result<(usize, String, Instant)> {
        let i = match self.origin_failed.take() {
            None => self.s.pick(),
            Some(e) => match self.s.other(0) {
                Some(m) => {
                    self.origin_failed = Some(e);
                    m
                }
                None => return Err(self.s.failed(e)),
            },
        };
        Ok((i, self.s.url(i, self.name, self.location), Instant::now()))
    }

    /// Source `won` answered `len` bytes of a request sent to `asked` at `t`.
    fn done<T>(&self, v: T, (asked, won): (usize, usize), len: usize, t: Instant) -> T {
        let at = (self.location, self.start, len);
        self.s.done(won, at, t.elapsed(), won != asked);
        v
    }

    /// Source `who` failed with `e`.
    fn failed(&mut self, e: StoreError, who: usize) {
        if who == 0 {
            self.origin_failed = Some(e);
        } else {
            let at = self.s.url(who, self.name, self.location);
            self.s.drop_source(who, format!("{at}: {}: {e}", self.what));
        }
    }
}
