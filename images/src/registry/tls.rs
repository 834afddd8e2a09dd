//! The TLS material a `hosts.toml` host names: extra root certificates (`ca`) and a client
//! certificate (`client`), read once, when the client is built at start-up.

use std::path::Path;

use super::hosts::{HostEntry, MAX_PEM_FILE};

/// `builder` trusting `host`'s CA files too, and presenting its client certificate. reqwest
/// takes one identity per client, so of several `client` entries the first is used.
pub(super) fn with_host_certificates(
    mut builder: reqwest::ClientBuilder,
    host: &HostEntry,
) -> Result<reqwest::ClientBuilder, String> {
    let url = host.url.as_str();
    for ca in &host.ca {
        let pem = read_pem(ca)?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("host {url}: ca {}: {e}", ca.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "host {url}: ca {} holds no PEM certificate",
                ca.display()
            ));
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    if let Some((cert, key)) = host.client.first() {
        let mut pem = read_pem(cert)?;
        if let Some(key) = key {
            pem.push(b'\n');
            pem.extend(read_pem(key)?);
        }
        let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
            format!(
                "host {url}: client {}: not a PEM certificate and private key: {e}",
                cert.display()
            )
        })?;
        builder = builder.identity(identity);
    }
    Ok(builder)
}

/// A PEM file, read up to [`MAX_PEM_FILE`] bytes.
fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    crishim_sys::hostfs::read_capped(path, MAX_PEM_FILE)
        .map_err(|e| format!("{}: {e}", path.display()))
}
