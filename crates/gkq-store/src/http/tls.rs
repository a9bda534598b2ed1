//! TLS trust for the HTTP client (the system store, `SSL_CERT_FILE`, and
//! `--ca-cert` files) and the connector layer that counts connections.

use std::sync::Arc;

use crate::config::StoreConfig;
use crate::error::{BoxError, Result, StoreError};
use crate::stats::Counters;

/// The TLS configuration: the system store (`SSL_CERT_FILE` when set), plus
/// the CA files given, with ALPN offering h2 then HTTP/1.1.
pub(crate) fn tls_config(config: &StoreConfig) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        // an unusable certificate in the system store is skipped, as
        // every TLS client does; the ones given with --ca-cert are checked
        let _ = roots.add(cert);
    }
    for path in &config.ca_certs {
        let bad = |source: BoxError| StoreError::CaCert {
            path: path.clone(),
            source,
        };
        let certs: Vec<_> = rustls::pki_types::pem::PemObject::pem_file_iter(path)
            .map_err(|e| bad(e.into()))?
            .collect::<std::result::Result<_, _>>()
            .map_err(|e: rustls::pki_types::pem::Error| bad(e.into()))?;
        if certs.is_empty() {
            return Err(bad("no PEM certificate in the file".into()));
        }
        for c in certs {
            roots.add(c).map_err(|e| bad(e.into()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Client(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = if config.http1_only {
        vec![b"http/1.1".to_vec()]
    } else {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    };
    Ok(tls)
}

/// Counts every connection the client opens (a tower layer around its connector).
#[derive(Clone)]
pub(crate) struct CountConnections(pub(crate) Arc<Counters>);

impl<S> tower_layer::Layer<S> for CountConnections {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            counters: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Counted<S> {
    inner: S,
    counters: Arc<Counters>,
}

impl<S: tower_service::Service<R>, R> tower_service::Service<R> for Counted<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }
    fn call(&mut self, req: R) -> S::Future {
        self.counters.connection();
        self.inner.call(req)
    }
}
