//! Optional HTTPS for the streaming server, from PEM files.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::StreamingError;

pub fn acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, StreamingError> {
    let tls = |what: &Path, e: &dyn std::fmt::Display| {
        StreamingError::Tls(format!("{}: {e}", what.display()))
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| tls(cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls(cert, &e))?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| tls(key, &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(cert, &e))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| tls(cert, &e))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
