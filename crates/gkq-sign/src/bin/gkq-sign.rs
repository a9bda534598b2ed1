//! `gkq-sign PKG_DIR --key KEY.pem`: the publishing pipeline's signing
//! step, after gkq-pack and gkq-verify, before the upload.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Signs a package: writes PKG_DIR/model.sig, OpenSSF Model Signing's envelope (a Sigstore bundle v0.3 with a DSSE in-toto statement, ECDSA P-256) over every file and the knot id. `model_signing verify key` checks it; nodes check it with --trust-key.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The package directory (gkq-pack's output), or its model.knot.
    pkg_dir: PathBuf,
    /// The package's name, MODEL/VERSION: the path it is published under (the upload's --prefix). Nodes asked for another package refuse the signature, whoever serves it; without a name, a node takes the header from the origin only, or with a pinned --knot-id.
    #[arg(long, value_name = "MODEL/VERSION")]
    name: Option<String>,
    /// The ECDSA P-256 private key, PEM (PKCS#8, encrypted PKCS#8, or SEC1).
    #[arg(long, value_name = "KEY.pem")]
    key: PathBuf,
    /// The environment variable holding an encrypted key's password.
    #[arg(long = "password-env", value_name = "VAR", default_value = gkq_sign::DEFAULT_PASSWORD_ENV)]
    password_env: String,
    /// A JSON report on stdout.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = gkq_cli::parse::<Args>("gkq-sign");
    let signed = gkq_sign::load_signing_key(&args.key, &args.password_env)
        .and_then(|key| gkq_sign::sign_named(&args.pkg_dir, &key, args.name.as_deref()));
    match signed {
        Ok(r) if args.json => {
            println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(r) => {
            println!(
                "signed {}: knot {}, {} files, key {}{}",
                r.signature.display(),
                r.knot_id.as_deref().unwrap_or("-"),
                r.files,
                r.signer,
                r.package
                    .as_deref()
                    .map_or_else(String::new, |p| format!(", package {p}"))
            );
            ExitCode::SUCCESS
        }
        Err(e) => gkq_cli::fail("gkq-sign", 1, &e),
    }
}
