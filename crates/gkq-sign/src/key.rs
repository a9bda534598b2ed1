//! Keys from PEM files: the publisher's private key (PKCS#8, encrypted
//! PKCS#8 with its password in an environment variable, or SEC1), and the
//! public keys a checker trusts. No error holds any byte of a key.

use std::path::Path;

use p256::SecretKey;
use p256::ecdsa::SigningKey;
use p256::pkcs8::DecodePrivateKey as _;

use crate::{Result, SignError};

/// The environment variable holding an encrypted key's password, unless
/// `--password-env` names another.
pub const DEFAULT_PASSWORD_ENV: &str = "GKQ_SIGN_PASSWORD";

fn key_err(path: &Path, reason: impl Into<String>) -> SignError {
    SignError::Key {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// The signing key in the PEM file `path`; an encrypted one is decrypted
/// with the password in the environment variable `password_env`.
pub fn load_signing_key(path: &Path, password_env: &str) -> Result<SigningKey> {
    let pem = gkq_files::read_text(
        path,
        gkq_files::MAX_KEY_LEN,
        "a private key",
        gkq_files::Follow::Yes,
    )?;
    let pem = pem.trim();
    let secret = if pem.starts_with("-----BEGIN ENCRYPTED PRIVATE KEY-----") {
        let password = std::env::var(password_env).map_err(|_| {
            key_err(
                path,
                format!("an encrypted key: set its password in ${password_env}"),
            )
        })?;
        SecretKey::from_pkcs8_encrypted_pem(pem, password.as_bytes()).map_err(|_| {
            key_err(path, format!("cannot decrypt the key with the password in ${password_env} (a wrong password, or not an ECDSA P-256 key)"))
        })?
    } else if pem.starts_with("-----BEGIN PRIVATE KEY-----") {
        SecretKey::from_pkcs8_pem(pem)
            .map_err(|_| key_err(path, "not an ECDSA P-256 private key (PKCS#8 PEM)"))?
    } else if pem.starts_with("-----BEGIN EC PRIVATE KEY-----") {
        if pem.contains("ENCRYPTED") {
            return Err(key_err(
                path,
                "a legacy OpenSSL-encrypted EC key: convert it to encrypted PKCS#8 (openssl pkcs8 -topk8 -v2 aes-256-cbc)",
            ));
        }
        SecretKey::from_sec1_pem(pem)
            .map_err(|_| key_err(path, "not an ECDSA P-256 private key (SEC1 PEM)"))?
    } else {
        return Err(key_err(
            path,
            "not a PEM private key (PKCS#8 `PRIVATE KEY`, `ENCRYPTED PRIVATE KEY`, or SEC1 `EC PRIVATE KEY`)",
        ));
    };
    Ok(SigningKey::from(secret))
}
