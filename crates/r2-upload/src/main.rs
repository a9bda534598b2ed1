//! `r2-upload` (run as `cargo xtask upload`): flags and reporting; the
//! work is in the library. A binary of its own so that the AWS SDK is built
//! only for those who publish, not for `cargo xtask demo`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use r2_upload::{UploadOptions, Uploader};
use serde_json::json;

/// Publish a packed model directory to R2 (or any S3-compatible store), or
/// copy a published package into a bucket of its own (a regional mirror).
///
/// Row files and companion files first, the knot last; objects already
/// present with the same length and sha256 are skipped, so a re-run resumes.
#[derive(Parser, Debug)]
#[command(
    name = "cargo xtask upload",
    bin_name = "cargo xtask upload",
    version = gkq_cli::version_line(&["s3"]),
    after_help = "Examples:\n  cargo xtask upload out/qwen --bucket models --prefix qwen2.5-0.5b/v1 --public-url https://models.example/qwen2.5-0.5b/v1\n  cargo xtask upload https://models.example/qwen2.5-0.5b/v1/model.knot --trust-key publisher.pub.pem --bucket eu-mirror --prefix qwen2.5-0.5b/v1\n      (a published package copied, verified, into another bucket)\n  cargo xtask upload out/qwen --bucket models --prefix qwen2.5-0.5b/v1 --dry-run\n  cargo xtask upload out/qwen --bucket models --prefix t/v1 --endpoint http://127.0.0.1:8014   (cargo xtask local-servers)\n\nOutput: one line per object on stderr (--json: one JSON object per object on stdout), then the knot id.\n\nCredentials: R2_ACCESS_KEY_ID and R2_SECRET_ACCESS_KEY (an R2 API token with Object Read & Write on the bucket); else AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN); else an AWS profile (AWS_PROFILE, ~/.aws/credentials).\nEndpoint: --endpoint, else https://$R2_ACCOUNT_ID.r2.cloudflarestorage.com.\nTo try it locally: `bash scripts/install-test-deps.sh`, then `cargo xtask local-servers`.\n\nExit status: 0 published (or already there); 1 error (the message says what to do)."
)]
struct UploadArgs {
    /// A gkq-pack output directory, or a published package's knot URL
    /// (http(s):// or s3://), copied and verified by gkq-mirror's engine
    /// into --staging first.
    package: String,
    /// With a URL: the directory it is copied into (kept, so a re-run
    /// resumes) [default: a directory under the system's temporary
    /// directory, removed once published].
    #[arg(long, value_name = "DIR")]
    staging: Option<PathBuf>,
    /// With a URL: use the package only if its model.sig is signed by this
    /// public key (PEM; repeatable).
    #[arg(long = "trust-key", value_name = "PUB.pem")]
    trust_keys: Vec<PathBuf>,
    /// With a URL: use the package only if its knot id is this one.
    #[arg(long = "knot-id", value_name = "HEX")]
    knot_id: Option<String>,
    /// Bucket name.
    #[arg(long)]
    bucket: String,
    /// Key prefix, e.g. qwen2.5-0.5b/v1 (objects are immutable: publish new versions under new prefixes).
    #[arg(long, default_value = "")]
    prefix: String,
    /// S3 endpoint [default: https://$R2_ACCOUNT_ID.r2.cloudflarestorage.com].
    #[arg(long)]
    endpoint: Option<String>,
    /// Signing region [default: auto, as R2 wants].
    #[arg(long)]
    region: Option<String>,
    /// Public base URL of the prefix: run the gkq-verify --url checks against it when done.
    #[arg(long)]
    public_url: Option<String>,
    /// Part size in MiB for multipart uploads (at least 5; raised so no file needs more than 10,000 parts) [default: 64].
    #[arg(long, value_name = "MIB")]
    part_size: Option<u64>,
    /// Parts in flight at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Replace published objects whose content differs (a published prefix is immutable otherwise).
    #[arg(long)]
    replace: bool,
    /// Check the package and print the plan; contact no server.
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON object per object on stdout.
    #[arg(long)]
    json: bool,
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

fn main() -> ExitCode {
    gkq_cli::init_logging();
    gkq_cli::exit(
        "cargo xtask upload",
        run(gkq_cli::parse::<UploadArgs>("r2-upload")),
    )
}

/// The directory to publish: `package` itself, or its URL's package copied.
fn staged(a: &UploadArgs) -> anyhow::Result<r2_upload::Staged> {
    let mut config = gkq_reader::ReaderConfig {
        trust: gkq_files::load_trusted_keys(&a.trust_keys).context("--trust-key")?,
        ..Default::default()
    };
    if let Some(id) = &a.knot_id {
        config.knot_id = Some(gkq_format::KnotId::parse_given(id).context("--knot-id")?);
    }
    let s = r2_upload::stage(&a.package, a.staging.as_deref(), config)?;
    if let Some(m) = &s.mirrored {
        eprintln!(
            "copied knot {} into {} ({}; {} bytes fetched)",
            m.knot_id,
            s.dir.display(),
            m.trusted,
            m.fetched_bytes
        );
    }
    Ok(s)
}

/// `--dry-run`: the plan, one line (or JSON object) per object.
fn plan(a: &UploadArgs, objects: &[r2_upload::LocalObject]) -> anyhow::Result<()> {
    let part = a.part_size.map(|m| m << 20);
    for o in objects {
        let p = r2_upload::part_size(o.bytes, part)?;
        let parts = if o.bytes > p { o.bytes.div_ceil(p) } else { 1 };
        if a.json {
            println!(
                "{}",
                json!({"key": o.key, "bytes": o.bytes, "sha256": o.sha256, "status": "planned", "parts": parts})
            );
        } else {
            eprintln!(
                "would upload {} ({} bytes, {} part{}, sha256 {})",
                o.key,
                o.bytes,
                parts,
                if parts == 1 { "" } else { "s" },
                o.sha256
            );
        }
    }
    Ok(())
}

fn run(a: UploadArgs) -> anyhow::Result<()> {
    let staged = staged(&a)?;
    let out_dir = staged.dir.clone();
    let objects = r2_upload::prepare(&out_dir, &a.prefix)?;
    if a.dry_run {
        return plan(&a, &objects);
    }
    publish(&a, &objects)?;
    let id = r2_upload::knot_id(&out_dir)?;
    if a.json {
        println!("{}", json!({ "knot_id": id }));
    } else {
        eprintln!("knot id {id}: nodes pin this model with --knot-id {id}");
    }
    if let Some(url) = &a.public_url {
        r2_upload::verify_public(&out_dir, url)?;
        if !a.json {
            eprintln!("gkq-verify --url {url}: PASS");
        }
    }
    staged.finish();
    Ok(())
}

/// Sends the objects and reports each.
fn publish(a: &UploadArgs, objects: &[r2_upload::LocalObject]) -> anyhow::Result<()> {
    let part = a.part_size.map(|m| m << 20);
    let ep = gkq_store::s3::endpoint(a.endpoint.as_deref(), a.region.as_deref(), &env)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let reports = rt.block_on(async {
        let creds = gkq_store::s3::credentials(&env).await?;
        let up = Uploader::new(
            gkq_store::s3::client(&ep, creds, &r2_upload::UPLOAD_RETRY),
            &a.bucket,
            &ep.url,
            UploadOptions {
                part_size: part,
                concurrency: a.concurrency,
                replace: a.replace,
                ..UploadOptions::default()
            },
        );
        up.check_bucket().await?;
        let bar = gkq_cli::Bar::new("", !a.json);
        let r = up.publish(objects, &bar).await;
        bar.finish();
        anyhow::Ok(r?)
    })?;
    for r in &reports {
        if a.json {
            println!("{}", serde_json::to_string(r)?);
        } else {
            eprintln!(
                "{} {} ({} bytes, {} parts, {:.2}s)",
                r.status, r.key, r.bytes, r.parts, r.seconds
            );
            for n in &r.notes {
                eprintln!("warning: {n}");
            }
        }
    }
    Ok(())
}
