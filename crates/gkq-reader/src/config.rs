//! Reader configuration: a plain struct for programmatic use and, behind
//! the `clap` feature, the flags a runtime flattens into its own CLI.

use std::time::Duration;

use crate::columnar::FetchConfig;
use gkq_store::HttpConfig;

/// Default row cache capacity (~28 MB of fp32 rows for Qwen2.5-0.5B).
pub const DEFAULT_CACHE_ROWS: usize = 8192;

/// Which roles a node serves. In a pipeline-split fabric the first stage
/// only looks up input embeddings and never pulls lm_head; the last stage
/// needs lm_head resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Roles {
    /// Input embedding lookups.
    pub input: bool,
    /// Output projection (lm_head).
    pub output: bool,
}

impl Roles {
    /// Both roles (a single-node model).
    pub const ALL: Roles = Roles {
        input: true,
        output: true,
    };
    /// First pipeline stage.
    pub const INPUT: Roles = Roles {
        input: true,
        output: false,
    };
    /// Last pipeline stage.
    pub const OUTPUT: Roles = Roles {
        input: false,
        output: true,
    };
}

/// Everything a reader needs to know.
#[derive(Clone, Debug, Default)]
pub struct ReaderConfig {
    /// Row file URL for the token embedding (`--columnar-embed`): the row
    /// file itself, or the base URL of the package (with or without the
    /// trailing `/`).
    pub columnar_embed: Option<String>,
    /// Fail instead of falling back to the dense block when the columnar
    /// path cannot be used (`--require-columnar`; for CI and tests).
    pub require_columnar: bool,
    /// Row fetching and caching.
    pub fetch: FetchConfig,
    /// HTTP timeouts and retries.
    pub http: HttpConfig,
    /// S3 endpoint for `s3://` URLs (feature `s3`); default
    /// `https://$R2_ACCOUNT_ID.r2.cloudflarestorage.com`.
    pub s3_endpoint: Option<String>,
    /// The knot id this node accepts (hex of `header_sha256`, as
    /// `gkq-pack` and the upload print it): any other knot is refused
    /// before anything in it is used (`--knot-id`).
    pub knot_id: Option<String>,
    /// The row file dtype to fetch when `columnar_embed` is a base URL
    /// (`--embed-dtype`). Default: the narrowest row file the knot marks
    /// `BLOCK_EXACT`, widened on the node, which gives the dense values.
    pub embed_dtype: Option<gkq_format::DType>,
}

/// The runtime flags of the columnar embedding (`#[command(flatten)]` them).
#[cfg(feature = "clap")]
#[derive(Clone, Debug, clap::Args)]
pub struct EmbedArgs {
    /// URL of the embedding row file (e.g. https://…/token_embd.f32.rows), or the package's base URL (https://…/v1 or https://…/v1/).
    #[arg(long = "columnar-embed", value_name = "URL")]
    pub columnar_embed: Option<String>,
    /// Fail instead of falling back to downloading the whole dense embedding when the row file cannot be used.
    #[arg(long = "require-columnar")]
    pub require_columnar: bool,
    /// A PEM file of CA certificates to trust besides the system store (repeatable; for a private CA, a mirror, a test server). SSL_CERT_FILE replaces the system store.
    #[arg(long = "ca-cert", value_name = "FILE")]
    pub ca_certs: Vec<std::path::PathBuf>,
    /// S3 endpoint for s3://bucket/key URLs (needs the `s3` feature) [default: https://$R2_ACCOUNT_ID.r2.cloudflarestorage.com]; credentials from R2_ACCESS_KEY_ID/R2_SECRET_ACCESS_KEY.
    #[arg(long = "endpoint", value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// Refuse any knot whose id (hex of its header_sha256, as gkq-pack and the upload print it) is not this one.
    #[arg(long = "knot-id", value_name = "HEX")]
    pub knot_id: Option<String>,
    /// Row file to fetch from a base URL: f32, f16 or bf16 [default: the narrowest one whose values widen to the knot's block exactly].
    #[arg(long = "embed-dtype", value_name = "DTYPE", value_parser = parse_float_dtype)]
    pub embed_dtype: Option<gkq_format::DType>,
    /// In-memory row cache size, in rows.
    #[arg(long = "embed-cache-rows", value_name = "N", default_value_t = DEFAULT_CACHE_ROWS)]
    pub embed_cache_rows: usize,
}

#[cfg(feature = "clap")]
impl From<EmbedArgs> for ReaderConfig {
    fn from(a: EmbedArgs) -> Self {
        let mut c = ReaderConfig {
            columnar_embed: a.columnar_embed,
            require_columnar: a.require_columnar,
            s3_endpoint: a.s3_endpoint,
            knot_id: a.knot_id,
            embed_dtype: a.embed_dtype,
            ..ReaderConfig::default()
        };
        c.fetch.cache_rows = a.embed_cache_rows;
        c.http.ca_certs = a.ca_certs;
        c
    }
}

#[cfg(feature = "clap")]
fn parse_float_dtype(s: &str) -> Result<gkq_format::DType, String> {
    match s.parse::<gkq_format::DType>() {
        Ok(d) if d.is_castable_float() => Ok(d),
        _ => Err(format!("{s:?} is not one of f32, f16, bf16")),
    }
}

/// A shorter timeout, for tests and tools.
pub fn with_timeout(mut c: ReaderConfig, t: Duration) -> ReaderConfig {
    c.http.timeout = t;
    c
}
