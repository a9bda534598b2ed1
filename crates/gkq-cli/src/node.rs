//! The runtime flags of a node (feature `node`), defined once:
//! `#[command(flatten)]` them into a runtime's own CLI, as the node tools
//! and `gkq-decode` do; they become a [`ReaderConfig`].

use std::path::PathBuf;
use std::time::Duration;

use gkq_format::DType;
use gkq_store::{
    DEFAULT_CONNECTIONS, DEFAULT_MAX_PARALLEL, DEFAULT_MIN_THROUGHPUT, DEFAULT_PART_SIZE,
};

use gkq_reader::{
    CacheConfig, DEFAULT_CACHE_MAX_BYTES, DEFAULT_CACHE_ROWS, ReaderConfig, default_cache_dir,
};

/// The flags of a node that reads rows and blocks: the row store, and
/// [`NetArgs`].
#[derive(Clone, Debug, clap::Args)]
pub struct NodeArgs {
    /// The row files on another host (a CDN, a copy): a row file URL (https://…/token_embd.f32.rows) or the package's base URL (https://…/v1/) [default: the row files next to the knot].
    #[arg(
        long = "columnar-embed",
        value_name = "URL",
        help_heading = "Row store"
    )]
    pub columnar_embed: Option<String>,
    /// Read the embedding and lm_head from the knot's dense blocks (whole), not from row files.
    #[arg(long, conflicts_with_all = ["columnar_embed", "require_columnar", "embed_dtype", "lm_head_dtype"], help_heading = "Row store")]
    pub dense: bool,
    /// Fail instead of falling back to downloading the whole dense embedding when the row file cannot be used.
    #[arg(long = "require-columnar", help_heading = "Row store")]
    pub require_columnar: bool,
    /// Row file to fetch from a base URL: f32, f16 or bf16 (or fp32, float16, half, bfloat16…), or a block type (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k: lossy rows of a float block, taken only when asked for) [default: the narrowest one whose values widen to the knot's block exactly; for a quantized block, its own blocks].
    #[arg(long = "embed-dtype", value_name = "DTYPE", value_parser = DType::parse_row, help_heading = "Row store")]
    pub embed_dtype: Option<DType>,
    /// Row file to pull the lm_head from, a float or block type as --embed-dtype [default: the narrowest exact one with fewer bytes per row than the block, else the block; a quantized block stays quantized].
    #[arg(long = "lm-head-dtype", value_name = "DTYPE", value_parser = DType::parse_row, help_heading = "Row store")]
    pub lm_head_dtype: Option<DType>,
    /// Seed the row cache at open with the package's warm object (the rows its publisher expects every session to need, with what verifies them: one range request, none when the disk cache holds them); a missing or broken one is reported and its rows come on demand.
    #[arg(long, help_heading = "Row store")]
    pub warm: bool,
    /// In-memory row cache size, in rows.
    #[arg(long = "embed-cache-rows", value_name = "N", default_value_t = DEFAULT_CACHE_ROWS, help_heading = "Row store")]
    pub embed_cache_rows: usize,
    /// Trust, network and cache flags.
    #[command(flatten)]
    pub net: NetArgs,
}

/// The flags of anything that reads a knot: trust, the network, the cache.
#[derive(Clone, Debug, clap::Args)]
pub struct NetArgs {
    /// Refuse any knot whose id (hex of its header_sha256, as gkq-pack and the upload print it) is not this one; with a warm cache, a pinned knot opens with no request.
    #[arg(long = "knot-id", value_name = "HEX", value_parser = parse_knot_id, help_heading = "Network")]
    pub knot_id: Option<gkq_format::KnotId>,
    /// Use a package only if its model.sig is signed by this ECDSA P-256 public key (PEM; repeatable: any one of them, for key rotation), or its id is the pinned --knot-id; an unsigned or wrongly signed package is refused.
    #[arg(long = "trust-key", value_name = "PUB.pem", help_heading = "Network")]
    pub trust_keys: Vec<PathBuf>,
    /// The package asked for (MODEL/VERSION, as gkq-sign --name signed it): a signature naming another package is refused [default: the path the knot URL names, all of it; for a local package, the last components of its directory's path].
    #[arg(id = "asked_package", long = "package", value_name = "NAME", value_parser = parse_package, help_heading = "Network")]
    pub package: Option<String>,
    /// Base URL of a mirror of the package (repeatable): row runs and bulk parts are spread over the mirrors and the knot's own base, every answer verified; a mirror that fails or serves a wrong byte is dropped, with the evidence in the report. With --knot-id or --trust-key the knot header and signature may come from a mirror too (the open's report says which source served it).
    #[arg(long = "mirror", value_name = "BASE_URL", help_heading = "Network")]
    pub mirrors: Vec<String>,
    /// A PEM file of CA certificates to trust besides the system store (repeatable; for a private CA, a mirror, a test server). SSL_CERT_FILE replaces the system store.
    #[arg(long = "ca-cert", value_name = "FILE", help_heading = "Network")]
    pub ca_certs: Vec<PathBuf>,
    /// S3 endpoint for s3://bucket/key URLs (builds with the `s3` feature; see --version) [default: https://$R2_ACCOUNT_ID.r2.cloudflarestorage.com]; credentials from R2_ACCESS_KEY_ID/R2_SECRET_ACCESS_KEY.
    #[arg(long = "endpoint", value_name = "URL", help_heading = "Network")]
    pub s3_endpoint: Option<String>,
    /// Seconds to connect, and the floor of each request's deadline (a request for N bytes must finish within TIMEOUT + N / --min-throughput).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = gkq_store::DEFAULT_TIMEOUT.as_secs_f64(),
        help_heading = "Network"
    )]
    pub timeout: f64,
    /// Bytes per second a response must keep up: a server that stalls or drips slower is cut off and the request retried (0: only the timeout).
    #[arg(long = "min-throughput", value_name = "BYTES_PER_S", default_value_t = DEFAULT_MIN_THROUGHPUT, help_heading = "Network")]
    pub min_throughput: u64,
    /// Parts of large reads (blocks, lm_head) in flight at once (1: one GET at a time).
    #[arg(long = "max-parallel", value_name = "N", default_value_t = DEFAULT_MAX_PARALLEL, help_heading = "Network")]
    pub max_parallel: usize,
    /// Size of those parts, in MiB.
    #[arg(
        long = "part-size",
        value_name = "MIB",
        default_value_t = DEFAULT_PART_SIZE >> 20,
        help_heading = "Network"
    )]
    pub part_size_mib: u64,
    /// Connections per origin for the parts of large reads (small reads share one).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CONNECTIONS, help_heading = "Network")]
    pub connections: usize,
    /// The persistent verified cache [default: $XDG_CACHE_HOME/gkq, else ~/.cache/gkq].
    #[arg(long = "cache-dir", value_name = "DIR", help_heading = "Cache")]
    pub cache_dir: Option<PathBuf>,
    /// No persistent cache: every start pulls everything again.
    #[arg(
        long = "no-cache",
        conflicts_with = "cache_dir",
        help_heading = "Cache"
    )]
    pub no_cache: bool,
    /// Bound of the persistent cache; least recently used entries go first (suffixes K, M, G, T).
    #[arg(long = "cache-max-bytes", value_name = "BYTES", value_parser = parse_bytes, default_value_t = DEFAULT_CACHE_MAX_BYTES, help_heading = "Cache")]
    pub cache_max_bytes: u64,
    /// No progress bar while the model is pulled (there is one only when stderr is a terminal and --json is not given).
    #[arg(long = "no-progress")]
    pub no_progress: bool,
}

/// The bar a pull reports to: on a terminal, unless `--no-progress` or
/// `--json`.
fn pull_bar(off: bool) -> Option<gkq_reader::PullProgress> {
    use std::io::IsTerminal;
    if off || crate::json_asked() || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = crate::Bar::new("pulling ", true);
    Some(gkq_reader::PullProgress(std::sync::Arc::new(bar)))
}

/// `--package`: a package name as FORMAT.md 7c defines it.
fn parse_package(s: &str) -> Result<String, String> {
    gkq_format::sig::check_package_name(s).map(|()| s.to_owned())
}

/// `--knot-id`: exactly 64 hex digits, refused before anything is opened.
fn parse_knot_id(s: &str) -> Result<gkq_format::KnotId, String> {
    gkq_format::KnotId::parse_given(s).map_err(|e| e.to_string())
}

/// `--trust-key`: each file one public key, refused before anything is opened.
fn trust_keys(paths: &[PathBuf]) -> Result<Vec<gkq_format::sig::PublicKey>, String> {
    gkq_files::load_trusted_keys(paths).map_err(|e| format!("--trust-key {e}"))
}

/// `1000`, `512K`, `64M`, `16G`, `1T` (binary multiples).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        Some('T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("{s:?} is not a size (e.g. 1000, 512K, 64M, 16G)"))
}

impl NetArgs {
    /// The timeout as a duration (a negative or absurd value is refused).
    pub fn timeout(&self) -> Result<Duration, String> {
        Duration::try_from_secs_f64(self.timeout)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                format!(
                    "--timeout {}: give a positive number of seconds",
                    self.timeout
                )
            })
    }
}

impl TryFrom<NetArgs> for ReaderConfig {
    type Error = String;
    fn try_from(a: NetArgs) -> Result<Self, String> {
        let mut c = ReaderConfig {
            knot_id: a.knot_id,
            trust: trust_keys(&a.trust_keys)?,
            package: a.package.clone(),
            mirrors: a.mirrors.clone(),
            cache: CacheConfig {
                dir: if a.no_cache {
                    None
                } else {
                    a.cache_dir.clone().or_else(default_cache_dir)
                },
                max_bytes: a.cache_max_bytes,
                explicit: a.cache_dir.is_some(),
            },
            progress: pull_bar(a.no_progress),
            ..ReaderConfig::default()
        };
        c.store.timeout = a.timeout()?;
        c.store.min_throughput = a.min_throughput;
        c.store.ca_certs = a.ca_certs;
        c.store.s3_endpoint = a.s3_endpoint;
        c.store.parallel.max_parallel = a.max_parallel.max(1);
        c.store.parallel.connections = a.connections.max(1);
        c.store.parallel.part_size = a
            .part_size_mib
            .checked_mul(1 << 20)
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("--part-size {}: give a size in MiB from 1", a.part_size_mib))?;
        Ok(c)
    }
}

impl TryFrom<NodeArgs> for ReaderConfig {
    type Error = String;
    fn try_from(a: NodeArgs) -> Result<Self, String> {
        let mut c = ReaderConfig::try_from(a.net)?;
        c.columnar_embed = a.columnar_embed;
        c.dense = a.dense;
        c.require_columnar = a.require_columnar;
        c.embed_dtype = a.embed_dtype;
        c.lm_head_dtype = a.lm_head_dtype;
        c.fetch.cache_rows = a.embed_cache_rows;
        c.warm = a.warm;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_args_flatten_into_a_runtime_cli() {
        use clap::Parser;
        #[derive(Parser)]
        struct Runtime {
            #[command(flatten)]
            embed: NodeArgs,
            #[arg(long)]
            model: String,
        }
        let rt = Runtime::parse_from([
            "node",
            "--model",
            "m.knot",
            "--columnar-embed",
            "https://x/token_embd.f32.rows",
        ]);
        let c = ReaderConfig::try_from(rt.embed).expect("valid flags");
        assert_eq!(
            c.columnar_embed.as_deref(),
            Some("https://x/token_embd.f32.rows")
        );
        assert_eq!(c.fetch.cache_rows, 8192);
        let rt = Runtime::parse_from(["node", "--model", "m", "--embed-cache-rows", "16"]);
        let c = ReaderConfig::try_from(rt.embed).expect("valid");
        assert_eq!(c.fetch.cache_rows, 16);
        assert_eq!(rt.model, "m");
        // issue 56: the block types the help lists are gkq-format's table
        use clap::CommandFactory;
        let help = Runtime::command().render_long_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        let listed = help
            .split("or a block type (")
            .nth(1)
            .and_then(|r| r.split(':').next())
            .expect("the block types in --help");
        assert_eq!(listed, gkq_format::DType::quantized_names());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert_eq!(parse_bytes("512k"), Ok(512 << 10));
        assert_eq!(parse_bytes("16G"), Ok(16 << 30));
        assert!(parse_bytes("G").is_err());
        assert!(parse_bytes("99999999999T").is_err());
        assert!(parse_bytes("-1").is_err());
    }
}
