//! Reader configuration: a plain struct for programmatic use. The flags a
//! runtime flattens into its own CLI are in `cli` (feature `clap`).

use std::time::Duration;

use gkq_store::StoreConfig;

use crate::cache::CacheConfig;
use crate::columnar::FetchConfig;

/// The roles a node serves. In a pipeline-split fabric the first stage
/// only looks up input embeddings and never pulls lm_head; the last stage
/// needs lm_head resident. (The packer's decision of which tensor plays
/// which role is another thing: the packer's role plan.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Serve {
    /// Input embedding lookups.
    pub input: bool,
    /// Output projection (lm_head).
    pub output: bool,
}

impl Serve {
    /// Both roles (a single-node model).
    pub const ALL: Serve = Serve {
        input: true,
        output: true,
    };
    /// First pipeline stage.
    pub const INPUT: Serve = Serve {
        input: true,
        output: false,
    };
    /// Last pipeline stage.
    pub const OUTPUT: Serve = Serve {
        input: false,
        output: true,
    };
    /// Neither: the knot header and blocks only (an inspector, a tool).
    pub const NONE: Serve = Serve {
        input: false,
        output: false,
    };
}

/// Everything a reader needs to know.
#[derive(Clone, Debug, Default)]
pub struct ReaderConfig {
    /// Row file URL for the token embedding (`--columnar-embed`): the row
    /// file itself, or the base URL of the package (with or without the
    /// trailing `/`). Default: the row files next to the knot (a package
    /// is a directory); this points elsewhere (another host, a CDN).
    pub columnar_embed: Option<String>,
    /// Read the embedding and lm_head from the knot's dense blocks, not
    /// from row files (`--dense`).
    pub dense: bool,
    /// Fail instead of falling back to the dense block when the columnar
    /// path cannot be used (`--require-columnar`; for CI and tests).
    pub require_columnar: bool,
    /// Row fetching and caching in memory.
    pub fetch: FetchConfig,
    /// Timeouts, retries, TLS trust, parallel parts, the S3 endpoint.
    pub store: StoreConfig,
    /// The knot id this node accepts (`header_sha256`, as `gkq-pack` and
    /// the upload print it; parse one with [`gkq_format::KnotId::parse`]):
    /// any other knot is refused before anything in it is used
    /// (`--knot-id`). With the disk cache, a pinned knot whose header is
    /// cached opens with no request at all.
    pub knot_id: Option<gkq_format::KnotId>,
    /// The publishers this node trusts (`--trust-key`, repeatable for key
    /// rotation): when not empty, a package is used only if its signature
    /// object (`model.sig`, FORMAT.md section 7c) signs its knot id with
    /// one of these keys, or its id is the pinned `knot_id`; an unsigned or
    /// wrongly signed package is refused, whatever the URL or TLS said.
    pub trust: Vec<gkq_format::sig::PublicKey>,
    /// The package asked for (`--package NAME`), which a signature that
    /// names its package (`gkq-sign --name`, FORMAT.md 7c) must name.
    /// Default: the path of the knot URL's directory, whose last
    /// components the signed name must be; a local path checks no name.
    pub package: Option<String>,
    /// Base URLs of mirrors of the package (`--mirror`, repeatable: a CDN,
    /// a regional copy made with gkq-mirror, a caching proxy): row runs and
    /// bulk parts are spread over them and the origin, each answer verified
    /// as always; a mirror that fails or serves a wrong byte is dropped for
    /// the session, with its evidence (`Reader::sources`). The knot header,
    /// the signature and the row files' HEADs come from the knot's own URL,
    /// unless trust does not depend on the channel (`knot_id` or `trust`
    /// set): then from any source, the same way (`KnotHandle::header_from`
    /// says which).
    pub mirrors: Vec<String>,
    /// The row file dtype to fetch when `columnar_embed` is a base URL
    /// (`--embed-dtype`). Default: the narrowest row file the knot marks
    /// `BLOCK_EXACT`, widened on the node, which gives the dense values.
    pub embed_dtype: Option<gkq_format::DType>,
    /// The row file to pull the lm_head from (`--lm-head-dtype`, for
    /// tests). Default: the narrowest `BLOCK_EXACT` row file with fewer
    /// bytes per row than the block, else the block.
    pub lm_head_dtype: Option<gkq_format::DType>,
    /// The persistent verified cache (off by default in the library; the
    /// CLIs default to [`crate::default_cache_dir`]).
    pub cache: CacheConfig,
    /// Seed the row cache at open with the package's warm object
    /// (`--warm`, FORMAT.md 7d: the publisher's warm rows in one range
    /// request); see `Embedding::warm`. Only when the input role is served.
    pub warm: bool,
    /// Where a pull reports its bytes (a progress bar): the total when it
    /// starts, then each item's bytes once they are verified.
    pub progress: Option<PullProgress>,
}

/// The [`Progress`](gkq_format::progress::Progress) a pull reports to.
#[derive(Clone)]
pub struct PullProgress(pub std::sync::Arc<dyn gkq_format::progress::Progress>);

impl std::fmt::Debug for PullProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PullProgress")
    }
}

impl ReaderConfig {
    /// Refuses a row source that cannot be what was meant: a
    /// `columnar_embed` naming a knot or carrying credentials, `warm`
    /// with `dense`.
    pub(crate) fn check_row_source(&self) -> crate::Result<()> {
        if let Some(url) = &self.columnar_embed {
            // before anything could print it: a resolution reason, a warning
            gkq_store::url::refuse_credentials(url)?;
            if gkq_store::url::without_query(url).ends_with(".knot") {
                return Err(crate::ReaderError::RowSource(format!(
                    "--columnar-embed {url} names a knot, not a row file: leave the flag out (the row files next to the knot are used), or give a row file (…/token_embd.f32.rows) or the base URL of a copy of the package (https://cdn.example/model/v1/)"
                )));
            }
        }
        if self.warm && self.dense {
            return Err(crate::ReaderError::RowSource(
                "--warm seeds the row cache from the package's warm object, and --dense reads no rows: leave one of them out".into(),
            ));
        }
        Ok(())
    }

    /// The defaults, with the disk cache in [`crate::default_cache_dir`].
    pub fn with_default_cache() -> ReaderConfig {
        ReaderConfig {
            cache: CacheConfig {
                dir: crate::cache::default_cache_dir(),
                ..CacheConfig::default()
            },
            ..ReaderConfig::default()
        }
    }
}

/// A shorter timeout, for tests and tools.
pub fn with_timeout(mut c: ReaderConfig, t: Duration) -> ReaderConfig {
    c.store.timeout = t;
    c
}
